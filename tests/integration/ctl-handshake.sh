#!/usr/bin/env bash
# tests/integration/ctl-handshake.sh — the Hello exchange between two
# processes: accepted when everything matches; refused, with the reason in
# both processes' logs, for each single mismatch and for a client claiming the
# server's incarnation (what a node relayed to itself would see).
. "$(dirname "$0")/ctl-lib.sh"

start_server srv --secret s3cret --model deepseek-v4.1-flash@ab12 --layout 0x5eed \
    --incarnation 0x5e1f

start_client ok --secret s3cret --model deepseek-v4.1-flash@ab12 --layout 0x5eed --node ok
wait_exit "$client_pid" 10
[ "$exit_code" -eq 0 ] || fail "matching client refused (exit $exit_code)"
grep -qF "established" "$tmp/ok.out" || fail "matching client did not report established"
wait_grep "$tmp/srv.err" "tool ok/0" 5 || fail "server did not log the matching client"

check_refused() { # NAME CLIENT_REASON SERVER_REASON ARGS...
    local name=$1 reason=$2 sreason=$3; shift 3
    start_client "$name" --node "$name" "$@"
    wait_exit "$client_pid" 10
    [ "$exit_code" -eq 1 ] || fail "$name: client exit $exit_code, want 1"
    grep -qF "established" "$tmp/$name.out" && fail "$name: client was accepted"
    grep -qF "$reason" "$tmp/$name.out" || fail "$name: client did not report \"$reason\""
    grep -qF "$reason" "$tmp/$name.err" || fail "$name: client did not log \"$reason\""
    wait_grep "$tmp/srv.err" "$sreason" 5 || fail "$name: server did not log \"$sreason\""
}

check_refused version "protocol version differs (ours 3, peer 2)" \
    "protocol version differs (ours 2, peer 3)" \
    --version 3 --secret s3cret --model deepseek-v4.1-flash@ab12 --layout 0x5eed
check_refused secret "cluster secret proof failed" "cluster secret proof failed" \
    --secret wrong --model deepseek-v4.1-flash@ab12 --layout 0x5eed
check_refused model "model fingerprint differs (ours deepseek-v4.1-flash@cd34, peer deepseek-v4.1-flash@ab12)" \
    "model fingerprint differs (ours deepseek-v4.1-flash@ab12, peer deepseek-v4.1-flash@cd34)" \
    --secret s3cret --model deepseek-v4.1-flash@cd34 --layout 0x5eed
check_refused layout "kv layout hash differs (ours 0000000000005eee, peer 0000000000005eed)" \
    "kv layout hash differs (ours 0000000000005eed, peer 0000000000005eee)" \
    --secret s3cret --model deepseek-v4.1-flash@ab12 --layout 0x5eee
self="peer claims our own incarnation 0000000000005e1f: a connection to ourselves or a relay"
check_refused self "$self" "$self" \
    --secret s3cret --model deepseek-v4.1-flash@ab12 --layout 0x5eed --incarnation 0x5e1f
stop_server
check_logs
echo "ok"
