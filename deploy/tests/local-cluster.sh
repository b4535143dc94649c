#!/usr/bin/env bash
# deploy/tests/local-cluster.sh — deploy/local-cluster's logic with stand-in
# daemons (fake-daemon, the fake admin API) and the real tandemctl: a missing
# binary, up (keys, ports from the ready line, registration wait, what it
# prints), refusing a second up, status, down stopping exactly its own
# processes (SIGKILL for one that ignores SIGTERM; an unrelated process and a
# recycled pid untouched), a registration timeout cleaning up.
# Usage: local-cluster.sh TANDEMCTL FAKE_ADMIN_PY
set -u
ctl=$(realpath "$1")
export FAKE_ADMIN=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
lc=$here/../local-cluster
tmp=$(mktemp -d)
bystander=
cleanup() {
  TANDEM_STOP_TIMEOUT=1 "$lc" down >/dev/null 2>&1
  [ -n "$bystander" ] && kill "$bystander" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
has() { grep -qE -- "$2" "$tmp/$1" || fail "$1 lacks /$2/: $(cat "$tmp/$1")"; }

export FAKE_DIR=$tmp/fake FAKE_ROUTES=$tmp/routes.json
export TANDEM_LOCAL_DIR=$tmp/state TANDEM_BUILD_DIR=$tmp/build TANDEM_UP_TIMEOUT=5
mkdir -p "$FAKE_DIR" "$tmp"/build/{routerd,prefilld,decoded,tandemctl}
for d in routerd prefilld decoded; do ln -s "$here/fake-daemon" "$tmp/build/$d/$d"; done
ln -s "$ctl" "$tmp/build/tandemctl/tandemctl"
status_with() { # status_with N — the fake router reports N ranks
  python3 -c 'import json,sys; n=int(sys.argv[1]); print(json.dumps({"GET /admin/status": [200,
    {"nodes": [{"node": "x", "ranks": [{"rank": i} for i in range(n)]}]}]}))' "$1" >"$FAKE_ROUTES"
}
alive() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) && [ "$(echo "${s##*) }" | cut -d' ' -f1)" != Z ]; }

# a missing binary: a clear message, nothing started
TANDEM_BUILD_DIR=$tmp/nothing "$lc" up >"$tmp/out" 2>"$tmp/err"
[ $? = 1 ] || fail "up without binaries: exit status"
has err "routerd not found at $tmp/nothing/routerd/routerd"
[ -e "$tmp/state/pids" ] && fail "up without binaries recorded pids"

# up: 1 prefill group of 1 rank + 2 decode nodes of 2 ranks = 5 ranks
status_with 5
sleep 600 & bystander=$!
FAKE_STUBBORN=decode1 "$lc" up --prefill 1 --decode 2 --decode-ranks 2 >"$tmp/out" 2>"$tmp/err" ||
  fail "up: $(cat "$tmp/err")"
port=$(cat "$FAKE_DIR/port")
has out "API: +http://127.0.0.1:$port/v1"
has out "5 ranks registered"
has out "API key: +$tmp/state/api.keys"
has out "curl -s http://127.0.0.1:$port/v1/chat/completions"
for f in cluster.secret api.keys admin.key; do
  [ "$(stat -c %a "$tmp/state/$f")" = 600 ] || fail "$f is not mode 0600"
done
[ "$(cat "$tmp/state/admin.url")" = "http://127.0.0.1:$port" ] || fail "admin.url"
has out "admin API: +http://127.0.0.1:$port"
[ "$(wc -l <"$tmp/state/pids")" = 4 ] || fail "pids: $(cat "$tmp/state/pids")"
pids=$(cut -d' ' -f1 "$tmp/state/pids")
for p in $pids; do alive "$p" || fail "recorded pid $p is not running"; done
grep -q -- "--routers 127.0.0.1:9 --ranks 2" "$FAKE_DIR/args-decoded" || fail "decoded args"
grep -q -- "--secret-file $tmp/state/cluster.secret" "$FAKE_DIR/args-prefilld" || fail "prefilld args"
[ "$(wc -l <"$FAKE_DIR/args-decoded")" = 2 ] || fail "want 2 decoded started"
grep -q "^GET /admin/status" "$FAKE_DIR/admin.log" || fail "up never asked the router for its status"
# tandemctl finds the local cluster by itself
"$ctl" status >"$tmp/out" 2>"$tmp/err" || fail "tandemctl status on the local cluster: $(cat "$tmp/err")"
has out '^1 node, 5 ranks, '

# a second up is refused and changes nothing
"$lc" up >"$tmp/out" 2>"$tmp/err"
[ $? = 1 ] || fail "second up: exit status"
has err "already up"
[ "$(cut -d' ' -f1 "$tmp/state/pids")" = "$pids" ] || fail "second up changed the pids"

"$lc" status >"$tmp/out" || fail "status: exit status"
has out "4 of 4 running"

# down: SIGTERM, SIGKILL for the stubborn one, the bystander untouched
TANDEM_STOP_TIMEOUT=1 "$lc" down >"$tmp/out" 2>&1 || fail "down: exit status"
has out "decode1 \(pid [0-9]+\) ignored SIGTERM for 1s: SIGKILL"
sleep 0.2
for p in $pids; do alive "$p" && fail "pid $p still running after down"; done
alive "$bystander" || fail "down killed a process it did not start"
"$lc" down >"$tmp/out" 2>&1 || fail "second down: exit status"
has out "not up"

# a recycled pid (same pid, another start time) is not ours
echo "$bystander 1 decode0" >"$tmp/state/pids"
TANDEM_STOP_TIMEOUT=1 "$lc" down >/dev/null 2>&1
alive "$bystander" || fail "down killed a recycled pid"

# the router never sees every rank: up gives up, stops what it started
status_with 3
"$lc" up --decode 2 --decode-ranks 2 >"$tmp/out" 2>"$tmp/err"
[ $? = 1 ] || fail "up with missing ranks: exit status"
has err "the router sees 3 of 5 ranks after 5s"
[ -e "$tmp/state/pids" ] && fail "a failed up left its pids file"
sleep 0.2
pgrep -f "$FAKE_ADMIN.*$FAKE_DIR/port" >/dev/null && fail "a failed up left the router running"

if [ $fails -ne 0 ]; then echo "local-cluster tests: $fails failure(s)" >&2; exit 1; fi
echo "local-cluster tests: all passed"
