#!/usr/bin/env bash
# deploy/tests/local-cluster.sh — deploy/local-cluster's logic with stand-in
# daemons (fake-daemon, the fake admin API) and the real tandemctl: a missing
# binary, up (keys, ports from the ready line, registration wait, what it
# prints), refusing a second up, status, the ports and command lines recorded,
# restart of routerd (same ports, workers untouched) and of a worker, a
# decode domain over 2 decoded (--decode-domain: the domain flags, restart of
# one member restarts both; --decode-domain-dir: the directory's), down
# stopping exactly its own processes (SIGKILL for one that ignores SIGTERM;
# an unrelated process and a recycled pid untouched), a second up on the
# recorded ports (or free ones when those are taken), a registration timeout
# cleaning up.
# Usage: local-cluster.sh TANDEMCTL FAKE_ADMIN_PY
set -u
ctl=$(realpath "$1")
export FAKE_ADMIN=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
lc=$here/../local-cluster
tmp=$(mktemp -d)
bystander='' holder=''
cleanup() {
  TANDEM_STOP_TIMEOUT=1 "$lc" down >/dev/null 2>&1
  [ -n "$bystander" ] && kill "$bystander" 2>/dev/null
  [ -n "$holder" ] && kill "$holder" 2>/dev/null
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
    {"nodes": [{"node": "x", "ranks": [{"rank": i, "state": "up"} for i in range(n)]}]}]}))' \
    "$1" >"$FAKE_ROUTES"
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
has out "routerd ports: http=127.0.0.1:$port ctl=127.0.0.1:9 admin=127.0.0.1:$port"

# the ports and every command line are recorded
printf 'http=127.0.0.1:%s\nctl=127.0.0.1:9\nadmin=127.0.0.1:%s\n' "$port" "$port" |
  cmp -s - "$tmp/state/ports" || fail "ports file: $(cat "$tmp/state/ports")"
for n in routerd prefill0 decode0 decode1; do
  [ -s "$tmp/state/cmd/$n" ] || fail "no command line recorded for $n"
done
rec() { awk -v n="$1" '$3 == n {print $1}' "$tmp/state/pids"; }

# restart routerd: a new process on the same ports, the workers untouched
old_router=$(rec routerd)
workers=$(grep -v ' routerd$' "$tmp/state/pids")
"$lc" restart routerd >"$tmp/out" 2>"$tmp/err" || fail "restart routerd: $(cat "$tmp/err")"
has out "routerd restarted \(pid [0-9]+\)"
new_router=$(rec routerd)
[ -n "$new_router" ] && [ "$new_router" != "$old_router" ] || fail "routerd's record after restart: $new_router"
alive "$new_router" || fail "the restarted routerd is not running"
alive "$old_router" && fail "the old routerd still runs"
[ "$(cat "$FAKE_DIR/port")" = "$port" ] || fail "routerd came back on port $(cat "$FAKE_DIR/port"), not $port"
tail -n 1 "$FAKE_DIR/args-routerd" |
  grep -q -- "--http-listen 127.0.0.1:$port --ctl-listen 127.0.0.1:9 --admin-listen 127.0.0.1:$port$" ||
  fail "restarted routerd's args: $(tail -n 1 "$FAKE_DIR/args-routerd")"
[ "$(grep -v ' routerd$' "$tmp/state/pids")" = "$workers" ] || fail "restart routerd changed the workers"
[ -s "$tmp/state/logs/routerd.log.1" ] || fail "the first routerd's log was not kept"
"$ctl" status >"$tmp/out" 2>"$tmp/err" || fail "tandemctl after restart: $(cat "$tmp/err")"
pids=$(cut -d' ' -f1 "$tmp/state/pids")

# restart a worker: the same arguments again, only it replaced
old_dec=$(rec decode0)
"$lc" restart decode0 >"$tmp/out" 2>"$tmp/err" || fail "restart decode0: $(cat "$tmp/err")"
has out "decode0 restarted"
[ "$(rec decode0)" != "$old_dec" ] && alive "$(rec decode0)" || fail "decode0 not restarted"
alive "$old_dec" && fail "the old decode0 still runs"
[ "$(grep -c -- '--node-id decode0 ' "$FAKE_DIR/args-decoded")" = 2 ] || fail "decode0 args: $(cat "$FAKE_DIR/args-decoded")"
[ "$(grep -- '--node-id decode0 ' "$FAKE_DIR/args-decoded" | sort -u | wc -l)" = 1 ] ||
  fail "decode0 restarted with other arguments"
