#!/usr/bin/env bash
# Start the real servers the storage tests use: a PostgreSQL cluster and a Redis server, both on
# 127.0.0.1, both private to pymq (their own data directory, their own port; the machine's default
# "main" cluster and any system Redis are left alone).
#
#   eval "$(.ci/services.sh)"      # then run pytest; the tests find the servers through
#                                  # PYMQ_TEST_POSTGRES_URL and PYMQ_TEST_REDIS_URL
#   .ci/services.sh --stop         # stop both servers (data directory kept)
#
# Stdout carries only `export NAME=value` lines, so `eval` is safe; progress and errors go to stderr.
# Idempotent: a second run finds the servers still answering and prints the same lines. Works as root
# on a fresh Debian 12 (installs the Debian packages postgresql and redis-server if missing) and as an
# ordinary user who already has the binaries. Environment knobs:
#   PYMQ_SERVICES_DIR   where data, logs, sockets and the chosen ports live (default /tmp/pymq-services)
#   PYMQ_PG_PORT, PYMQ_REDIS_PORT   ports to use when starting (default: a free port, remembered)
set -euo pipefail

BASE="${PYMQ_SERVICES_DIR:-/tmp/pymq-services}"
PG_DIR="$BASE/postgres"
REDIS_DIR="$BASE/redis"
PG_USER_NAME=pymq
PG_PASSWORD=pymq
PG_DATABASE=pymq_test
T0=$(date +%s)

log() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] ERROR: %s\n' "$*" >&2; exit 1; }

mkdir -p "$BASE"
# Two sessions (or CI and a developer) running this at once must not race on initdb or ports.
# The daemons are started with fd 9 closed (`9>&-`), or they would hold this lock forever.
exec 9>"$BASE/.lock"
if command -v flock >/dev/null 2>&1; then flock -w 300 9 || die "could not lock $BASE/.lock"; fi

free_port() {
    python3 - <<'EOF'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
EOF
}

port_in_use() {  # true when something listens on 127.0.0.1:$1
    python3 - "$1" <<'EOF'
import socket, sys
s = socket.socket()
s.settimeout(0.5)
sys.exit(0 if s.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0 else 1)
EOF
}

pg_bindir() {
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -n "$dir" ] && [ -x "$dir/initdb" ] && [ -x "$dir/postgres" ]; then echo "$dir"; return; fi
    if command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1; then
        dirname "$(readlink -f "$(command -v pg_ctl)")"; return
    fi
    return 1
}

# -- install what is missing ----------------------------------------------------------------------
install_packages() {
    local missing=()
    pg_bindir >/dev/null 2>&1 || missing+=(postgresql)
    command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "missing ${missing[*]}: install them (apt-get install ${missing[*]}) or run as root"
    log "installing ${missing[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    local apt_opts=(-y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold
                    --no-install-recommends)
    # Package lists may be empty on a fresh machine: update only when the first attempt fails.
    if ! apt-get install "${apt_opts[@]}" "${missing[@]}" >"$BASE/apt.log" 2>&1; then
        log "apt-get install failed once; running apt-get update and retrying"
        apt-get update -q >>"$BASE/apt.log" 2>&1 || true
        apt-get install "${apt_opts[@]}" "${missing[@]}" >>"$BASE/apt.log" 2>&1 \
            || { tail -n 30 "$BASE/apt.log" >&2; die "apt-get install ${missing[*]} failed (log: $BASE/apt.log)"; }
    fi
}

# -- PostgreSQL -----------------------------------------------------------------------------------
# The server refuses to run as root, so as root everything runs as the `postgres` system user.
as_pg() {
    if [ "$(id -u)" -eq 0 ]; then
        id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql --shell /bin/sh postgres
        su postgres -s /bin/sh -c "$1"
    else
        sh -c "$1"
    fi
}

pg_psql() {  # run SQL as the superuser over the private unix socket
    as_pg "'$PGBIN/psql' -X -q -v ON_ERROR_STOP=1 -h '$PG_DIR/sock' -p $PG_PORT -U postgres -d postgres -tA -c \"$1\""
}

