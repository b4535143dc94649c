#!/usr/bin/env bash
# tandemctl/tests/tandemctl.sh — tandemctl against a fake admin API
# (fake_admin.py): tables and --json, odd JSON, status sorted and a dead
# rank's empty load, DEP groups (the DEP column and the groups' table), prefix
# caches (the CACHE column, `cache`, `cache flush`), node commands and their request bodies, 401 / 404 /
# unreachable / timeout / invalid JSON, the hint for the API port, usage
# errors and help, and the defaults taken from the environment and the
# local-cluster state directory.  Usage: tandemctl.sh TANDEMCTL FAKE_ADMIN_PY
set -u
ctl=$1 fake=$2
tmp=$(mktemp -d)
fake_pid=
cleanup() { [ -n "$fake_pid" ] && kill "$fake_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

unset TANDEM_ROUTER TANDEM_ADMIN_KEY_FILE
export TANDEM_LOCAL_DIR=$tmp/none
key=k-$RANDOM$RANDOM
echo "$key" >"$tmp/admin.key"
echo "wrong" >"$tmp/wrong.key"
: >"$tmp/log"

routes() { cat >"$tmp/routes.json"; }
rank() { # rank ROLE RANK STATE RUNNING QUEUED KV_USED KV_FREE INFLIGHT — routerd's rank json
  printf '{"rank": %s, "role": "%s", "state": "%s", "incarnation": "00000000000000aa",
    "engine": "synthetic", "inflight": %s, "load": {"running": %s, "queued": %s,
    "queued_tokens": 0}, "kv": {"blocks_used": %s, "blocks_free": %s, "tokens_used": 0,
    "tokens_free": 0}}' "$2" "$1" "$3" "$8" "$4" "$5" "$6" "$7"
}
routes <<J
{"GET /admin/status": [200, {"router_id": "r0", "requests_in_flight": 7,
   "queue": {"length": 3, "max": 1024, "timeout_ms": 30000, "oldest_ms": 120, "waited": 17,
             "mean_wait_ms": 45}, "nodes": [
   {"node": "n0", "draining": false, "removing": false, "ranks": [
     $(rank prefill 0 up 1 2 0 0 3), $(rank prefill 1 up 0 0 0 0 0)]},
   {"node": "n1", "draining": true, "removing": false, "ranks": [
     $(rank decode 0 up 4 0 120 904 4)]}]}],
 "GET /admin/requests": [200, {"requests": [
   {"id": "00000000000000a7", "openai_id": "chatcmpl-x", "state": "decoding", "kind": "chat",
    "stream": true, "prefill": {"node": "n0", "rank": 0}, "decode": {"node": "n1", "rank": 0},
    "prompt_tokens": 12, "completion_tokens": 5, "max_tokens": 16, "attempts": 1,
    "age_ms": 250},
   {"id": "00000000000000a8", "state": "admitting", "kind": "completion", "prefill": null,
    "decode": null, "prompt_tokens": 3, "completion_tokens": 0, "max_tokens": 8,
    "age_ms": 1}]}],
 "GET /admin/config": [200, {"config": {"http-listen": "127.0.0.1:0", "log-level": "info",
    "secret-file": "(redacted)"}}],
 "POST /admin/drain": [200, {"node": "n1", "status": "draining"}],
 "POST /admin/undrain": [404, {"error": {"message": "No node named 'nope' has registered.",
    "type": "invalid_request_error", "param": "node", "code": "node_not_found"}}],
 "POST /admin/remove": [200, {}],
 "POST /admin/cancel": [200, {"id": "00000000000000a7", "status": "canceled"}]}
J

python3 "$fake" "$tmp/port" "$tmp/routes.json" "$key" "$tmp/log" &
fake_pid=$!
for _ in $(seq 100); do [ -f "$tmp/port" ] && break; sleep 0.05; done
[ -f "$tmp/port" ] || { echo "fake admin server did not start" >&2; exit 1; }
url=http://127.0.0.1:$(cat "$tmp/port")