[ "$(rec routerd)" = "$new_router" ] || fail "restart decode0 touched routerd"
pids=$(cut -d' ' -f1 "$tmp/state/pids")
# an unknown name, no name
"$lc" restart decode7 >"$tmp/out" 2>"$tmp/err"
[ $? = 2 ] || fail "restart of an unknown daemon: exit status"
has err 'no daemon named "decode7"'
"$lc" restart >"$tmp/out" 2>"$tmp/err"
[ $? = 2 ] || fail "restart without a name: exit status"
"$lc" status >"$tmp/out" || fail "status after the restarts: $(cat "$tmp/out")"
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

# up again: routerd on the recorded ports
"$lc" up --decode 2 --decode-ranks 2 >"$tmp/out" 2>"$tmp/err" || fail "up again: $(cat "$tmp/err")"
[ "$(cat "$tmp/state/admin.url")" = "http://127.0.0.1:$port" ] || fail "up again: admin.url $(cat "$tmp/state/admin.url")"
tail -n 1 "$FAKE_DIR/args-routerd" | grep -q -- "--http-listen 127.0.0.1:$port " ||
  fail "up again did not ask for the recorded ports: $(tail -n 1 "$FAKE_DIR/args-routerd")"
TANDEM_STOP_TIMEOUT=1 "$lc" down >/dev/null 2>&1
# ... unless another process holds them: then free ones, with a word about it
python3 -c 'import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(); time.sleep(60)' "$port" &
holder=$!
sleep 0.3
"$lc" up --decode 2 --decode-ranks 2 >"$tmp/out" 2>"$tmp/err" || fail "up with the ports taken: $(cat "$tmp/err")"
has err "routerd did not start on the recorded ports"
[ "$(cat "$tmp/state/admin.url")" != "http://127.0.0.1:$port" ] || fail "up with the ports taken kept them"
grep -q "^http=127.0.0.1:$(cat "$FAKE_DIR/port")$" "$tmp/state/ports" || fail "new ports not recorded"
kill "$holder" 2>/dev/null
TANDEM_STOP_TIMEOUT=1 "$lc" down >/dev/null 2>&1

# --prefill-dep / --decode-dep: the workers get --dep
status_with 4
"$lc" up --prefill-ranks 2 --prefill-dep --decode 1 --decode-ranks 2 --decode-dep >"$tmp/out" \
  2>"$tmp/err" || fail "up with dep groups: $(cat "$tmp/err")"
tail -n 1 "$FAKE_DIR/args-prefilld" | grep -q -- "--ranks 2 --dep" ||
  fail "prefilld args with --prefill-dep: $(tail -n 1 "$FAKE_DIR/args-prefilld")"
tail -n 1 "$FAKE_DIR/args-decoded" | grep -q -- "--ranks 2 --dep" ||
  fail "decoded args with --decode-dep: $(tail -n 1 "$FAKE_DIR/args-decoded")"
TANDEM_STOP_TIMEOUT=1 "$lc" down >/dev/null 2>&1
status_with 5
"$lc" up --decode 2 --decode-ranks 2 >/dev/null 2>&1 || fail "up without dep"
grep -q -- "--dep" <(tail -n 2 "$FAKE_DIR/args-decoded") && fail "--dep without --decode-dep"
TANDEM_STOP_TIMEOUT=1 "$lc" down >/dev/null 2>&1

# --decode-domain: the decoded's ranks form one domain (size M*R, rank0 i*R,
# the addresses through routerd: no --domain-dir); restart of a member
# restarts every member
status_with 7
"$lc" up --prefill-ranks 3 --prefill-dep --decode 2 --decode-ranks 2 --decode-domain >"$tmp/out" \
  2>"$tmp/err" || fail "up with a decode domain: $(cat "$tmp/err")"
