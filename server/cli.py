"""``pymq-server``: run the broker, or manage the users file.

    pymq-server [--host H] [--port P] [--data-dir D] [--config broker.yaml]
    pymq-server passwd USER --users-file users.yaml [--roles admin,app] [--password-stdin]

A running broker is managed with ``pymq-admin`` (server/admin/cli.py) and the web console on the
admin port.

SIGTERM and SIGINT stop the broker cleanly: listeners close, clients get their connections closed,
storage is flushed and synced.
"""
from __future__ import annotations

import argparse
import asyncio
import getpass
import signal
import sys

from pymq.errors import PymqError
from pymq_server.app import BrokerServer, install_uvloop
from pymq_server.config import BrokerConfig
from pymq_server.logs import announce, configure_logging


def _serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pymq-server", description="Run the pymq STOMP broker.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="subcommands:\n"
               "  pymq-server passwd USER --users-file FILE [--roles R,R] [--password-stdin]\n"
               "                        add a user or change a password in a users file\n\n"
               "manage a running broker (queues, messages, dead letters, connections, users, ...):\n"
               "  pymq-admin --help     the admin command line (docs/cli.md); the web console is at\n"
               "                        http://HOST:ADMIN_PORT/ when --admin-port is set")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="STOMP port (default 61613; 0 picks a free port)")
    p.add_argument("--data-dir", dest="data_dir", help="where persistent data lives (default ./pymq-data)")
    p.add_argument("--config", help="YAML configuration file")
    p.add_argument("--users-file", dest="users_file", help="YAML users file with password hashes")
    p.add_argument("--node-id", dest="node_id", help="this broker's name (message ids, clustering)")
    p.add_argument("--admin-port", dest="admin_port", type=int, help="HTTP admin/metrics port")
    p.add_argument("--log-level", dest="log_level", help="DEBUG, INFO, WARNING, ERROR")
    p.add_argument("--log-format", dest="log_format", help="text (default) or json: one JSON object per line")
    p.add_argument("--no-uvloop", action="store_true", help="use the default asyncio loop")
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


async def _run(config: BrokerConfig) -> None:
    server = BrokerServer(config)
    await server.start()
    announce(f"pymq-server listening on {config.host}:{server.port}", config.log_format)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "passwd":
        return _passwd(argv[1:])
    args = _serve_parser().parse_args(argv)
    try:
        config = BrokerConfig.load(args.config, host=args.host, port=args.port, data_dir=args.data_dir,
                                   users_file=args.users_file, node_id=args.node_id,
                                   admin_port=args.admin_port, log_level=args.log_level,
                                   log_format=args.log_format)
    except PymqError as exc:
        print(f"pymq-server: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_level, config.log_format)
    if not args.no_uvloop:
        install_uvloop()
    try:
        asyncio.run(_run(config))
    except PymqError as exc:
        print(f"pymq-server: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"pymq-server: cannot listen on {config.host}:{config.port}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