# run WANT_RC ARGS... — tandemctl with the fake's url and key; output in $tmp/out, $tmp/err
run() {
  local want=$1; shift
  timeout 20 "$ctl" --router "$url" --admin-key-file "$tmp/admin.key" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [ "$rc" = "$want" ] || fail "tandemctl $*: exit $rc, want $want; stderr: $(cat "$tmp/err")"
}
has() { grep -qE -- "$2" "$tmp/$1" || fail "$1 of the last command lacks /$2/: $(cat "$tmp/$1")"; }
hasnt() { ! grep -qE -- "$2" "$tmp/$1" || fail "$1 of the last command has /$2/: $(cat "$tmp/$1")"; }

# status: a table, one line per rank, node fields repeated; no warnings
run 0 status
has out '^NODE +NODE-STATE +ROLE +RANK +STATE +RUNNING +QUEUED +KV-USED +KV-FREE +IN-FLIGHT$'
has out '^n0 +active +prefill +0 +up +1 +2 +0 +0 +3$'
has out '^n0 +active +prefill +1 +up +0 +0 +0 +0 +0$'
has out '^n1 +draining +decode +0 +up +4 +0 +120 +904 +4$'
has out '^2 nodes, 3 ranks, 7 requests in flight$'
has out '^queue: 3 waiting \(max 1024\), longest wait 120 ms; mean wait 45 ms over 17 waits$'
[ -s "$tmp/err" ] && fail "status wrote to stderr: $(cat "$tmp/err")"
grep -q "^GET /admin/status" "$tmp/log" || fail "the fake saw no GET /admin/status"

# --json: the router's answer, parseable
run 0 status --json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["nodes"][1]["ranks"][0]["kv"]["blocks_free"]==904' \
  "$tmp/out" || fail "status --json is not the router's json"

run 0 requests
has out '^ID +STATE +KIND +PREFILL +DECODE +PROMPT +GENERATED +MAX +AGE-MS$'
has out '^00000000000000a7 +decoding +chat +n0/0 +n1/0 +12 +5 +16 +250$'
has out '^00000000000000a8 +admitting +completion +- +- +3 +0 +8 +1$'
has out '^2 requests in flight$'
[ -s "$tmp/err" ] && fail "requests wrote to stderr: $(cat "$tmp/err")"

run 0 config
has out '^http-listen = 127.0.0.1:0$'
has out '^log-level = info$'
has out '^secret-file = \(redacted\)$'

# node commands: the body sent, the line printed
: >"$tmp/log"
run 0 drain n1
has out '^node n1: draining$'
grep -qxF 'POST /admin/drain {"node":"n1"}' "$tmp/log" || fail "drain sent: $(cat "$tmp/log")"
run 0 remove n1
has out '^node n1: removing$'
run 0 cancel 00000000000000a7
has out '^request 00000000000000a7: canceled$'
grep -qxF 'POST /admin/cancel {"id":"00000000000000a7"}' "$tmp/log" || fail "cancel sent: $(cat "$tmp/log")"
run 0 drain n1 --json
python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["status"]=="draining"' "$tmp/out" ||
  fail "drain --json"

# errors: 404 with the router's message, 401, unreachable, timeout, bad json
run 1 undrain nope
has err "undrain node nope: No node named 'nope' has registered. \\(HTTP 404\\)"
[ -s "$tmp/out" ] && fail "a failed undrain printed on stdout"
timeout 20 "$ctl" --router "$url" --admin-key-file "$tmp/wrong.key" status >"$tmp/out" 2>"$tmp/err"
[ $? = 1 ] || fail "wrong admin key: exit status"
has err 'refused the admin key \(HTTP 401\)'
closed=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
timeout 20 "$ctl" --router "http://127.0.0.1:$closed" --admin-key-file "$tmp/admin.key" status \
  >"$tmp/out" 2>"$tmp/err"
[ $? = 1 ] || fail "unreachable router: exit status"
has err "router http://127.0.0.1:$closed is unreachable"
routes <<'J'
{"GET /admin/status": [200, {"nodes": []}, 3],
 "GET /admin/requests": [200, "{\"requests\": [1, 2"],
 "GET /admin/config": [500, "internal\nerror"]}