has out "2 decoded x 2 ranks \(one dep domain of 4 ranks\)"
tail -n 1 "$FAKE_DIR/args-prefilld" | grep -q -- "--ranks 3 --dep$" ||
  fail "prefilld args with --prefill-dep: $(tail -n 1 "$FAKE_DIR/args-prefilld")"
for i in 0 1; do
  grep -q -- "--node-id decode$i --routers 127.0.0.1:9 --ranks 2 --dep --domain-size 4 --domain-rank0 $((2 * i)) --domain-id decode$" \
    <(tail -n 2 "$FAKE_DIR/args-decoded") || fail "decode$i args in a domain: $(tail -n 2 "$FAKE_DIR/args-decoded")"
done
[ -d "$tmp/state/domain" ] && fail "a domain directory without --decode-domain-dir"
old0=$(rec decode0) old1=$(rec decode1) oldp=$(rec prefill0) oldr=$(rec routerd)
kill -KILL "$old1"   # a member dies; the other would exit by itself, here it is stopped
"$lc" restart decode1 >"$tmp/out" 2>"$tmp/err" || fail "restart decode1 of the domain: $(cat "$tmp/err")"
has out "decode1 is in the decode domain: restarting decode0 decode1"
has out "decode0 restarted \(pid [0-9]+\)"
has out "decode1 restarted \(pid [0-9]+\)"
for n in decode0 decode1; do
  [ -n "$(rec $n)" ] && alive "$(rec $n)" || fail "$n not running after the domain's restart"
done
[ "$(rec decode0)" != "$old0" ] && [ "$(rec decode1)" != "$old1" ] || fail "the domain was not restarted whole"
alive "$old0" && fail "the old decode0 still runs"
[ "$(rec prefill0)" = "$oldp" ] && [ "$(rec routerd)" = "$oldr" ] || fail "the domain's restart touched others"
tail -n 2 "$FAKE_DIR/args-decoded" | grep -c -- "--domain-size 4" | grep -qx 2 ||
  fail "the domain restarted with other arguments: $(tail -n 2 "$FAKE_DIR/args-decoded")"
"$lc" restart prefill0 >"$tmp/out" 2>"$tmp/err" || fail "restart prefill0 beside a domain: $(cat "$tmp/err")"
grep -q "decode" "$tmp/out" && fail "restart prefill0 restarted decoded: $(cat "$tmp/out")"
"$lc" status >"$tmp/out" || fail "status after the domain's restart: $(cat "$tmp/out")"
has out "4 of 4 running"
TANDEM_STOP_TIMEOUT=1 "$lc" down >/dev/null 2>&1
# --decode-domain-dir: the same domain, the addresses through the state dir's domain/
status_with 7
"$lc" up --prefill-ranks 3 --prefill-dep --decode 2 --decode-ranks 2 --decode-domain-dir \
  >"$tmp/out" 2>"$tmp/err" || fail "up with a decode domain over a directory: $(cat "$tmp/err")"
for i in 0 1; do
  grep -q -- "--domain-size 4 --domain-rank0 $((2 * i)) --domain-dir $tmp/state/domain --domain-id decode$" \
    <(tail -n 2 "$FAKE_DIR/args-decoded") || fail "decode$i args in a domain over a directory: $(tail -n 2 "$FAKE_DIR/args-decoded")"
done
[ -d "$tmp/state/domain" ] || fail "no domain directory"
TANDEM_STOP_TIMEOUT=1 "$lc" down >/dev/null 2>&1
# without --decode-domain: no domain, restart of one decoded is that one
status_with 5
"$lc" up --decode 2 --decode-ranks 2 --decode-dep >/dev/null 2>&1 || fail "up with decode groups"
grep -q -- "--domain" <(tail -n 2 "$FAKE_DIR/args-decoded") && fail "--domain-* without --decode-domain"
old0=$(rec decode0)
"$lc" restart decode1 >"$tmp/out" 2>&1 || fail "restart decode1 of a group: $(cat "$tmp/out")"
[ "$(rec decode0)" = "$old0" ] || fail "restart decode1 without a domain restarted decode0"
TANDEM_STOP_TIMEOUT=1 "$lc" down >/dev/null 2>&1

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
