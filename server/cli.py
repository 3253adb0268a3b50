"""``pymq-server``: run the broker, or manage the users file.

    pymq-server [--host H] [--port P] [--data-dir D] [--config broker.yaml] [--check-config]
    pymq-server passwd USER --users-file users.yaml [--roles admin,app] [--password-stdin]

A running broker is managed with ``pymq-admin`` (server/admin/cli.py) and the web console on the
admin port.

The configuration is checked completely before anything opens or listens; a bad one exits with status 2
and a list of every problem (file, line, key, value, what was expected).  Start-up failures exit with
status 1 and name their cause: the data directory, a certificate, or which listener could not bind.
SIGTERM and SIGINT stop the broker cleanly: listeners close, clients get their connections closed,
storage is flushed and synced.  SIGHUP reloads the users file, default permissions, storage-selection
rules, TLS certificate and log level without dropping a connection (docs/operations.md); a reload that
finds an invalid file keeps everything as it was and logs why.
"""
from __future__ import annotations

import argparse
import asyncio
import getpass
import importlib.util
import logging
import signal
import sys

import pymq
from pymq.errors import ConfigError, ListenError, PymqError, StorageError
from pymq_server.config import BrokerConfig
from pymq_server.logs import announce, configure_logging

log = logging.getLogger("pymq.server")

EXIT_CONFIG = 2        # the configuration (file, flags, certificates) is wrong: fix it, then start
EXIT_STARTUP = 1       # a start-up step failed (data directory, a port in use, storage)
EXIT_FENCED = 3        # ha.after_fenced: exit, and another process took the store (spec/ha.md §2.4)


def _serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pymq-server", description="Run the pymq STOMP broker.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="subcommands:\n"
               "  pymq-server passwd USER --users-file FILE [--roles R,R] [--password-stdin]\n"
               "                        add a user or change a password in a users file\n\n"
               "manage a running broker (queues, messages, dead letters, connections, users, ...):\n"
               "  pymq-admin --help     the admin command line (docs/cli.md); the web console is at\n"
               "                        http://HOST:ADMIN_PORT/ when --admin-port is set\n\n"
               "signals: SIGTERM/SIGINT stop cleanly; SIGHUP reloads the users file, permissions,\n"
               "storage rules and the TLS certificate (docs/operations.md)\n"
               "every setting of the --config file: docs/configuration.md")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="STOMP port (default 61613; 0 picks a free port)")
    p.add_argument("--data-dir", dest="data_dir", help="where persistent data lives (default ./pymq-data)")
    p.add_argument("--config", help="YAML configuration file")
    p.add_argument("--users-file", dest="users_file", help="YAML users file with password hashes")
    p.add_argument("--node-id", dest="node_id", help="this broker's name (message ids, clustering)")
    p.add_argument("--admin-port", dest="admin_port", type=int, help="HTTP admin/metrics port")
    p.add_argument("--log-level", dest="log_level", help="DEBUG, INFO, WARNING, ERROR")
    p.add_argument("--log-format", dest="log_format", help="text (default) or json: one JSON object per line")
    p.add_argument("--workers", type=int, help="worker processes, each owning a shard of the destinations "
                   "(default 1; spec/cores.md)")
    p.add_argument("--no-uvloop", action="store_true", help="use the default asyncio loop")
    p.add_argument("--check-config", action="store_true",
                   help="check the configuration, the users file and the TLS files it names (opened, the "
                        "key matched to the certificate) and exit: 0 when valid, 2 when not")
    p.add_argument("--version", action="version", version=f"pymq-server {pymq.__version__}")
    return p


def _passwd(argv: list[str]) -> int:
    from pymq_server.broker.auth import save_user
    p = argparse.ArgumentParser(prog="pymq-server passwd", description="Add or update a user.")
    p.add_argument("user")
    p.add_argument("--users-file", required=True)
    p.add_argument("--roles", default=None, help="comma-separated roles, e.g. admin")
    p.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    args = p.parse_args(argv)
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass(f"password for {args.user}: ")
    if not password:
        print("pymq-server passwd: empty password refused", file=sys.stderr)
        return 2
    roles = [r for r in args.roles.split(",") if r] if args.roles is not None else None
    save_user(args.users_file, args.user, password, roles)
    print(f"user {args.user} written to {args.users_file}")
    return 0


