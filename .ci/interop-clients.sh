#!/usr/bin/env bash
# Prepare the STOMP clients in other languages that the interoperability tests drive, and the toolchains
# of the client bindings, and print where they are:
#
#   eval "$(.ci/interop-clients.sh)"     # then run pytest
#
#   PYMQ_NODE_STOMP   command line of the stompit driver (tests/interop/node: `npm ci`)
#   PYMQ_GO_STOMP     the go-stomp driver binary (tests/interop/go: `go build` into the cache)
#   PYMQ_NPM          npm, with bindings/typescript's dependencies installed (`npm ci`)
#   PYMQ_STOMPJS      @stomp/stompjs's UMD bundle (tests/interop/browser: `npm ci`), for the Chromium test
#   PYMQ_GO           go, with bindings/go's test binaries compiled once (Go's build cache)
#   PYMQ_MVN          mvn, with bindings/java's dependencies and test plugins in the local Maven repository
#                     (~/.m2, resolved from Maven Central once; keep it between CI runs to skip the download)
#
# Stdout carries only `export NAME=value` lines, so `eval` is safe; progress and errors go to stderr.
# Needs Node >= 18 with npm, Go >= 1.19, Java 17 with Maven 3.8, and Chromium for the TypeScript browser test
# (on Debian 12, as root, missing ones come from apt: nodejs npm golang-go openjdk-17-jdk-headless maven
# chromium).  Idempotent and quick the second time: each part is redone only when its inputs
# change (lock file, go.sum, sources, toolchain version), recorded in a stamp.  A part that fails prints
# nothing for its variable (the tests then fail under CI, skip otherwise) and the script exits 1 after
# doing the other parts.  Environment knobs:
#   PYMQ_INTEROP_CACHE   where built drivers and stamps live (default ${XDG_CACHE_HOME:-~/.cache}/pymq-interop)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE="${PYMQ_INTEROP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pymq-interop}"
T0=$(date +%s)
STATUS=0

log() { printf '[interop] %s\n' "$*" >&2; }
fail() { printf '[interop] ERROR: %s\n' "$*" >&2; STATUS=1; }
export_line() { printf 'export %s=%q\n' "$1" "$2"; }

mkdir -p "$CACHE"
# CI and a developer (or two sessions) running this at once must not race on npm ci or go build.
exec 9>"$CACHE/.lock"
if command -v flock >/dev/null 2>&1; then flock -w 600 9 || { fail "could not lock $CACHE/.lock"; exit 1; }; fi