J
start=$(date +%s%N)
run 1 status --timeout 300ms
has err 'did not answer within 300 ms'
[ $(( ($(date +%s%N) - start) / 1000000 )) -lt 2500 ] || fail "--timeout 300ms took too long"
run 1 requests
has err 'requests: router answered with invalid json'
run 1 config
has err 'config: internal error \(HTTP 500\)'

# ready: no admin key needed; 503 with the router's reason, 200; waiting
routes <<'J'
{"GET /ready": [503, {"status": "not ready", "ready": false, "reason": "no decode rank up"}]}
J
timeout 20 "$ctl" --router "$url" --admin-key-file "$tmp/no-such.key" ready >"$tmp/out" 2>"$tmp/err"
[ $? = 1 ] || fail "ready on a router that is not: exit status"
has err 'not ready: no decode rank up'
start=$(date +%s%N)
timeout 20 "$ctl" --router "$url" ready 2 >"$tmp/out" 2>"$tmp/err"
[ $? = 1 ] || fail "ready 2 on a router that is not: exit status"
[ $(( ($(date +%s%N) - start) / 1000000 )) -ge 1900 ] || fail "ready 2 did not wait 2 s"
routes <<'J'
{"GET /ready": [200, {"status": "ready", "ready": true, "reason": null}]}
J
timeout 20 "$ctl" --router "$url" ready 5 >"$tmp/out" 2>"$tmp/err" || fail "ready: $(cat "$tmp/err")"
has out '^ready$'
timeout 20 "$ctl" --router "http://127.0.0.1:$closed" ready >"$tmp/out" 2>"$tmp/err"
[ $? = 1 ] || fail "ready on an unreachable router: exit status"
has err "router http://127.0.0.1:$closed: unreachable"

# odd json: "?" and a warning per odd field, never a crash
routes <<'J'
{"GET /admin/status": [200, {"nodes": [
   {"node": "n0", "ranks": [{"role": "decode", "rank": "zero", "state": ["x"], "inflight": 0,
     "load": {"running": null, "queued": 1.5}, "kv": {"blocks_used": true, "blocks_free": {}}}]},
   {"node": 7, "draining": false, "removing": false, "ranks": 5}, "junk",
   {"draining": true, "removing": false, "ranks": [7, {"load": 3}]}]}],
 "GET /admin/requests": [200, {"requests": {"not": "a list"}}],
 "GET /admin/config": [200, [1, 2]]}
J
run 0 status
has out '^n0 +\? +decode +zero +\? +- +1.5 +yes +\? +0$'
has out '^\? +\? +\? +\? +\? +\? +\? +\? +\? +\?$'
has out '^\? +draining +\? +\? +\? +\? +\? +\? +\? +\?$'
has out '^4 nodes, 3 ranks, \? requests in flight$'
hasnt out '^queue:'
has err 'warning: status: node #0: fields "draining" and "removing" should be booleans'
has err 'warning: status: node #0 rank #0: column STATE: field "state" has the wrong type'
has err 'warning: status: node #0 rank #0: column KV-FREE: field "kv.blocks_free" has the wrong type'
has err 'warning: status: node #1: field "ranks" is not an array'
has err 'warning: status: node #3 rank #0: not an object'
hasnt err 'node #3 rank #0: column'
has err 'warning: status: node #3 rank #1: column RUNNING: field "load.running" missing'
has err 'warning: status: field "requests_in_flight" missing'
run 0 requests
has err 'warning: requests: field "requests" is not an array'
has out '^0 requests in flight$'
run 0 config
routes <<'J'
{"GET /admin/status": [200, {"nodes": []}]}
J

# status sorts: node name (natural order), role, rank id; a dead rank shows no load
routes <<J
{"GET /admin/status": [200, {"requests_in_flight": 0, "nodes": [
   {"node": "n10", "draining": false, "removing": false, "ranks": [$(rank decode 0 up 0 0 0 5 0)]},
   {"node": "n2", "draining": false, "removing": false, "ranks": [
     $(rank prefill 1 up 0 0 0 0 0), $(rank decode 1 up 0 0 0 5 0), $(rank prefill 0 up 0 0 0 0 0),
     $(rank decode 0 up 1 0 3 2 1)]},
   {"node": "m", "draining": false, "removing": false, "ranks": [
     {"rank": 0, "role": "decode", "state": "dead", "incarnation": "00000000000000bb",
      "engine": "synthetic", "inflight": 0, "load": null, "kv": null}]}]}]}