async def _run(config: BrokerConfig) -> int:
    """Serve until SIGTERM/SIGINT (0).  With ``ha:`` a run may end fenced (spec/ha.md §2.4): then the process
    exits with :data:`EXIT_FENCED` or, by default, starts a new server that waits as a backup."""
    from pymq_server.app import BrokerServer
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    current: list[BrokerServer] = []
    started = [False]

    def hup() -> None:
        if started[0] and current:
            current[0].reload_logged()
        else:
            log.warning("SIGHUP during start-up ignored: nothing to reload yet")

    # before anything listens: a signal that arrives as soon as the first line is out must find its
    # handler (the default action of SIGHUP is to end the process)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, hup)
    try:
        while True:
            server = BrokerServer(config)
            server.owns_process = True       # this process is the broker's: settle_collector once started
            server.on_backup = _announce_backup
            current[:] = [server]
            started[0] = False
            fenced = await _serve(server, stop, started)
            if not fenced or stop.is_set():
                return 0
            assert config.ha is not None
            if config.ha.after_fenced == "exit":
                return EXIT_FENCED
            announce("pymq-server fenced: waiting as a backup again", config.log_format)
    finally:
        loop.remove_signal_handler(signal.SIGHUP)


async def _serve(server, stop: asyncio.Event, started: list[bool]) -> bool:
    """One server's run; True when it ended fenced (another process took the store)."""
    config = server.config
    starting = asyncio.ensure_future(server.start())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():          # stopped while waiting as a backup (or recovering)
            server.stop_waiting()
            await starting
            await server.stop()
            return False
        starting.result()                # a start-up failure raises here
        if stop.is_set():
            await server.stop()
            return False
        started[0] = True
        _announce(config, server)
        missing = compiled_missing()
        if missing:
            log.warning("the compiled core is not installed (%s): the pure-Python twins run instead, several "
                        "times slower on the hot paths; reinstall with a C compiler (Debian: gcc python3-dev), "
                        "or set PYMQ_NO_EXTENSIONS=1 to choose the twins deliberately", ", ".join(missing))
        waits = {stopping}
        role = server.ha
        if role is not None:
            waits.add(asyncio.ensure_future(role.fenced.wait()))
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for waiting in waits:
            waiting.cancel()
        if role is not None and role.fenced.is_set():
            await server.abandon_done.wait()
            return True
        await server.stop()
        return False
    finally:
        stopping.cancel()


def _announce_backup(server) -> None:
    config = server.config
    kind, where = config.ha_store()
    line = f"pymq-server backup of node {config.node_id} waiting for the store ({kind})"
    announce(line, config.log_format)
    if server.admin_port is not None:
        scheme = "https" if config.admin_tls else "http"
        announce(f"pymq-server admin listening on {scheme}://{config.host}:{server.admin_port}/", config.log_format)


def _submodule_found(package: str, name: str) -> bool:
    """Whether ``package.name`` can be imported, found as the import system finds it but without importing
    ``package`` (``importlib.util.find_spec`` of a submodule imports its parent: for the Spark connector that
    is pyspark, 120 modules and about 10 MiB of the broker's memory, right after its listeners opened)."""
    spec = importlib.util.find_spec(package)           # a top-level name: looked up, not imported
    if spec is None or not spec.submodule_search_locations:
        return False
    path = list(spec.submodule_search_locations)
    return any(finder.find_spec(f"{package}.{name}", path) is not None
               for finder in sys.meta_path if hasattr(finder, "find_spec"))