# -- toolchains ---------------------------------------------------------------------------------------
apt_install() {  # apt_install PACKAGE...: only as root on Debian; returns 1 when it cannot
    [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1 || return 1
    log "installing $* with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    local opts=(-y -q --no-install-recommends)
    apt-get install "${opts[@]}" "$@" >"$CACHE/apt.log" 2>&1 && return 0
    apt-get update -q >>"$CACHE/apt.log" 2>&1 || true
    apt-get install "${opts[@]}" "$@" >>"$CACHE/apt.log" 2>&1 || { tail -n 20 "$CACHE/apt.log" >&2; return 1; }
}

find_go() {
    local go
    for go in "$(command -v go 2>/dev/null || true)" /usr/local/go/bin/go /usr/lib/go/bin/go; do
        [ -n "$go" ] && [ -x "$go" ] && { echo "$go"; return 0; }
    done
    return 1
}

NODE=$(command -v node 2>/dev/null || true)
NPM=$(command -v npm 2>/dev/null || true)
if [ -z "$NODE" ] || [ -z "$NPM" ]; then
    apt_install nodejs npm || true
    NODE=$(command -v node 2>/dev/null || true)
    NPM=$(command -v npm 2>/dev/null || true)
fi
GO=$(find_go || true)
if [ -z "$GO" ]; then
    apt_install golang-go || true
    GO=$(find_go || true)
fi
MVN=$(command -v mvn 2>/dev/null || true)
if [ -z "$MVN" ] || ! command -v javac >/dev/null 2>&1; then
    apt_install openjdk-17-jdk-headless maven || true
    MVN=$(command -v mvn 2>/dev/null || true)
fi

stamp() {  # a short digest of files and strings: what an output was built from
    local item
    for item in "$@"; do
        if [ -f "$item" ]; then sha256sum "$item"; else printf '%s\n' "$item"; fi
    done | sha256sum | cut -c1-16
}

# npm_ready DIR: `npm ci` in DIR unless its node_modules was installed from the same lock and Node
npm_ready() {
    local dir=$1 want have
    want=$(stamp "$dir/package-lock.json" "$("$NODE" --version)")
    have=$(cat "$dir/node_modules/.pymq-stamp" 2>/dev/null || true)
    if [ "$want" = "$have" ]; then
        log "${dir#"$ROOT"/}: node_modules up to date"
        return 0
    fi
    log "${dir#"$ROOT"/}: npm ci"
    (cd "$dir" && "$NPM" ci --no-audit --no-fund --loglevel=error) >&2 || return 1
    echo "$want" >"$dir/node_modules/.pymq-stamp"
}

# -- stompit (Node) -----------------------------------------------------------------------------------
node_stompit() {
    local dir="$ROOT/tests/interop/node"
    [ -n "$NODE" ] && [ -n "$NPM" ] || { fail "node/npm not found: install Node >= 18 (Debian: apt-get install nodejs npm)"; return; }
    npm_ready "$dir" || { fail "npm ci in ${dir#"$ROOT"/} failed"; return; }
    export_line PYMQ_NODE_STOMP "$NODE $dir/driver.js"
}

# -- @stomp/stompjs in headless Chromium (STOMP over WebSocket) ----------------------------------------
stompjs_browser() {
    local dir="$ROOT/tests/interop/browser"
    [ -n "$NODE" ] && [ -n "$NPM" ] || { fail "node/npm not found: the stompjs browser test cannot run"; return; }
    npm_ready "$dir" || { fail "npm ci in ${dir#"$ROOT"/} failed"; return; }
    if [ ! -x "${PYMQ_TEST_CHROMIUM:-/usr/bin/chromium}" ]; then
        apt_install chromium || fail "chromium not found: the stompjs browser test cannot run (apt-get install chromium)"
    fi
    # the package's own UMD bundle is what the test page loads (served from 127.0.0.1, no CDN)
    export_line PYMQ_STOMPJS "$dir/node_modules/@stomp/stompjs/bundles/stomp.umd.js"
}

# -- go-stomp (Go) ------------------------------------------------------------------------------------
go_stomp() {
    local dir="$ROOT/tests/interop/go" out
    [ -n "$GO" ] || { fail "go not found: install Go >= 1.19 (Debian: apt-get install golang-go)"; return; }
    out="$CACHE/go-stomp-driver-$(stamp "$dir/go.mod" "$dir/go.sum" "$dir/main.go" "$("$GO" version)")"
    if [ -x "$out" ]; then
        log "tests/interop/go: driver up to date"
        touch "$out"     # in use: keeps it from the clean-up below in another checkout
    else
        log "tests/interop/go: go build (module download on first run)"
        (cd "$dir" && "$GO" build -o "$out.tmp" .) >&2 || { fail "go build in tests/interop/go failed"; return; }
        mv -f "$out.tmp" "$out"
        # other checkouts (worktrees) share this cache and may use another driver version: only drivers
        # nobody used for a week go
        find "$CACHE" -maxdepth 1 -name 'go-stomp-driver-*' ! -path "$out" -mtime +7 -delete
    fi
    export_line PYMQ_GO_STOMP "$out"
}

# -- bindings/typescript ------------------------------------------------------------------------------
ts_binding() {
    local dir="$ROOT/bindings/typescript"
    [ -n "$NODE" ] && [ -n "$NPM" ] || { fail "node/npm not found: bindings/typescript cannot be tested"; return; }
    npm_ready "$dir" || { fail "npm ci in bindings/typescript failed"; return; }
    # the browser test drives the system Chromium through playwright-core (never a downloaded browser)
    if [ ! -x "${PYMQ_TEST_CHROMIUM:-/usr/bin/chromium}" ]; then
        apt_install chromium || fail "chromium not found: the TypeScript browser test cannot run (apt-get install chromium)"
    fi
    export_line PYMQ_NPM "$NPM"
}

# -- bindings/go --------------------------------------------------------------------------------------
go_binding() {
    local dir="$ROOT/bindings/go"
    [ -n "$GO" ] || { fail "go not found: bindings/go cannot be tested"; return; }
    # compiling the test binaries now fills Go's build cache, so the test run itself only links and runs
    log "bindings/go: go vet (compiles the packages and their tests)"
    (cd "$dir" && "$GO" vet ./...) >&2 || { fail "go vet in bindings/go failed"; return; }
    export_line PYMQ_GO "$GO"
}

# -- bindings/java ------------------------------------------------------------------------------------
java_binding() {
    local dir="$ROOT/bindings/java" want have
    [ -n "$MVN" ] || { fail "mvn not found: bindings/java cannot be tested (Debian: apt-get install maven openjdk-17-jdk-headless)"; return; }
    want=$(stamp "$dir/pom.xml" "$("$MVN" -v 2>/dev/null | head -n 3)")
    have=$(cat "$CACHE/java-binding-stamp" 2>/dev/null || true)
    if [ "$want" = "$have" ]; then
        log "bindings/java: Maven repository up to date"
    else
        # packaging everything with one broker-free test class resolves every dependency, the surefire JUnit
        # provider (resolved only when a test runs) and the packaging plugins (sources, javadoc), and the
        # dependency plugin is what tests/packaging asks for a consumer's classpath: the test runs need no network
        log "bindings/java: mvn package -Dtest=RoutingVectorsTest (dependencies from Maven Central on first run)"
        (cd "$dir" && "$MVN" -B -q package -Dtest=RoutingVectorsTest -Dsurefire.failIfNoSpecifiedTests=false \
            && "$MVN" -B -q dependency:build-classpath -Dmdep.outputFile="$CACHE/java-classpath.txt") >&2 \
            || { fail "mvn in bindings/java failed"; return; }
        echo "$want" >"$CACHE/java-binding-stamp"
    fi
    export_line PYMQ_MVN "$MVN"
}

node_stompit
stompjs_browser
go_stomp
ts_binding
go_binding
java_binding
log "done in $(( $(date +%s) - T0 ))s"
exit $STATUS
