#!/usr/bin/env bash
# tests/integration/ctl-frames.sh — bad frames end only their own connection:
# while a good client stays connected and exchanging heartbeats, raw sockets
# send garbage, an oversized length, a truncated message, a partial frame then
# close, or nothing; the server closes each, logs why, and keeps serving.
. "$(dirname "$0")/ctl-lib.sh"

# 500 ms heartbeats (dead after 1.5 s): slow enough for a loaded ASan machine,
# frequent enough that the good client must keep exchanging them.
start_server srv --hb-ms 500 --handshake-ms 500
start_client good --hb-ms 500 --hold-ms 5000
wait_grep "$tmp/good.out" "established" 10 || fail "good client not established"

# raw NAME BYTES REASON HOW — send BYTES on a fresh socket and check REASON in
# the server log. HOW: reject = read until the server closes the socket and
# find REASON in the Reject it sent; drain = read for 0.2 s, then close (FIN);
# reset = close at once with the server's Hello unread (RST).
raw() {
    local name=$1 bytes=$2 reason=$3 how=$4 before
    before=$(count "$tmp/srv.err" "$reason")
    exec 3<>"/dev/tcp/127.0.0.1/$server_port" || fail "$name: cannot connect"
    printf "$bytes" >&3
    case $how in
    reject)
        timeout 5 cat <&3 >"$tmp/$name.raw" || fail "$name: server did not close the socket"
        grep -aqF -- "$reason" "$tmp/$name.raw" || fail "$name: no Reject with \"$reason\"" ;;
    drain)
        timeout 0.2 cat <&3 >/dev/null && fail "$name: server closed a half-sent frame early" ;;
    esac
    exec 3<&- 3>&-
    wait_grep "$tmp/srv.err" "$reason" 5 "$before" || fail "$name: server did not log \"$reason\""
}

raw garbage '\x00\x00\x00\x08\xff\xff\xff\xff\xff\xff\xff\xff' \
    "malformed frame (not a tandem envelope)" reject
raw oversized '\x7f\xff\xff\xff' \
    "frame of 2147483647 bytes exceeds the 4096-byte limit before authentication" reject
raw http 'GET / HTTP/1.1\r\n\r\n' "frame of 1195725856 bytes exceeds" reject
raw truncated '\x00\x00\x00\x05\x0a\x20\x08\x01\x12' \
    "malformed frame (not a tandem envelope)" reject
raw partial '\x00\x00\x00\x40\x0a\x3e\x08' \
    "peer closed the connection mid-frame (7 bytes of an incomplete frame pending)" drain
# RST when the server's Hello was already here, else FIN: the log says either way.
raw partial-reset '\x00\x00\x00\x40\x0a\x3e\x08' \
    "(7 bytes of an incomplete frame pending)" reset
raw silent '' "handshake not finished within 500 ms" reject

kill -0 "$client_pid" 2>/dev/null || fail "good client died while bad peers were served"
wait_exit "$client_pid" 10
[ "$exit_code" -eq 0 ] || fail "good client did not stay connected (exit $exit_code)"
hb=$(sed -n 's/^alive heartbeats=\([0-9]*\)$/\1/p' "$tmp/good.out")
[ "${hb:-0}" -ge 6 ] || fail "good client received only ${hb:-0} heartbeats in 5 s (about 10 expected)"
grep -qF "peer dead" "$tmp/srv.err" && fail "server declared a peer dead"

# Still serving new connections afterwards.
start_client again --hold-ms 0
wait_exit "$client_pid" 10
[ "$exit_code" -eq 0 ] || fail "new client refused after the bad peers"
stop_server
check_logs
echo "ok"
