#!/usr/bin/env bash
# Installs what building and testing Stasis needs, if it is missing:
# a C compiler and make (test workloads), python3, redis and a JDK (the
# tests with real programs, crates/stasis/tests/programs.rs), PostgreSQL,
# nginx, memcached, Node.js and Go (the real-program matrix,
# crates/stasis/tests/real_programs), Open MPI
# (mpirun, mpicc: tests/workloads/mpi and crates/stasis/tests/mpi_env.rs),
# iproute2 and util-linux (ip netns, unshare: scripts/hosts.sh), and a Rust
# toolchain with rustfmt and clippy. Safe to run again: it only installs
# what is absent.
# Source it (`. scripts/setup.sh`) to get cargo on PATH in the calling shell.
set -euo pipefail

stasis_log() { printf 'setup: %s\n' "$*" >&2; }

if [ -d "$HOME/.cargo/bin" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
{ command -v redis-cli >/dev/null 2>&1 && command -v redis-benchmark >/dev/null 2>&1; } ||
    missing+=(redis-tools)
{ command -v java >/dev/null 2>&1 && command -v javac >/dev/null 2>&1; } ||
    missing+=(default-jdk-headless)
# The real-program matrix (crates/stasis/tests/real_programs): PostgreSQL
# (server, psql, pgbench), nginx, memcached, Node.js and Go.
{ ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && command -v psql >/dev/null 2>&1 &&
    command -v pgbench >/dev/null 2>&1; } || missing+=(postgresql)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
command -v memcached >/dev/null 2>&1 || missing+=(memcached)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v go >/dev/null 2>&1 || missing+=(golang-go)
{ command -v mpirun >/dev/null 2>&1 && command -v mpicc >/dev/null 2>&1; } ||
    missing+=(openmpi-bin libopenmpi-dev)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v unshare >/dev/null 2>&1 || missing+=(util-linux)
command -v cargo >/dev/null 2>&1 || missing+=(cargo rustc)

if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        stasis_log "missing: ${missing[*]}; run this script as root (sudo) to install them"
        exit 1
    fi
    stasis_log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! cargo --version >/dev/null 2>&1; then
    stasis_log "cargo is not usable after installation"
    exit 1
fi

# rustfmt and clippy: scripts/test.sh checks the formatting and the lints.
if ! { cargo fmt --version >/dev/null 2>&1 && cargo clippy --version >/dev/null 2>&1; }; then
    if command -v rustup >/dev/null 2>&1; then
        stasis_log "installing the rustfmt and clippy components"
        rustup component add rustfmt clippy
    elif [ "$(id -u)" -ne 0 ]; then
        stasis_log "missing: rustfmt rust-clippy; run this script as root (sudo) to install them"
        exit 1
    else
        stasis_log "installing: rustfmt rust-clippy"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends rustfmt rust-clippy >/dev/null
    fi
    if ! { cargo fmt --version >/dev/null 2>&1 && cargo clippy --version >/dev/null 2>&1; }; then
        stasis_log "cargo fmt or cargo clippy is not usable after installation"
        exit 1
    fi
fi
stasis_log "$(cargo --version), $(cc --version | head -n1)"
# libstasis's Python test protects a NumPy array when NumPy is there
# (it still runs with plain buffers when it is not); the real-program
# matrix's NumPy scenario needs it.
if command -v python3 >/dev/null 2>&1 && ! python3 -c "import numpy" >/dev/null 2>&1; then
    python3 -m pip install -q numpy >/dev/null 2>&1 || stasis_log "numpy not installed: the Python test of libstasis runs without it"
fi

# versitygw: the S3-compatible server of the object-store tests
# (crates/stasis/tests/s3.rs, crates/stasis-store).
"$(dirname "${BASH_SOURCE[0]}")/versitygw.sh" install >/dev/null