J
run 0 status
grep -E '^(m|n2|n10) ' "$tmp/out" | awk '{print $1, $3, $4}' >"$tmp/order"
printf '%s\n' "m decode 0" "n2 decode 0" "n2 decode 1" "n2 prefill 0" "n2 prefill 1" \
  "n10 decode 0" | diff - "$tmp/order" >/dev/null || fail "status not sorted: $(cat "$tmp/out")"
has out '^m +active +decode +0 +dead +- +- +- +- +0$'
[ -s "$tmp/err" ] && fail "a dead rank's null load warned: $(cat "$tmp/err")"

# quarantined blocks (docs/decoded.md, "Fencing"): a QUARANTINED column once
# some decode rank has any
routes <<'J'
{"GET /admin/status": [200, {"requests_in_flight": 0, "nodes": [
   {"node": "d", "draining": false, "removing": false, "ranks": [
     {"rank": 0, "role": "decode", "state": "up", "incarnation": "00000000000000aa",
      "engine": "synthetic", "inflight": 0, "load": {"running": 0, "queued": 0,
      "queued_tokens": 0}, "kv": {"blocks_used": 9, "blocks_free": 5, "tokens_used": 0,
      "tokens_free": 0, "blocks_quarantined": 7}},
     {"rank": 1, "role": "decode", "state": "up", "incarnation": "00000000000000aa",
      "engine": "synthetic", "inflight": 0, "load": {"running": 0, "queued": 0,
      "queued_tokens": 0}, "kv": {"blocks_used": 0, "blocks_free": 5, "tokens_used": 0,
      "tokens_free": 0, "blocks_quarantined": 0}}]}]}]}
J
run 0 status
has out '^NODE +NODE-STATE +ROLE +RANK +STATE +RUNNING +QUEUED +KV-USED +KV-FREE +QUARANTINED +IN-FLIGHT$'
has out '^d +active +decode +0 +up +0 +0 +9 +5 +7 +0$'
has out '^d +active +decode +1 +up +0 +0 +0 +5 +0 +0$'

# DEP groups: a DEP column (DOMAIN:RANK/SIZE) on their ranks, "-" on the others,
# and a table of the groups: state, nodes with their ranks in the group, passes,
# rows. A rank with no group name (an older router's "dep") has no DEP cell.
deprank() { # deprank ROLE RANK STATE DOMAIN DRANK SIZE PASSES ROWS — a DEP group's rank json
  printf '{"rank": %s, "role": "%s", "state": "%s", "inflight": 0, "load": {"running": 0,
    "queued": 0}, "kv": {"blocks_used": 0, "blocks_free": 9}, "dep": {"domain": "%s",
    "size": %s, "rank": %s, "passes": %s, "expert_tokens": %s}}' "$2" "$1" "$3" "$4" "$6" "$5" "$7" "$8"
}
routes <<J
{"GET /admin/status": [200, {"requests_in_flight": 0, "nodes": [
   {"node": "d10", "draining": false, "removing": false, "ranks": [
     $(deprank decode 1 up d0 3 4 12 '[0, 0, 5, 6]'), $(deprank decode 0 up d0 2 4 12 '[0, 1, 5, 6]')]},
   {"node": "d2", "draining": false, "removing": false, "ranks": [
     $(deprank decode 0 up d0 0 4 11 '[7, 1, 0, 0]'),
     {"rank": 1, "role": "decode", "state": "dead", "inflight": 0, "load": null, "kv": null,
      "dep": {"domain": "d0", "size": 4, "rank": 1, "passes": null, "expert_tokens": null}}]},
   {"node": "p0", "draining": false, "removing": false, "ranks": [
     $(deprank prefill 0 up p0 0 2 40 '[3, 3]'), $(deprank prefill 1 up p0 1 2 40 '[0, 3]')]},
   {"node": "x", "draining": false, "removing": false, "ranks": [
     $(deprank decode 0 up e1 0 8 5 '[]'), $(deprank decode 1 draining e1 2 8 5 '[]')]},
   {"node": "old", "draining": false, "removing": false, "ranks": [
     {"rank": 0, "role": "decode", "state": "up", "inflight": 0, "load": {"running": 0,
      "queued": 0}, "kv": {"blocks_used": 0, "blocks_free": 9},
      "dep": {"passes": 3, "expert_tokens": [1]}}]},
   {"node": "n", "draining": false, "removing": false, "ranks": [$(rank decode 0 up 0 0 0 5 0)]}]}]}
