#!/usr/bin/env bash
# Namespace "hosts" on this machine, for the distributed tests and demos
# (Open MPI across hosts, later `stasis cluster`). Needs root.
#
#   hosts.sh up N [--prefix P] [--subnet A.B.C.0/24] [--json]
#   hosts.sh down [--prefix P]
#   hosts.sh exec HOST CMD [ARGS...]
#   hosts.sh list [--prefix P]
#
# `up` creates hosts P1..PN (default prefix `stasis-h`): each is a network
# namespace with loopback up and a veth `eth0` with address A.B.C.(10+i)/24,
# plugged into the bridge `br0` of a namespace of its own, `P-br` (not the
# root namespace: all traffic stays inside the namespaces, and two prefixes
# never see each other, even with the same subnet). Name resolution:
# /etc/netns/Pi/hosts (which `ip netns exec` mounts over /etc/hosts) maps
# every host name to its address; the machine's /etc/hosts is untouched.
# `up` refuses if the prefix is already up with another N or subnet, and is
# a no-op (it prints the hosts) if it is up with the same ones.
#
# `down` kills what still runs in those namespaces (processes the tests
# started there), deletes the namespaces and /etc/netns/Pi. It is
# idempotent and also cleans up after a partial `up`.
#
# `exec` runs CMD "on" HOST: in its network namespace (and the mount
# namespace `ip netns exec` makes, with its /etc/hosts) and in a fresh UTS
# namespace whose hostname is HOST, as Open MPI's launcher does
# (scripts/mpi-rsh.sh). It execs: the command keeps this process's pid.
set -Eeuo pipefail

PREFIX=stasis-h
SUBNET=10.213.0.0/24
JSON=0
N=

die() { printf 'hosts: %s\n' "$*" >&2; exit 1; }
say() { [ "$JSON" = 1 ] || printf 'hosts: %s\n' "$*"; }

need_root() { [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces); run: sudo $0 $*"; }

check_prefix() {
    # Not ending in a digit: hosts of prefix "a1" and of prefix "a" must not
    # share names (a11).
    [[ "$PREFIX" =~ ^[a-z]([a-z0-9-]{0,40}[a-z-])?$ ]] ||
        die "bad --prefix '$PREFIX': lowercase letters, digits and '-', starting with a letter and not ending in a digit (it becomes a hostname)"
}

# The base "A.B.C" of a /24 subnet given as A.B.C.0/24.
subnet_base() {
    [[ "$SUBNET" =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.0/24$ ]] ||
        die "bad --subnet '$SUBNET': only A.B.C.0/24 is supported"
    printf '%s.%s.%s' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}"
}

# The host namespaces of PREFIX that exist, in numeric order.
existing_hosts() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}[0-9]+\$" |
        sed "s/^${PREFIX}//" | sort -n | sed "s/^/${PREFIX}/" || true
}

addr_of() { # HOST -> its IPv4 address on eth0 (empty if none)
    ip -n "$1" -4 -o addr show dev eth0 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | head -n1
}

print_hosts() {
    local hosts=("$@") h first=1
    if [ "$JSON" = 1 ]; then
        printf '{"prefix":"%s","subnet":"%s","bridge_netns":"%s-br","hosts":[' "$PREFIX" "$SUBNET" "$PREFIX"
        for h in "${hosts[@]}"; do
            [ "$first" = 1 ] || printf ','
            first=0
            printf '{"name":"%s","netns":"%s","addr":"%s"}' "$h" "$h" "$(addr_of "$h")"
        done
        printf ']}\n'
    else
        for h in "${hosts[@]}"; do say "$h $(addr_of "$h")"; done
    fi
}

