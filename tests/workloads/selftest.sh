#!/bin/bash
# Self-test of the workloads themselves (no Stasis involved).
#
#   ./selftest.sh [OUT]        (OUT defaults to build/ next to this script)
#
# Builds OUT/<workload> and OUT/selftest/<workload> (make all selftest), then
# for every workload:
#   - runs the normal binary per the protocol (own temp dir as cwd, stdout and
#     stderr to files, stdin /dev/null, no inherited fds beyond 0-2), waits
#     for the pidfile, lets it run, sends SIGTERM: expects exit 0, last line
#     "PASS" and no "mismatch" line;
#   - runs the -DSELFTEST_CORRUPT binary the same way: expects exit 1, last
#     line "FAIL: ...", at least one injected corruption, and no
#     "SELFTEST-UNDETECTED" line (every injected corruption was detected).
# counter is additionally run with MAX_TICKS=3 (must PASS without SIGTERM).
# chain_writer is additionally run (normal and corrupt) with SIZE_MIB=16 and
# FORK_AT=100 (a parent and a child); ttyline_ctty with "/dev/tty8 devtty"
# (its terminal held through /dev/tty only).
# mesh runs as 3 processes (nodes) on 127.0.0.1 (run_mesh, below).
# namespaces runs under unshare (PID 1 of its own PID, mount, UTS, IPC and
# network namespaces): its pidfile says 1, and SIGTERM goes to unshare's child.
# A workload passes if all its runs behave.  Prints
#   workloads: N passed, M failed
# and exits 0 only if M == 0.  Temp dirs of failed runs are kept.
#
# Environment: RUN_SECONDS (default 1.5) = time between ready and SIGTERM;
# SELFTEST_JOBS (default 2 per CPU) = workloads tested at once.

set -u

here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/build}
case $out in /*) ;; *) out=$PWD/$out ;; esac
run_seconds=${RUN_SECONDS:-1.5}

WORKLOADS="heap stack_globals mappings fpu signals files counter restart_syscalls threads tree pipes shm anonfds chain_writer dirty_set sockets notify_locks_timers lazy_events udp_queue udp6_queue sparse_shm pty attrs fown caps unix_states sockopts stopped zombies unix_scm unix_pending netlink pdeath novdso tcp_states sock_filter ghosts leases pidfds epoll_fds advice fdtable shm_parts chroot strict filters fanotify aio unlinked_link lease_break pty_hungup bpf_map packet hugetlb cow io_uring namespaces pty_modes scm_kinds fdtable_relay tcp_pending big_content sysv_parts uffd fanotify_ghost timens mqueue_fds ttyline bpf_mmap hugetlbfs_files ttyline_ctty"

if ! make -s -j"$(nproc)" -C "$here" OUT="$out" all selftest; then
	echo "selftest: build failed" >&2
	exit 2
fi

# run_one NAME BIN MODE RUNTIME [ARGS...]
#   MODE: pass | corrupt | selfexit (exits on its own, no SIGTERM, PASS)
# Prints one result line; returns 0 if the run behaved as expected.
run_one() {
	local name=$1 bin=$2 mode=$3 runtime=$4
	shift 4
	local wd pid rc i last why="" target want
	local -a wrap=()
	[ "$name" = namespaces ] &&
		wrap=(unshare --pid --fork --mount-proc --mount --uts --ipc --net)
	wd=$(mktemp -d "${TMPDIR:-/tmp}/stasis-wl-$name.XXXXXX")

	(
		cd "$wd" || exit 99
		# close every inherited fd except 0-2
		for fd in /proc/$BASHPID/fd/*; do
			fd=${fd##*/}
			[ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-"
		done
		exec "${wrap[@]}" "$bin" "$wd/pidfile" "$@" >"$wd/out" 2>"$wd/err" </dev/null
	) &
	pid=$!
	target=$pid want=$pid

	for ((i = 0; i < 200; i++)); do
		[ -s "$wd/pidfile" ] && break
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if [ ! -s "$wd/pidfile" ]; then
		if [ "$mode" != selfexit ]; then
			why="no pidfile"
		fi
	else
		if [ ${#wrap[@]} -gt 0 ]; then
			want=1
			target=$(cat "/proc/$pid/task/$pid/children" 2>/dev/null)
			target=${target%% *}
		fi
		if [ "$(cat "$wd/pidfile")" != "$want" ]; then
			why="pidfile says $(cat "$wd/pidfile"), pid is $want"
		fi
	fi

	if [ "$mode" != selfexit ]; then
		sleep "$runtime"
		kill -TERM "${target:-$pid}" 2>/dev/null
	fi
	# watchdog: 60 s for verification
	( sleep 60; kill -KILL "$pid" 2>/dev/null ) &
	local dog=$!
	wait "$pid"
	rc=$?
	kill "$dog" 2>/dev/null
	wait "$dog" 2>/dev/null

	last=$(tail -n 1 "$wd/out" 2>/dev/null)
	if [ -z "$why" ]; then
		case $mode in
		pass | selfexit)
			if [ "$rc" != 0 ] || [ "$last" != PASS ]; then
				why="expected PASS/0, got rc=$rc last='$last'"
			elif grep -q '^mismatch' "$wd/out"; then
				why="PASS but mismatch lines printed"
			fi
			;;
		corrupt)
			if [ "$rc" != 1 ] || [ "${last#FAIL: }" = "$last" ]; then
				why="expected FAIL/1, got rc=$rc last='$last'"
			elif grep -q '^SELFTEST-UNDETECTED' "$wd/out"; then
				why="undetected: $(grep '^SELFTEST-UNDETECTED' "$wd/out" | cut -d' ' -f2 | tr '\n' ' ')"
			elif ! grep -q '^selftest: [1-9][0-9]* corruptions injected' "$wd/out"; then
				why="no corruption injected"
			fi
			;;
		esac
	fi

	if [ -z "$why" ]; then
		case $mode in
		corrupt)
			printf '  ok   %-19s %-8s %s\n' "$name" "$mode" \
				"$(grep -o '[0-9]* corruptions injected' "$wd/out"), all detected"
			;;
		*)
			printf '  ok   %-19s %-8s %s\n' "$name" "$mode" "$last"
			;;
		esac
		rm -rf "$wd"
		return 0
	fi
	printf '  FAIL %-19s %-8s %s (output kept in %s)\n' "$name" "$mode" "$why" "$wd"
	sed 's/^/         | /' "$wd/out" | tail -n 20
	[ -s "$wd/err" ] && sed 's/^/         ! /' "$wd/err" | tail -n 5
	return 1
}