J
run 0 status
has out '^NODE +NODE-STATE +ROLE +RANK +STATE +RUNNING +QUEUED +KV-USED +KV-FREE +IN-FLIGHT +DEP$'
has out '^d2 +active +decode +0 +up +0 +0 +0 +9 +0 +d0:0/4$'
has out '^d2 +active +decode +1 +dead +- +- +- +- +0 +d0:1/4$'
has out '^d10 +active +decode +1 +up +0 +0 +0 +9 +0 +d0:3/4$'
has out '^p0 +active +prefill +1 +up +0 +0 +0 +9 +0 +p0:1/2$'
has out '^n +active +decode +0 +up +0 +0 +0 +5 +0 +-$'
has out '^old +active +decode +0 +up +0 +0 +0 +9 +0 +-$'
has out '^6 nodes, 10 ranks, 0 requests in flight$'
has out '^DEP-GROUP +ROLE +SIZE +STATE +NODES +PASSES +EXPERT-ROWS$'
has out '^d0 +decode +4 +3 up, 1 dead +d2\[0-1\],d10\[2-3\] +11\.\.12 +31$'
has out '^e1 +decode +8 +1 up, 1 draining, 6 missing +x\[0,2\] +5 +-$'
has out '^p0 +prefill +2 +up +p0\[0-1\] +40 +9$'
grep -A9 '^DEP-GROUP' "$tmp/out" | awk '{print $1}' | tr '\n' ' ' | grep -qx 'DEP-GROUP d0 e1 p0 ' ||
  fail "dep groups not sorted by name: $(cat "$tmp/out")"
[ -s "$tmp/err" ] && fail "status of dep groups wrote to stderr: $(cat "$tmp/err")"
run 0 status --json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["nodes"][0]["ranks"][0]["dep"]["domain"]=="d0"' \
  "$tmp/out" || fail "status --json lacks the dep group"
# odd dep fields: "?" and a warning, never a crash
routes <<'J'
{"GET /admin/status": [200, {"requests_in_flight": 0, "nodes": [
   {"node": "n", "draining": false, "removing": false, "ranks": [
     {"rank": 0, "role": "decode", "state": "up", "inflight": 0, "load": null, "kv": null,
      "dep": {"domain": "d", "size": "two", "passes": [], "expert_tokens": 4}},
     {"rank": 1, "role": "decode", "state": "up", "inflight": 0, "load": null, "kv": null,
      "dep": {"domain": 5}}]}]}]}
J
run 0 status
has out '^n +active +decode +0 +up +- +- +- +- +0 +d:\?/two$'
has out '^n +active +decode +1 +up +- +- +- +- +0 +-$'
has out '^d +decode +two +1 up +n\[\] +- +-$'
has err 'warning: status: node #0 rank #0: column DEP: field "rank" missing'
has err 'warning: status: node #0 rank #1: field "dep.domain" has the wrong type'

