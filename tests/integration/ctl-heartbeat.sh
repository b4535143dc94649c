#!/usr/bin/env bash
# tests/integration/ctl-heartbeat.sh — dead-peer detection between two
# processes: a stopped (SIGSTOP) client is declared dead by the server within
# about 3 heartbeat intervals, and a stopped server by the client.
. "$(dirname "$0")/ctl-lib.sh"

interval=250   # ms; dead after 3 intervals without a frame

# elapsed_ok T0 WHAT — dead-peer detection took between 1.5 and 12 intervals
# (it takes 2-4: the last frame came at most one interval before the stop).
# Measured to the log or "closed:" line, not to process exit.
elapsed_ok() {
    local ms=$(( $(now_ms) - $1 ))
    echo "$2 after $ms ms"
    [ "$ms" -ge $(( interval * 3 / 2 )) ] || fail "$2 too early ($ms ms)"
    [ "$ms" -le $(( interval * 12 )) ] || fail "$2 too late ($ms ms)"
}

start_server srv --hb-ms $interval
start_client quiet --hb-ms $interval --hold-ms 20000
wait_grep "$tmp/quiet.out" "established" 10 || fail "client not established"
sleep 0.5
kill -STOP "$client_pid"
t0=$(now_ms)
wait_grep "$tmp/srv.err" "peer dead: nothing received for" 10 || fail "server never declared the stopped client dead"
elapsed_ok "$t0" "server declared the stopped client dead"
kill -CONT "$client_pid"
wait_exit "$client_pid" 10
[ "$exit_code" -eq 1 ] || fail "resumed client exit $exit_code, want 1 (connection gone)"
grep -qF "closed: " "$tmp/quiet.out" || fail "resumed client did not report the close"

start_client watcher --hb-ms $interval --hold-ms 20000
wait_grep "$tmp/watcher.out" "established" 10 || fail "watcher not established"
sleep 0.5
kill -STOP "$server_pid"
t0=$(now_ms)
wait_grep "$tmp/watcher.out" "closed: timeout: peer dead: nothing received for" 10 ||
    fail "watcher did not report the dead server"
elapsed_ok "$t0" "client declared the stopped server dead"
wait_exit "$client_pid" 10
[ "$exit_code" -eq 1 ] || fail "watcher exit $exit_code, want 1"
grep -qF "peer dead" "$tmp/watcher.err" || fail "watcher did not log the dead server"
kill -CONT "$server_pid"

# The server is fine after its pause.
start_client after --hold-ms 0
wait_exit "$client_pid" 10
[ "$exit_code" -eq 0 ] || fail "client refused after the server resumed"
stop_server
check_logs
echo "ok"