# run_mesh MODE BIN: the multi-process workload mesh, 3 nodes on 127.0.0.1
# (ports BASE..BASE+2, BASE random below the ephemeral range), each started
# like run_one in its own temp dir.  Waits for the 3 pidfiles, then until
# every link carried traffic both ways (their --stats files), lets them run
# RUNTIME, SIGTERMs all three.  MODE pass: each exits 0 with a summary line
# and PASS; MODE corrupt: each exits 1 with FAIL, and as in run_one.
run_mesh() {
	local mode=$1 bin=$2 runtime=$3 n=3 base=$((20000 + RANDOM % 12000))
	local wd i j k rc last why="" dog
	local -a args pids
	wd=$(mktemp -d "${TMPDIR:-/tmp}/stasis-wl-mesh.XXXXXX")
	for ((i = 0; i < n; i++)); do
		mkdir "$wd/$i"
		args=(--id $i --nodes $n --listen 127.0.0.1:$((base + i)) --stats "$wd/$i/stats")
		for ((j = 0; j < n; j++)); do
			[ $j = $i ] || args+=(--peer "$j=127.0.0.1:$((base + j))")
		done
		(
			cd "$wd/$i" || exit 99
			for fd in /proc/$BASHPID/fd/*; do
				fd=${fd##*/}
				[ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-"
			done
			exec "$bin" "$wd/$i/pidfile" "${args[@]}" >"$wd/$i/out" 2>"$wd/$i/err" </dev/null
		) &
		pids[i]=$!
	done
	for ((k = 0; k < 300; k++)); do
		why=""
		for ((i = 0; i < n; i++)); do
			[ -s "$wd/$i/pidfile" ] || why="no pidfile from node $i"
			grep -q '"rx_msgs":[1-9]' "$wd/$i/stats" 2>/dev/null &&
				! grep -q '"rx_msgs":0[,}]' "$wd/$i/stats" ||
				why="${why:-no traffic on some link of node $i}"
			kill -0 "${pids[i]}" 2>/dev/null || why="node $i exited early"
		done
		[ -z "$why" ] && break
		sleep 0.1
	done
	for ((i = 0; i < n; i++)); do
		[ -n "$why" ] && break
		[ "$(cat "$wd/$i/pidfile")" = "${pids[i]}" ] ||
			why="node $i: pidfile says $(cat "$wd/$i/pidfile"), pid is ${pids[i]}"
	done
	[ -z "$why" ] && sleep "$runtime"
	kill -TERM "${pids[@]}" 2>/dev/null
	( sleep 90; kill -KILL "${pids[@]}" 2>/dev/null ) &
	dog=$!
	for ((i = 0; i < n; i++)); do
		wait "${pids[i]}"
		rc=$?
		last=$(tail -n 1 "$wd/$i/out" 2>/dev/null)
		[ -n "$why" ] && continue
		case $mode in
		pass)
			if [ "$rc" != 0 ] || [ "$last" != PASS ]; then
				why="node $i: expected PASS/0, got rc=$rc last='$last'"
			elif grep -q '^mismatch' "$wd/$i/out"; then
				why="node $i: PASS but mismatch lines printed"
			elif ! grep -q "^summary: node $i; peer" "$wd/$i/out"; then
				why="node $i: no summary line"
			fi
			;;
		corrupt)
			if [ "$rc" != 1 ] || [ "${last#FAIL: }" = "$last" ]; then
				why="node $i: expected FAIL/1, got rc=$rc last='$last'"
			elif grep -q '^SELFTEST-UNDETECTED' "$wd/$i/out"; then
				why="node $i: undetected: $(grep '^SELFTEST-UNDETECTED' "$wd/$i/out" | cut -d' ' -f2 | tr '\n' ' ')"
			elif ! grep -q '^selftest: [1-9][0-9]* corruptions injected' "$wd/$i/out"; then
				why="node $i: no corruption injected"
			fi
			;;
		esac
	done
	kill "$dog" 2>/dev/null
	wait "$dog" 2>/dev/null
	if [ -z "$why" ]; then
		if [ "$mode" = pass ]; then
			last="PASS on $n nodes"
		else
			last="$(cat "$wd"/*/out | grep -o '^selftest: [0-9]*' |
				awk '{ s += $2 } END { print s }') corruptions injected on $n nodes, all detected"
		fi
		printf '  ok   %-19s %-8s %s\n' mesh "$mode" "$last"
		rm -rf "$wd"
		return 0
	fi
	printf '  FAIL %-19s %-8s %s (output kept in %s)\n' mesh "$mode" "$why" "$wd"
	for ((i = 0; i < n; i++)); do
		sed "s/^/         $i | /" "$wd/$i/out" | tail -n 10
		[ -s "$wd/$i/err" ] && sed "s/^/         $i ! /" "$wd/$i/err" | tail -n 5
	done
	return 1
}