# prefix caches: the CACHE column (only when some prefill rank has one), `cache`,
# `cache flush NODE` and its body, an unknown node's 404, usage errors
routes <<'J'
{"GET /admin/status": [200, {"requests_in_flight": 0, "nodes": [
   {"node": "p", "draining": false, "removing": false, "ranks": [
     {"rank": 0, "role": "prefill", "state": "up", "inflight": 1,
      "load": {"running": 0, "queued": 0, "queued_tokens": 0}, "kv": null,
      "cache": {"block_tokens": 64, "blocks_tracked": 12, "placed": 9, "prompt_tokens": 900,
        "predicted_cached_tokens": 512, "reported_cached_tokens": 448, "placed_by_cache": 3,
        "stats": {"pool_blocks": 3, "pool_bytes": 12897485, "host_bytes": 41943040,
          "host_budget": 1073741824, "ssd_bytes": 1288490189, "ssd_budget": 0,
          "lookup_tokens": 100, "hit_pool_tokens": 40, "hit_host_tokens": 10,
          "hit_ssd_tokens": 6, "computed_tokens": 44, "replay_tokens": 0}}},
     {"rank": 1, "role": "prefill", "state": "joining", "inflight": 0, "load": null,
      "kv": null, "cache": {"block_tokens": 64, "blocks_tracked": 0, "placed": 0,
        "prompt_tokens": 0, "predicted_cached_tokens": 0, "reported_cached_tokens": 0,
        "placed_by_cache": 0, "stats": null}},
     {"rank": 2, "role": "prefill", "state": "up", "inflight": 0, "load": null, "kv": null,
      "cache": null}]},
   {"node": "d", "draining": false, "removing": false, "ranks": [
     {"rank": 0, "role": "decode", "state": "up", "inflight": 0, "load": null, "kv": null}]}]}],
 "POST /admin/cache/flush": [200, {"node": "p", "status": "flushing", "ranks": 2}]}
J
run 0 status
has out '^NODE +NODE-STATE +ROLE +RANK +STATE +RUNNING +QUEUED +KV-USED +KV-FREE +IN-FLIGHT +CACHE$'
has out '^p +active +prefill +0 +up +0 +0 +- +- +1 +12.3 MiB pool / 40 MiB host / 1.2 GiB ssd, hit 56%$'
has out '^p +active +prefill +1 +joining +- +- +- +- +0 +no report yet$'
has out '^p +active +prefill +2 +up +- +- +- +- +0 +-$'
has out '^d +active +decode +0 +up +- +- +- +- +0 +-$'
[ -s "$tmp/err" ] && fail "status with caches wrote to stderr: $(cat "$tmp/err")"
run 0 cache
has out '^NODE +RANK +STATE +BLOCK +TRACKED +CACHE +PLACED +BY-CACHE +PROMPT-TOK +EXPECTED +REPORTED$'
has out '^p +0 +up +64 +12 +12.3 MiB pool / 40 MiB host / 1.2 GiB ssd, hit 56% +9 +3 +900 +512 +448$'
has out '^p +1 +joining +64 +0 +no report yet +0 +0 +0 +0 +0$'
hasnt out '^p +2 '
[ -s "$tmp/err" ] && fail "cache wrote to stderr: $(cat "$tmp/err")"
run 0 cache status
has out '^p +0 +up +64 +12 '
: >"$tmp/log"
run 0 cache flush p
has out '^node p: flushing$'
grep -qxF 'POST /admin/cache/flush {"node":"p"}' "$tmp/log" || fail "cache flush sent: $(cat "$tmp/log")"
run 0 cache flush p --json
python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["ranks"]==2' "$tmp/out" ||
  fail "cache flush --json"
run 1 cache flush
has err 'usage: tandemctl cache \[status \| flush NODE\]'
run 1 cache clear p
has err 'usage: tandemctl cache'
run 2 cache flush p q   # more arguments than any form takes: a usage error of main
run 0 cache --help
has out 'cache flush NODE'
routes <<'J'
{"POST /admin/cache/flush": [404, {"error": {"message": "No node named 'nope' has registered.",
   "type": "invalid_request_error", "param": "node", "code": "node_not_found"}}]}
J
run 1 cache flush nope
has err "flush the cache of node nope: No node named 'nope' has registered. \\(HTTP 404\\)"

# --router at routerd's API port: a hint. Its /health says so (the key is refused
# or /admin is not routed there); an older routerd's "Invalid URL" 404 says it too.
routes <<'J'
{"GET /health": [200, {"status": "ok", "listener": "api", "ready": true}]}
J
run 1 status
has err 'hint: http://127.0.0.1:[0-9]+ is routerd.s OpenAI API listener \(http-listen\); --router wants its admin API listener'
timeout 20 "$ctl" --router "$url" --admin-key-file "$tmp/wrong.key" drain n1 >"$tmp/out" 2>"$tmp/err"
[ $? = 1 ] || fail "wrong port, wrong key: exit status"
has err 'refused the admin key \(HTTP 401\)'
has err 'hint: .* is routerd.s OpenAI API listener'
routes <<'J'
{"GET /admin/status": [404, {"error": {"message": "Invalid URL (GET /admin/status)",
   "type": "invalid_request_error", "param": null, "code": null}}]}
