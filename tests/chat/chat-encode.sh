#!/usr/bin/env bash
# tests/chat/chat-encode.sh — the chat-encode tool end to end: prompts equal
# the fixture's (encode.json), --json, --parse against parse.json, and the exit
# codes and messages of bad input; --ids with a tiny checkpoint's tokenizer.
# usage: chat-encode.sh CHAT_ENCODE FIXTURE_DIR MK_TINY_MODEL
set -uo pipefail
tool=$1
dir=$2
mktiny=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then echo "ok: $name"; else echo "FAILED: $name"; fail=1; fi
}

# Prompts: every accepted fixture request, through a file and through stdin.
python3 - "$dir/encode.json" "$tmp" <<'PY'
import json, sys, os
cases = json.load(open(sys.argv[1], encoding="utf-8"))["cases"]
for i, c in enumerate(cases):
    if "prompt" in c:
        open(os.path.join(sys.argv[2], "req%d.json" % i), "w", encoding="utf-8").write(c["body"])
        open(os.path.join(sys.argv[2], "want%d.txt" % i), "wb").write(c["prompt"].encode())
PY
n=0; bad=0
for req in "$tmp"/req*.json; do
  i=${req##*/req}; i=${i%.json}
  "$tool" "$req" > "$tmp/got.txt" || bad=$((bad + 1))
  cmp -s "$tmp/got.txt" "$tmp/want$i.txt" || { echo "prompt $i differs"; bad=$((bad + 1)); }
  n=$((n + 1))
done
check "$n prompts equal the fixture" test "$bad" -eq 0 -a "$n" -gt 30
"$tool" < "$tmp/req0.json" > "$tmp/stdin.txt"
check "standard input" cmp -s "$tmp/stdin.txt" "$tmp/want0.txt"

# --json: the prompt and its special-token ranges.
"$tool" --json "$tmp/req0.json" > "$tmp/out.json"
check "--json" python3 -c '
import json, sys
o = json.load(open(sys.argv[1])); p = o["prompt"].encode()
assert p == open(sys.argv[2], "rb").read()
assert o["specials"] and all(p[a:b].decode().startswith(("<", "\uff5c")) for a, b in o["specials"])
' "$tmp/out.json" "$tmp/want0.txt"

# --thinking / --no-thinking / --effort act like the request fields.
echo '[{"role":"user","content":"hi"}]' > "$tmp/hi.json"
echo '{"messages":[{"role":"user","content":"hi"}],"thinking":{"type":"disabled"}}' > "$tmp/hi-off.json"
echo '{"messages":[{"role":"user","content":"hi"}],"reasoning_effort":"max"}' > "$tmp/hi-max.json"
check "--no-thinking" cmp -s <("$tool" --no-thinking "$tmp/hi.json") <("$tool" "$tmp/hi-off.json")
check "--effort max" cmp -s <("$tool" --effort max "$tmp/hi.json") <("$tool" "$tmp/hi-max.json")
check "--thinking" cmp -s <("$tool" --thinking "$tmp/hi-off.json") <("$tool" "$tmp/hi.json")

# --parse: the fixture's outputs give the reference's messages.
python3 - "$dir/parse.json" "$tmp" <<'PY'
import json, sys, os
cases = json.load(open(sys.argv[1], encoding="utf-8"))["cases"]
for i, c in enumerate(cases):
    open(os.path.join(sys.argv[2], "preq%d.json" % i), "w", encoding="utf-8").write(c["body"])
    open(os.path.join(sys.argv[2], "out%d.txt" % i), "wb").write(c["text"].encode())
    json.dump({"message": c["message"], "finish_reason": c["finish_reason"], "finish": c["finish"]},
              open(os.path.join(sys.argv[2], "pwant%d.json" % i), "w"))
PY
n=0; bad=0
for out in "$tmp"/out*.txt; do
  i=${out##*/out}; i=${i%.txt}
  len=$(python3 -c 'import json,sys; print("--length" if json.load(open(sys.argv[1]))["finish"] == "length" else "")' "$tmp/pwant$i.json")
  "$tool" --parse --request "$tmp/preq$i.json" $len "$out" > "$tmp/pgot.json" || bad=$((bad + 1))
  python3 -c '
import json, re, sys
got, want = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
for tc in got["message"].get("tool_calls", []):
    m = re.match(r"^(call_\d\d+_(?:ET_)?)[A-Za-z0-9]{20}[0-9]{4}$", tc["id"])
    tc["id"] = m.group(1) + "*" if m else "malformed:" + tc["id"]
sys.exit(0 if got["message"] == want["message"] and got["finish_reason"] == want["finish_reason"] else 1)
' "$tmp/pgot.json" "$tmp/pwant$i.json" || { echo "parse $i differs"; bad=$((bad + 1)); }
  n=$((n + 1))
done
check "$n parsed outputs equal the fixture" test "$bad" -eq 0 -a "$n" -gt 30

# Bad input: a reason on stderr, exit 1; bad usage: exit 2.
echo '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}' > "$tmp/img.json"
"$tool" "$tmp/img.json" > /dev/null 2> "$tmp/err.txt"; rc=$?
check "image refused (exit 1, message)" test $rc -eq 1 -a -n "$(grep 'messages\[0\].content\[0\].type' "$tmp/err.txt")"
"$tool" --json "$tmp/img.json" > "$tmp/err.json" 2> /dev/null
check "--json refusal is an OpenAI error body" python3 -c '
import json, sys
e = json.load(open(sys.argv[1]))["error"]
assert e["type"] == "invalid_request_error" and e["code"] == "unsupported_value" and e["param"]
' "$tmp/err.json"
echo '{"messages": [' > "$tmp/broken.json"
"$tool" "$tmp/broken.json" > /dev/null 2> "$tmp/err.txt"; rc=$?
check "malformed JSON (exit 1, line:column)" test $rc -eq 1 -a -n "$(grep 'broken.json:2:' "$tmp/err.txt")"
"$tool" "$tmp/missing.json" > /dev/null 2> "$tmp/err.txt"; rc=$?
check "missing file (exit 1)" test $rc -eq 1 -a -n "$(grep 'No such file' "$tmp/err.txt")"
"$tool" --effort extreme "$tmp/hi.json" > /dev/null 2> "$tmp/err.txt"; rc=$?
check "bad --effort (exit 1)" test $rc -eq 1 -a -n "$(grep "'extreme'" "$tmp/err.txt")"
"$tool" --bogus > /dev/null 2>&1; rc=$?
check "unknown option (exit 2)" test $rc -eq 2
"$tool" --stop x "$tmp/hi.json" > /dev/null 2>&1; rc=$?
check "--stop without --parse (exit 2)" test $rc -eq 2

# --ids: the ids on one line; a failure is one message, the library's, and
# nothing after it (it was followed by "writing the prompt: Success").
"$mktiny" "$tmp/tiny" > /dev/null 2>&1 || { echo "FAILED: mk-tiny-model"; exit 1; }
"$tool" --ids --tokenizer "$tmp/tiny" "$tmp/hi.json" > "$tmp/ids.txt" 2> "$tmp/err.txt"; rc=$?
check "--ids: exit 0, nothing on stderr" test $rc -eq 0 -a ! -s "$tmp/err.txt"
check "--ids: the prompt's ids on one line" grep -Eqx '[0-9]+( [0-9]+){3,}' "$tmp/ids.txt"
ids_fails() { # ids_fails NAME TOKENIZER NEEDLE: exit 1, one line on stderr holding NEEDLE
  local rc
  "$tool" --ids --tokenizer "$2" "$tmp/hi.json" > "$tmp/out.txt" 2> "$tmp/err.txt"; rc=$?
  check "$1 (exit 1, one message)" test $rc -eq 1 -a ! -s "$tmp/out.txt" \
    -a "$(wc -l < "$tmp/err.txt")" -eq 1 -a -n "$(grep -F -- "$3" "$tmp/err.txt")"
  grep -q 'writing' "$tmp/err.txt" && { echo "FAILED: $1: a write error after the real one:"; cat "$tmp/err.txt"; fail=1; }
  return 0
}
ids_fails "--ids, no tokenizer there" "$tmp/missing" "$tmp/missing"
ids_fails "--ids, not a tokenizer" "$tmp/hi.json" "want a JSON object"
if [ -w /dev/full ]; then   # a write that fails: its own message, with its errno
  "$tool" --ids --tokenizer "$tmp/tiny" "$tmp/hi.json" > /dev/full 2> "$tmp/err.txt"; rc=$?
  check "--ids to a full disk (exit 1, the write error)" \
    test $rc -eq 1 -a -n "$(grep 'writing the ids: No space left' "$tmp/err.txt")"
  "$tool" "$tmp/hi.json" > /dev/full 2> "$tmp/err.txt"; rc=$?
  check "the prompt to a full disk (exit 1, the write error)" \
    test $rc -eq 1 -a -n "$(grep 'writing the prompt: No space left' "$tmp/err.txt")"
fi
exit $fail