start_postgres() {
    PGBIN=$(pg_bindir) || die "no PostgreSQL server binaries found"
    mkdir -p "$PG_DIR/sock"
    if [ "$(id -u)" -eq 0 ]; then chown -R postgres: "$PG_DIR"; fi
    if [ ! -f "$PG_DIR/data/PG_VERSION" ]; then
        log "initdb $PG_DIR/data"
        as_pg "'$PGBIN/initdb' -D '$PG_DIR/data' -U postgres --auth-local=trust --auth-host=scram-sha-256 \
               -E UTF8 --locale=C.UTF-8 >'$PG_DIR/initdb.log' 2>&1" \
            || { cat "$PG_DIR/initdb.log" >&2; die "initdb failed"; }
    fi
    PG_PORT=$(cat "$PG_DIR/port" 2>/dev/null || true)
    if [ -n "$PG_PORT" ] && as_pg "'$PGBIN/pg_ctl' -D '$PG_DIR/data' status >/dev/null 2>&1"; then
        log "PostgreSQL already running on port $PG_PORT"
    else
        if [ -z "$PG_PORT" ] || port_in_use "$PG_PORT"; then PG_PORT=${PYMQ_PG_PORT:-$(free_port)}; fi
        echo "$PG_PORT" >"$PG_DIR/port"
        log "starting PostgreSQL on 127.0.0.1:$PG_PORT"
        # A test server: durability of the test database itself is not what the tests check, so
        # fsync is off to keep 2 shared cores and a slow disk out of the CI budget.
        as_pg "'$PGBIN/pg_ctl' -D '$PG_DIR/data' -l '$PG_DIR/server.log' -w -t 60 \
               -o \"-p $PG_PORT -k '$PG_DIR/sock' -c listen_addresses=127.0.0.1 -c fsync=off \
                   -c synchronous_commit=off -c full_page_writes=off -c max_connections=200\" start >/dev/null" 9>&- \
            || { tail -n 30 "$PG_DIR/server.log" >&2; die "PostgreSQL did not start"; }
    fi
    for _ in $(seq 1 60); do
        "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" && break
        sleep 0.5
    done
    "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" || die "PostgreSQL on port $PG_PORT does not answer"
    if [ "$(pg_psql "SELECT 1 FROM pg_roles WHERE rolname = '$PG_USER_NAME'")" != 1 ]; then
        pg_psql "CREATE ROLE $PG_USER_NAME LOGIN PASSWORD '$PG_PASSWORD'"
    fi
    if [ "$(pg_psql "SELECT 1 FROM pg_database WHERE datname = '$PG_DATABASE'")" != 1 ]; then
        pg_psql "CREATE DATABASE $PG_DATABASE OWNER $PG_USER_NAME"
    fi
}

# -- Redis ----------------------------------------------------------------------------------------
redis_ping() { redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null | grep -q PONG; }

start_redis() {
    mkdir -p "$REDIS_DIR"
    REDIS_PORT=$(cat "$REDIS_DIR/port" 2>/dev/null || true)
    if [ -n "$REDIS_PORT" ] && redis_ping "$REDIS_PORT" \
        && [ "$(cat "$REDIS_DIR/redis.pid" 2>/dev/null)" = "$(redis-cli -p "$REDIS_PORT" info server 2>/dev/null \
                | sed -n 's/^process_id:\([0-9]*\).*/\1/p')" ]; then
        log "Redis already running on port $REDIS_PORT"
        return
    fi
    if [ -z "$REDIS_PORT" ] || port_in_use "$REDIS_PORT"; then REDIS_PORT=${PYMQ_REDIS_PORT:-$(free_port)}; fi
    echo "$REDIS_PORT" >"$REDIS_DIR/port"
    log "starting Redis on 127.0.0.1:$REDIS_PORT"
    # AOF on, as a grid used for persistent messages should run; the grid device reports it.
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$REDIS_DIR" --daemonize yes \
        --pidfile "$REDIS_DIR/redis.pid" --logfile "$REDIS_DIR/redis.log" \
        --appendonly yes --appendfsync everysec --save "" --protected-mode no 9>&- \
        || die "redis-server did not start (log: $REDIS_DIR/redis.log)"
    for _ in $(seq 1 100); do
        redis_ping "$REDIS_PORT" && return
        sleep 0.1
    done
    tail -n 20 "$REDIS_DIR/redis.log" >&2 || true
    die "Redis on port $REDIS_PORT does not answer"
}

stop_all() {
    if PGBIN=$(pg_bindir 2>/dev/null) && [ -f "$PG_DIR/data/PG_VERSION" ]; then
        as_pg "'$PGBIN/pg_ctl' -D '$PG_DIR/data' -m fast stop" >&2 || true
    fi
    if [ -f "$REDIS_DIR/port" ] && redis_ping "$(cat "$REDIS_DIR/port")"; then
        redis-cli -p "$(cat "$REDIS_DIR/port")" shutdown nosave >&2 || true
    fi
    log "stopped"
}

if [ "${1:-}" = "--stop" ]; then stop_all; exit 0; fi

install_packages
start_postgres
start_redis
log "ready in $(( $(date +%s) - T0 )) s"
echo "export PYMQ_TEST_POSTGRES_URL=postgresql+psycopg://$PG_USER_NAME:$PG_PASSWORD@127.0.0.1:$PG_PORT/$PG_DATABASE"
echo "export PYMQ_TEST_REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0"
