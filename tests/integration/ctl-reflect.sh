#!/usr/bin/env bash
# tests/integration/ctl-reflect.sh — reflection attack on a real server: a raw
# socket echoes every byte the server sends (its Hello, and its HelloAuth were
# it to send one) back to it. The server must refuse with a reason in its log
# and in the Reject, never authenticate, and keep serving real clients.
. "$(dirname "$0")/ctl-lib.sh"

start_server srv
exec 3<>"/dev/tcp/127.0.0.1/$server_port" || fail "cannot connect"
timeout 5 tee "$tmp/reflect.raw" <&3 >&3 2>/dev/null
[ $? -eq 124 ] && fail "server did not close the reflecting socket within 5 s"
exec 3<&- 3>&-
reason="handshake refused: peer nonce equals ours (our own hello reflected)"
wait_grep "$tmp/srv.err" "$reason" 5 || fail "server did not log \"$reason\""
grep -aqF "peer nonce equals ours" "$tmp/reflect.raw" || fail "no Reject with the reason"
grep -qF "established" "$tmp/srv.err" && fail "server authenticated its own reflection"

start_client after --hold-ms 0
wait_exit "$client_pid" 10
[ "$exit_code" -eq 0 ] || fail "client refused after the reflection attempt"
stop_server
check_logs
echo "ok"