def compiled_missing() -> list[str]:
    """Every compiled module of setup.py's EXTENSIONS this installation lacks (none under
    PYMQ_NO_EXTENSIONS=1, a deliberate choice).  Some pickers are imported only when their path is first
    used, so each is imported here to note its own; the Spark connector's decoder is not the broker's to
    import (it needs pyarrow), so its module is only looked for."""
    import pymq.protocol.scanner  # noqa: F401  (each picker notes a compiled module it cannot import)
    import pymq.routing.bloom  # noqa: F401
    import pymq.routing.topics  # noqa: F401
    import pymq.selector._evaluator  # noqa: F401
    import pymq_server.storage.page_alloc  # noqa: F401
    import pymq_server.broker.message  # noqa: F401
    import pymq_server.broker.requests  # noqa: F401
    from pymq._accel import MISSING, NO_EXTENSIONS
    missing = list(MISSING)
    if not NO_EXTENSIONS and "pyspark_pymq._decode_c" not in missing:
        try:
            found = _submodule_found("pyspark_pymq", "_decode_c")
        except ImportError:
            found = False
        if not found:
            missing.append("pyspark_pymq._decode_c")
    return missing


def _announce(config: BrokerConfig, server) -> None:
    """One line per listener on stderr, for operators and scripts (the first line's format is fixed)."""
    lines = [f"pymq-server listening on {config.host}:{server.port}"]
    if server.tls_port is not None:
        lines.append(f"pymq-server tls listening on {config.host}:{server.tls_port}")
    if server.websocket_port is not None and config.websocket is not None:
        scheme = "wss" if config.websocket.tls else "ws"
        lines.append(f"pymq-server websocket listening on {scheme}://{config.host}:{server.websocket_port}"
                     f"{config.websocket.path}")
    if server.admin_port is not None:
        scheme = "https" if config.admin_tls else "http"
        lines.append(f"pymq-server admin listening on {scheme}://{config.host}:{server.admin_port}/")
    for line in lines:
        announce(line, config.log_format)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "passwd":
        return _passwd(argv[1:])
    args = _serve_parser().parse_args(argv)
    try:
        config = BrokerConfig.load(args.config, host=args.host, port=args.port, data_dir=args.data_dir,
                                   users_file=args.users_file, node_id=args.node_id,
                                   admin_port=args.admin_port, log_level=args.log_level,
                                   log_format=args.log_format, workers=args.workers)
        if config.users_file:
            from pymq_server.config import load_users_file
            load_users_file(config.users_file)
        if config.tls is not None:
            # what start-up does before anything opens: every file the `tls:` section names opened, the
            # certificate and key matched, the CA file read (a valid-looking path is not a valid file)
            from pymq_server.net.tls import server_context
            server_context(config.tls)
    except PymqError as exc:
        print(f"pymq-server: {exc.message}", file=sys.stderr)
        return EXIT_CONFIG
    if args.check_config:
        print(f"pymq-server: configuration {args.config or '(defaults)'} is valid", file=sys.stderr)
        return 0
    configure_logging(config.log_level, config.log_format)
    if config.workers > 1:
        from pymq_server.cores import supervisor
        try:
            return supervisor.run(config, use_uvloop=not args.no_uvloop)
        except ConfigError as exc:
            print(f"pymq-server: {exc.message}", file=sys.stderr)
            return EXIT_CONFIG
        except PymqError as exc:
            print(f"pymq-server: {exc.message}", file=sys.stderr)
            return EXIT_STARTUP
    from pymq_server.app import install_uvloop, tune_collector
    tune_collector()
    if not args.no_uvloop:
        install_uvloop()
    try:
        code = asyncio.run(_run(config))
    except ConfigError as exc:
        print(f"pymq-server: {exc.message}", file=sys.stderr)
        return EXIT_CONFIG
    except (ListenError, StorageError) as exc:
        print(f"pymq-server: {exc.message}", file=sys.stderr)
        return EXIT_STARTUP
    except PymqError as exc:
        print(f"pymq-server: {exc.message}", file=sys.stderr)
        return EXIT_STARTUP
    except OSError as exc:      # not a listener (those are ListenError): say what failed, not "listen"
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"pymq-server: start-up failed{where}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_STARTUP
    return code or 0        # (None: a test's stand-in for asyncio.run)


if __name__ == "__main__":
    sys.exit(main())