# test_workload NAME: every run of one workload; returns 0 if all behaved.
test_workload() {
	local w=$1 rt=$run_seconds ok=0
	# restart_syscalls checks progress once >= 2 s have passed
	[ "$w" = restart_syscalls ] && rt=2.5
	run_one "$w" "$out/$w" pass "$rt" || ok=1
	run_one "$w" "$out/selftest/$w" corrupt "$rt" || ok=1
	if [ "$w" = counter ]; then
		run_one "$w" "$out/$w" selfexit 0 3 || ok=1
	fi
	if [ "$w" = heap ]; then
		run_one "$w" "$out/$w" pass "$rt" 8 || ok=1
	fi
	if [ "$w" = io_uring ]; then
		# rings bound to a thread (single issuer), or disabled
		run_one "$w" "$out/$w" pass "$rt" issuer || ok=1
		run_one "$w" "$out/selftest/$w" corrupt "$rt" issuer || ok=1
		# a ring with an SQ poll thread
		run_one "$w" "$out/$w" pass "$rt" sqpoll || ok=1
		run_one "$w" "$out/selftest/$w" corrupt "$rt" sqpoll || ok=1
		# a ring a child inherited
		run_one "$w" "$out/$w" pass "$rt" shared || ok=1
		run_one "$w" "$out/selftest/$w" corrupt "$rt" shared || ok=1
	fi
	if [ "$w" = ttyline_ctty ]; then
		# the terminal held only through /dev/tty
		run_one "$w" "$out/$w" pass "$rt" /dev/tty8 devtty || ok=1
		run_one "$w" "$out/selftest/$w" corrupt "$rt" /dev/tty8 devtty || ok=1
	fi
	if [ "$w" = chain_writer ]; then
		# 16 MiB, fork at iteration 100: parent and child check themselves
		run_one "$w" "$out/$w" pass "$rt" 16 100 || ok=1
		run_one "$w" "$out/selftest/$w" corrupt "$rt" 16 100 || ok=1
	fi
	return $ok
}

# mesh: several processes (nodes), its own runner
test_mesh() {
	local ok=0
	run_mesh pass "$out/mesh" "$run_seconds" || ok=1
	run_mesh corrupt "$out/selftest/mesh" "$run_seconds" || ok=1
	return $ok
}

# The workloads mostly wait (for SIGTERM), so SELFTEST_JOBS of them (default
# 2 per CPU) run at once; each one's lines are printed together, in order.
jobs_max=${SELFTEST_JOBS:-$((2 * $(nproc)))}
results=$(mktemp -d "${TMPDIR:-/tmp}/stasis-wl-results.XXXXXX")
for w in $WORKLOADS mesh; do
	while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do
		wait -n
	done
	(
		if [ "$w" = mesh ]; then
			test_mesh
		else
			test_workload "$w"
		fi >"$results/$w.out" 2>&1
		echo $? >"$results/$w.rc"
	) &
done
wait

passed=0
failed=0
for w in $WORKLOADS mesh; do
	cat "$results/$w.out"
	if [ "$(cat "$results/$w.rc" 2>/dev/null)" = 0 ]; then
		passed=$((passed + 1))
	else
		failed=$((failed + 1))
	fi
done
rm -rf "$results"

echo "workloads: $passed passed, $failed failed"
[ $failed = 0 ]