J
run 1 status
has err 'hint: .* is routerd.s OpenAI API listener'
# the admin port: a 404 for an unknown node gets no hint
routes <<'J'
{"GET /health": [200, {"status": "ok", "listener": "admin", "ready": true}],
 "POST /admin/undrain": [404, {"error": {"message": "No node named 'nope' has registered.",
    "type": "invalid_request_error", "param": "node", "code": "node_not_found"}}]}
J
run 1 undrain nope
has err "No node named 'nope' has registered"
hasnt err 'hint'
routes <<'J'
{"GET /admin/status": [200, {"nodes": []}]}
J

# usage errors: exit 2, nothing sent
: >"$tmp/log"
run 2 frobnicate
has err 'unknown command "frobnicate"'
run 2 drain
has err 'usage: tandemctl drain NODE'
run 2 status extra
run 2 --timeout 0 status
[ -s "$tmp/log" ] && fail "a usage error reached the router"
"$ctl" --help >"$tmp/out" || fail "--help: exit status"
has out '^  drain +NODE +stop sending'
has out '^  help +\[CMD\] '
has out '--admin-key-file'
# help: global, per command (CMD --help, help CMD), nothing sent
"$ctl" help >"$tmp/out" 2>"$tmp/err" || fail "help: exit status"
has out '^usage: tandemctl \[options\] COMMAND'
for args in "drain --help" "help drain" "--router $url drain n1 -h"; do
  # shellcheck disable=SC2086 # split on purpose
  "$ctl" $args >"$tmp/out" 2>"$tmp/err" || fail "$args: exit status"
  has out '^usage: tandemctl \[options\] drain NODE$'
  has out '^stop sending new requests'
  hasnt out '^commands:'
done
"$ctl" remove --help >"$tmp/out" || fail "remove --help: exit status"
has out 'registers again, as a'
"$ctl" help nope >"$tmp/out" 2>"$tmp/err"
[ $? = 2 ] || fail "help of an unknown command: exit status"
has err 'unknown command "nope"'
"$ctl" help drain undrain >"$tmp/out" 2>"$tmp/err"
[ $? = 2 ] || fail "help with two commands: exit status"
[ -s "$tmp/log" ] && fail "help reached the router: $(cat "$tmp/log")"

# defaults: the environment, then the local-cluster state directory
TANDEM_ROUTER=$url TANDEM_ADMIN_KEY_FILE=$tmp/admin.key "$ctl" status >"$tmp/out" 2>"$tmp/err" ||
  fail "status from the environment: $(cat "$tmp/err")"
has out '^0 nodes, 0 ranks, \? requests in flight$'
mkdir -p "$tmp/lc"
echo "127.0.0.1:$(cat "$tmp/port")" >"$tmp/lc/admin.url"
cp "$tmp/admin.key" "$tmp/lc/admin.key"
TANDEM_LOCAL_DIR=$tmp/lc "$ctl" status >"$tmp/out" 2>"$tmp/err" ||
  fail "status from the local-cluster state: $(cat "$tmp/err")"
# no key anywhere (the system directory pointed at an empty one)
TANDEM_ETC_DIR=$tmp/no-etc "$ctl" status >"$tmp/out" 2>"$tmp/err"
[ $? = 1 ] || fail "no admin key given: exit status"
has err 'no admin key: give --admin-key-file FILE'
# the system directory's key is the last default
mkdir -p "$tmp/etc"
cp "$tmp/admin.key" "$tmp/etc/admin.key"
TANDEM_ETC_DIR=$tmp/etc TANDEM_ROUTER=$url "$ctl" status >"$tmp/out" 2>"$tmp/err" ||
  fail "status with the key from \$TANDEM_ETC_DIR: $(cat "$tmp/err")"

if [ $fails -ne 0 ]; then echo "tandemctl tests: $fails failure(s)" >&2; exit 1; fi
echo "tandemctl tests: all passed"
