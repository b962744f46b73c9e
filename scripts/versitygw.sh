#!/usr/bin/env bash
# The S3-compatible server the object-store tests run against: versitygw
# (Apache-2.0, one Go binary) serving the buckets of a directory (each bucket
# is a sub-directory of DIR).
#
#   scripts/versitygw.sh install                 # go install it if missing; prints its path
#   scripts/versitygw.sh path                    # its path (exit 1 if not installed)
#   scripts/versitygw.sh start PORT DIR [PIDFILE] # start on 127.0.0.1:PORT over DIR, wait until ready
#   scripts/versitygw.sh stop PIDFILE            # stop a server started with a pidfile
#
# Credentials: ROOT_ACCESS_KEY / ROOT_SECRET_KEY from the environment
# (default: stasis / stasis-secret). Clients then use
#   AWS_ENDPOINT_URL=http://127.0.0.1:PORT AWS_ALLOW_HTTP=true AWS_REGION=us-east-1
#   AWS_ACCESS_KEY_ID=stasis AWS_SECRET_ACCESS_KEY=stasis-secret
set -euo pipefail

VERSION=v1.8.0

gw_log() { printf 'versitygw.sh: %s\n' "$*" >&2; }

gw_path() {
    local p
    if p=$(command -v versitygw 2>/dev/null); then
        echo "$p"
        return 0
    fi
    local gobin
    gobin=$(go env GOBIN 2>/dev/null || true)
    [ -n "$gobin" ] || gobin="$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin"
    for p in "$gobin/versitygw" "$HOME/go/bin/versitygw"; do
        if [ -x "$p" ]; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

gw_install() {
    if gw_path >/dev/null; then
        gw_path
        return 0
    fi
    if ! command -v go >/dev/null 2>&1; then
        if [ -x /usr/local/go/bin/go ]; then
            export PATH="/usr/local/go/bin:$PATH"
        else
            gw_log "go is not installed; installing golang-go"
            export DEBIAN_FRONTEND=noninteractive
            apt-get update -qq
            apt-get install -y -qq --no-install-recommends golang-go >/dev/null
        fi
    fi
    gw_log "installing versitygw $VERSION (go install, takes a few minutes)"
    go install "github.com/versity/versitygw/cmd/versitygw@$VERSION"
    gw_path
}

gw_start() {
    local port=$1 dir=$2 pidfile=${3:-}
    local bin
    bin=$(gw_path) || { gw_log "versitygw is not installed: run $0 install"; exit 1; }
    mkdir -p "$dir"
    ROOT_ACCESS_KEY=${ROOT_ACCESS_KEY:-stasis} ROOT_SECRET_KEY=${ROOT_SECRET_KEY:-stasis-secret} \
        setsid "$bin" --port "127.0.0.1:$port" posix "$dir" >"$dir/.versitygw.log" 2>&1 </dev/null &
    local pid=$!
    [ -z "$pidfile" ] || echo "$pid" >"$pidfile"
    local i
    for i in $(seq 1 600); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$pid"
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            gw_log "versitygw exited at start:"
            cat "$dir/.versitygw.log" >&2
            exit 1
        fi
        sleep 0.05
    done
    gw_log "versitygw did not listen on 127.0.0.1:$port within 30 s"
    kill "$pid" 2>/dev/null || true
    exit 1
}

gw_stop() {
    local pid
    pid=$(cat "$1")
    kill "$pid" 2>/dev/null || true
    rm -f "$1"
}

case "${1:-}" in
    install) gw_install ;;
    path) gw_path ;;
    start) shift; gw_start "$@" ;;
    stop) shift; gw_stop "$@" ;;
    *) gw_log "usage: $0 install|path|start PORT DIR [PIDFILE]|stop PIDFILE"; exit 2 ;;
esac