cmd_up() {
    [[ "${N:-}" =~ ^[1-9][0-9]*$ ]] && [ "$N" -le 200 ] || die "up needs a host count N in 1..200"
    local base; base=$(subnet_base)
    local existing; existing=$(existing_hosts)
    if [ -n "$existing" ]; then
        local count; count=$(printf '%s\n' "$existing" | wc -l)
        local a1; a1=$(addr_of "${PREFIX}1")
        if [ "$count" -eq "$N" ] && [ "$a1" = "$base.11" ] && ip netns list 2>/dev/null | grep -qx "${PREFIX}-br\( .*\)\?"; then
            say "prefix $PREFIX is already up with $N hosts on $SUBNET"
            # shellcheck disable=SC2086
            print_hosts $existing
            return 0
        fi
        die "prefix $PREFIX is already up ($count hosts, ${PREFIX}1 at ${a1:-no address}); run: $0 down --prefix $PREFIX"
    fi
    local br="${PREFIX}-br" i h hosts=()
    if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$br"; then
        die "a bridge namespace $br is left over (no hosts); run: $0 down --prefix $PREFIX"
    fi
    # Clean up a partial `up` if anything of ours fails half-way.
    trap 'echo "hosts: up failed, removing what it made" >&2; cmd_down >/dev/null 2>&1 || true' ERR
    ip netns add "$br"
    ip -n "$br" link set lo up
    ip -n "$br" link add br0 type bridge
    ip -n "$br" link set br0 up
    for i in $(seq 1 "$N"); do
        h="${PREFIX}${i}"
        hosts+=("$h")
        ip netns add "$h"
        ip -n "$h" link set lo up
        ip -n "$h" link add eth0 type veth peer name "v$i" netns "$br"
        ip -n "$br" link set "v$i" master br0 up
        ip -n "$h" addr add "$base.$((10 + i))/24" dev eth0
        ip -n "$h" link set eth0 up
    done
    local hostsfile
    hostsfile=$(mktemp)
    {
        printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n'
        for i in $(seq 1 "$N"); do printf '%s\t%s\n' "$base.$((10 + i))" "${PREFIX}${i}"; done
    } >"$hostsfile"
    for h in "${hosts[@]}"; do
        mkdir -p "/etc/netns/$h"
        cp "$hostsfile" "/etc/netns/$h/hosts"
        chmod 644 "/etc/netns/$h/hosts"
    done
    rm -f "$hostsfile"
    trap - ERR
    say "up: $N hosts ${PREFIX}1..${PREFIX}${N} on $SUBNET (bridge br0 in netns $br, names in /etc/netns/HOST/hosts)"
    print_hosts "${hosts[@]}"
}

kill_in_netns() { # NETNS: SIGKILL every process in it, wait until none is left
    local ns=$1 pids t
    for t in $(seq 1 50); do
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        [ -n "$pids" ] || return 0
        [ "$t" -gt 1 ] || say "down: killing what still runs in $ns: $(echo $pids)"
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
        sleep 0.1
    done
    say "down: processes left in $ns: $(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
}

cmd_down() {
    local h removed=0
    for h in $(existing_hosts) "${PREFIX}-br"; do
        if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$h"; then
            kill_in_netns "$h"
            ip netns del "$h"
            removed=$((removed + 1))
        fi
    done
    for h in /etc/netns/"${PREFIX}"[0-9]*; do
        [ -d "$h" ] || continue
        [[ "$(basename "$h")" =~ ^${PREFIX}[0-9]+$ ]] || continue
        rm -rf "$h"
    done
    rmdir /etc/netns 2>/dev/null || true
    say "down: prefix $PREFIX: removed $removed namespaces"
}

cmd_exec() {
    [ $# -ge 2 ] || die "usage: $0 exec HOST CMD [ARGS...]"
    local h=$1
    shift
    ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$h" || die "no such host namespace: $h"
    # shellcheck disable=SC2016
    exec ip netns exec "$h" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$h" "$@"
}

main() {
    [ $# -ge 1 ] || die "usage: $0 up N [--prefix P] [--subnet A.B.C.0/24] [--json] | down [--prefix P] | exec HOST CMD... | list [--prefix P]"
    local cmd=$1
    shift
    if [ "$cmd" = exec ]; then
        need_root "$cmd"
        cmd_exec "$@"
    fi
    while [ $# -gt 0 ]; do
        case "$1" in
            --prefix) PREFIX=${2:?--prefix needs a value}; shift 2 ;;
            --subnet) SUBNET=${2:?--subnet needs a value}; shift 2 ;;
            --json) JSON=1; shift ;;
            *) if [ "$cmd" = up ] && [ -z "$N" ]; then N=$1; shift; else die "unknown argument: $1"; fi ;;
        esac
    done
    check_prefix
    need_root "$cmd"
    case "$cmd" in
        up) cmd_up ;;
        down) cmd_down ;;
        # shellcheck disable=SC2046
        list) print_hosts $(existing_hosts) ;;
        *) die "unknown command: $cmd (up, down, exec, list)" ;;
    esac
}

main "$@"
