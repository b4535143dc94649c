# tests/integration/ctl-lib.sh — shared by the ctl-*.sh tests (sourced):
# temp dir, start/stop of ctl_peer processes by pid, bounded waits, and a
# cleanup that kills every child on any exit path.
set -u
peer_bin=$1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ctl-test.XXXXXX")
pids=()

cleanup() {
    local p
    for p in "${pids[@]}"; do
        kill -CONT "$p" 2>/dev/null
        kill -KILL "$p" 2>/dev/null
    done
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' TERM INT HUP

fail() {
    local f
    echo "FAIL: $*" >&2
    for f in "$tmp"/*.out "$tmp"/*.err; do
        [ -f "$f" ] && { echo "--- $f" >&2; tail -n 40 "$f" >&2; }
    done
    exit 1
}

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# count FILE PATTERN — lines of FILE containing PATTERN (fixed string).
count() { grep -acF -- "$2" "$1" 2>/dev/null; }

# wait_grep FILE PATTERN SECONDS [N] — wait until more than N (default 0)
# lines of FILE contain PATTERN.
wait_grep() {
    local end=$(( $(now_ms) + $3 * 1000 ))
    while [ "$(now_ms)" -lt "$end" ]; do
        [ "$(count "$1" "$2")" -gt "${4:-0}" ] && return 0
        sleep 0.05
    done
    return 1
}

# start_server NAME ARGS... — run ctl_peer server in the background; sets
# server_pid and server_port.
start_server() {
    local name=$1; shift
    "$peer_bin" server "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
    server_pid=$!
    pids+=("$server_pid")
    wait_grep "$tmp/$name.out" "port " 10 || fail "$name did not print its port"
    server_port=$(sed -n 's/^port \([0-9]*\)$/\1/p' "$tmp/$name.out")
}

# start_client NAME ARGS... — run ctl_peer client in the background; sets client_pid.
start_client() {
    local name=$1; shift
    # No timeout(1) wrapper: client_pid must be ctl_peer itself (SIGSTOP).
    "$peer_bin" client --port "$server_port" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
    client_pid=$!
    pids+=("$client_pid")
}

# wait_exit PID SECONDS — wait for PID to end within SECONDS; sets exit_code.
wait_exit() {
    local end=$(( $(now_ms) + $2 * 1000 ))
    while kill -0 "$1" 2>/dev/null && [ "$(now_ms)" -lt "$end" ]; do
        sleep 0.05
    done
    kill -0 "$1" 2>/dev/null && fail "pid $1 still running after $2 s"
    wait "$1"
    exit_code=$?
}

# check_logs — no sanitizer report in any process's stderr (ASan exits 1,
# which a refused client also does).
check_logs() {
    local f
    for f in "$tmp"/*.err; do
        grep -qE "ERROR: (Address|Leak)Sanitizer|runtime error:" "$f" &&
            fail "sanitizer report in $f"
    done
    return 0
}

# stop_server — SIGTERM the server; it must exit 0 (clean shutdown, no leaks).
stop_server() {
    kill -TERM "$server_pid"
    wait_exit "$server_pid" 10
    [ "$exit_code" -eq 0 ] || fail "server exited with $exit_code"
}
