#!/usr/bin/env -S sh -c 'exec "${0%/*}/../../tools/python" "$0" "$@"'
# tests/generate/test_generate_tool.py — tools/generate end to end on tiny
# checkpoints: greedy ids equal the library's plain loop (generate_ref) for a
# raw prompt and for chat requests, seeded sampling reproducible and equal to
# the library's, --max-tokens, stop at the config's EOS, the context limit,
# the output formats (JSON lines, text on a pipe and on a terminal), --dep N
# (a DEP group of rank threads: the same bytes out, also with copies spread
# over the ranks and a placement file), and the exit codes and messages of
# bad input. Needs python3 only (no network).
# usage: test_generate_tool.py GENERATE GENERATE_REF MK_TINY_MODEL
import json
import os
import pty
import re
import shutil
import subprocess
import sys
import tempfile

GEN, REF, MK = sys.argv[1:4]
failures = 0


def check(name, cond, detail=""):
    global failures
    if cond:
        print("ok: " + name)
    else:
        failures += 1
        print("FAILED: " + name + (": " + detail if detail else ""))


def run(args, env=None, stdin=None, tool=GEN):
    e = dict(os.environ)
    e.pop("TANDEM_MODEL", None)
    if env:
        e.update(env)
    p = subprocess.run([tool] + args, input=stdin, capture_output=True, env=e, timeout=120)
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")


def lines(out):
    return [json.loads(l) for l in out.decode().splitlines() if l.strip()]


def gen_json(model, args, **kw):
    rc, out, err = run(["--model", model, "--json"] + args, **kw)
    if rc != 0:
        return rc, None, [], err
    ls = lines(out)
    return rc, ls[-1], ls[:-1], err


def ref(model, args):
    rc, out, err = run(["--model", model] + args, tool=REF)
    if rc != 0:
        raise SystemExit("generate_ref failed: " + err)
    return json.loads(out)


def patch_config(src, dst, **fields):
    shutil.copytree(src, dst)
    path = os.path.join(dst, "config.json")
    cfg = json.load(open(path))
    cfg["text_config"].update(fields)
    json.dump(cfg, open(path, "w"), indent=1)


tmp = tempfile.mkdtemp(prefix="test_generate_tool.")
try:
    tiny = os.path.join(tmp, "tiny")
    fp4 = os.path.join(tmp, "tiny-fp4")
    noeng = os.path.join(tmp, "noengram")
    for d, a in ((tiny, ["--dtype", "f32", "--init", "perturbed", "--seed", "21"]),
                 (fp4, ["--quant", "fp8+fp4", "--init", "perturbed", "--seed", "22"]),
                 (noeng, ["--preset", "tiny-noengram", "--seed", "23"])):
        subprocess.run([MK] + a + [d], check=True, capture_output=True)

    PROMPT = "The quick brown fox jumps over the lazy dog. def main():"
    msgs = os.path.join(tmp, "req.json")
    json.dump({"messages": [{"role": "system", "content": "You are terse."},
                            {"role": "user", "content": "Name three colors."}]},
              open(msgs, "w"))

    # ---- greedy equals the library -------------------------------------------------
    for model in (tiny, fp4):
        name = os.path.basename(model)
        want = ref(model, ["--prompt", PROMPT, "--max-tokens", "24"])
        rc, done, toks, err = gen_json(model, ["--prompt", PROMPT, "--temperature", "0",
                                               "--max-tokens", "24", "--chunk", "4",
                                               "--logprobs", "3"])
        check(name + ": greedy --prompt runs", rc == 0, err)
        if rc != 0:
            continue
        check(name + ": prompt ids equal the tokenizer's", done["prompt_ids"] == want["prompt_ids"])
        check(name + ": greedy ids equal the library's", done["ids"] == want["ids"],
              "%s vs %s" % (done["ids"], want["ids"]))
        check(name + ": finish reason", done["finish_reason"] == want["finish_reason"])
        tl = [t for t in toks if t["type"] == "token"]
        check(name + ": one token line per id", [t["id"] for t in tl] == done["ids"])
        check(name + ": logprobs equal a direct log-softmax",
              all(abs(t["logprob"] - w) < 1e-9 for t, w in zip(tl, want["logprobs"])))
        check(name + ": top_logprobs: 3, sorted, the greedy token first",
              all(len(t["top_logprobs"]) == 3 and t["top_logprobs"][0]["id"] == t["id"] and
                  t["top_logprobs"][0]["logprob"] >= t["top_logprobs"][1]["logprob"] >=
                  t["top_logprobs"][2]["logprob"] for t in tl))
        check(name + ": text is the tokens' text", done["text"] == "".join(t["text"] for t in tl))
        rc, done2, _, _ = gen_json(model, ["--prompt", PROMPT, "--temperature", "0",
                                           "--max-tokens", "24"])
        check(name + ": the prefill chunk does not matter", rc == 0 and done2["ids"] == done["ids"])

    for extra in ([], ["--no-thinking"]):
        want = ref(tiny, ["--messages", msgs, "--max-tokens", "20"] + extra)
        rc, done, toks, err = gen_json(tiny, ["--messages", msgs, "--temperature", "0",
                                              "--max-tokens", "20"] + extra)
        what = "greedy --messages " + " ".join(extra)
        check(what + ": prompt ids equal td_chat_prompt_ids'",
              rc == 0 and done["prompt_ids"] == want["prompt_ids"], err)
        check(what + ": ids equal the library's", rc == 0 and done["ids"] == want["ids"])
        if rc == 0:
            msg = done["message"]
            kinds = {t["type"] for t in toks}
            check(what + ": reply message", msg["role"] == "assistant" and
                  ("reasoning_content" in msg) == (extra == []))
            got_r = "".join(t["text"] for t in toks if t["type"] == "reasoning")
            got_c = "".join(t["text"] for t in toks if t["type"] == "content")
            check(what + ": deltas add up to the message",
                  got_c == msg["content"] and got_r == msg.get("reasoning_content", "") and
                  kinds <= {"token", "reasoning", "content", "tool_call", "tool_args"})
    rc, done_stdin, _, _ = gen_json(tiny, ["--messages", "-", "--temperature", "0",
                                           "--max-tokens", "20"], stdin=open(msgs, "rb").read())
    want = ref(tiny, ["--messages", msgs, "--max-tokens", "20"])
    check("--messages - reads standard input", rc == 0 and done_stdin["ids"] == want["ids"])

    # ---- seeds --------------------------------------------------------------------------
    samp = ["--temperature", "0.9", "--top-p", "0.95", "--top-k", "40", "--max-tokens", "32"]
    rc1, a, _, _ = gen_json(tiny, ["--prompt", PROMPT, "--seed", "7"] + samp)
    rc2, b, _, _ = gen_json(tiny, ["--prompt", PROMPT, "--seed", "7"] + samp)
    rc3, c, _, _ = gen_json(tiny, ["--prompt", PROMPT, "--seed", "8"] + samp)
    want = ref(tiny, ["--prompt", PROMPT, "--seed", "7"] + samp)
    check("same seed, same ids", rc1 == rc2 == 0 and a["ids"] == b["ids"] and a["seed"] == 7)
    check("seeded ids equal the library's td_sample_rows", rc1 == 0 and a["ids"] == want["ids"])
    check("another seed, other ids", rc3 == 0 and c["ids"] != a["ids"])
    r1 = run(["--model", tiny, "--prompt", PROMPT, "--seed", "7"] + samp)
    r2 = run(["--model", tiny, "--prompt", PROMPT, "--seed", "7"] + samp)
    check("same seed, same text", r1[0] == 0 and r1[1] == r2[1] and len(r1[1]) > 0)
    check("the text on a pipe is the reply's text", r1[1].decode() == a["text"])
    r3 = run(["--model", tiny, "--prompt", PROMPT, "--seed", "8"] + samp)
    check("another seed, other text", r3[0] == 0 and r3[1] != r1[1])
    m = re.search(r"generate: (\d+) prompt tokens, prefill [0-9.]+ s \([0-9.]+ tok/s\); "
                  r"(\d+) tokens generated, decode [0-9.]+ s \([0-9.]+ tok/s\); "
                  r"finish (stop|length); seed 7", r1[2])
    check("summary on stderr", m is not None and int(m.group(2)) == 32, r1[2])
    # loading progress on stderr: nothing for a quick load; with every step
    # reported (TD_PROGRESS_MS=0, as a slow load every 5 s) a line per tensor
    # and the last one
    check("no progress lines for a quick load", "loading" not in r1[2], r1[2])
    rc, _, err = run(["--model", tiny, "--prompt", PROMPT, "--max-tokens", "1"],
                     env={"TD_PROGRESS_MS": "0"})
    steps = [int(x) for x in re.findall(
        r"^generate: model \S+: loading: (\d+) of \d+ tensors, .* \(\d+%\), \d+ s$", err, re.M)]
    check("progress lines on stderr", rc == 0 and len(steps) > 100 and
          steps == list(range(1, len(steps) + 1)) and
          re.search(r"^generate: model \S+: loaded %d tensors, " % (len(steps) + 1), err, re.M)
          is not None, err[-600:])
    rc, d, _, _ = gen_json(tiny, ["--prompt", PROMPT, "--max-tokens", "4"])
    rc2, d2, _, _ = gen_json(tiny, ["--prompt", PROMPT, "--max-tokens", "4"])
    check("no --seed: a random seed, reported", rc == rc2 == 0 and d["seed"] != d2["seed"])

    # ---- the sampler's other steps -----------------------------------------------------
    greedy = gen_json(tiny, ["--prompt", PROMPT, "--temperature", "0", "--max-tokens", "16"])[1]
    rc, k1, _, _ = gen_json(tiny, ["--prompt", PROMPT, "--temperature", "1.5", "--top-k", "1",
                                   "--seed", "3", "--max-tokens", "16"])
    check("--top-k 1 at temperature 1.5 is greedy", rc == 0 and k1["ids"] == greedy["ids"])
    pen = ["--penalties", "1.8,0.7,0.9"]
    want = ref(tiny, ["--prompt", PROMPT, "--max-tokens", "16"] + pen)
    rc, got, toks, err = gen_json(tiny, ["--prompt", PROMPT, "--temperature", "0",
                                         "--max-tokens", "16", "--logprobs", "0",
                                         "--repetition-penalty", "1.8", "--presence-penalty",
                                         "0.7", "--frequency-penalty", "0.9"])
    tl = [t for t in toks if t["type"] == "token"]
    check("penalties: ids equal a direct loop's", rc == 0 and got["ids"] == want["ids"],
          err[-300:] if rc else "%s vs %s" % (got["ids"], want["ids"]))
    check("penalties: logprobs of the penalized distribution",
          rc == 0 and len(tl) == len(want["logprobs"]) and
          all(abs(t["logprob"] - w) < 1e-5 for t, w in zip(tl, want["logprobs"])))
    check("penalties change the reply", rc == 0 and got["ids"] != greedy["ids"])
    # stop ids, min tokens, and the config's eos ignored
    eos = json.load(open(os.path.join(tiny, "config.json")))["text_config"].get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    rc, st, _, err = gen_json(tiny, ["--prompt", PROMPT, "--temperature", "0", "--max-tokens",
                                     "12", "--stop-token-ids", str(greedy["ids"][2])])
    check("--stop-token-ids ends the reply", rc == 0 and st["ids"] == greedy["ids"][:3] and
          st["finish_reason"] == "stop", err[-300:])
    rc, st, _, err = gen_json(tiny, ["--prompt", PROMPT, "--temperature", "0", "--max-tokens",
                                     "12", "--stop-token-ids", str(greedy["ids"][2]),
                                     "--min-tokens", "5"])
    check("--min-tokens masks stop tokens until reached",
          rc == 0 and greedy["ids"][2] not in st["ids"][:5] and len(st["ids"]) >= 5, err[-300:])
    # this prompt's greedy reply ends with the config's eos at token 128
    rc, full, _, _ = gen_json(tiny, ["--prompt", PROMPT, "--temperature", "0", "--max-tokens",
                                     "140"])
    check("the greedy reply ends with eos", rc == 0 and full["finish_reason"] == "stop" and
          full["ids"][-1] == eos and len(full["ids"]) < 135, str(full and full["ids"][-3:]))
    rc, st, _, err = gen_json(tiny, ["--prompt", PROMPT, "--temperature", "0", "--max-tokens",
                                     "140", "--ignore-eos"])
    check("--ignore-eos runs past eos to max-tokens", rc == 0 and len(st["ids"]) == 140 and
          st["finish_reason"] == "length" and st["ids"][:len(full["ids"])] == full["ids"],
          err[-300:])
    n = len(full["ids"]) + 4
    want = ref(tiny, ["--prompt", PROMPT, "--max-tokens", "140", "--min-tokens", str(n)])
    rc, st, _, err = gen_json(tiny, ["--prompt", PROMPT, "--temperature", "0", "--max-tokens",
                                     "140", "--min-tokens", str(n)])
    check("--min-tokens: no eos before it, ids equal a direct loop's",
          rc == 0 and st["ids"] == want["ids"] and eos not in st["ids"][:n] and
          st["ids"] != full["ids"], err[-300:])

    # ---- --dep N: a DEP group of rank threads prints the same bytes -----------------------
    def no_timing(out):
        ls = lines(out)
        for l in ls:
            l.pop("timing", None)
        return ls

    e6 = os.path.join(tmp, "e6k3")
    subprocess.run([MK, "--experts", "6", "--topk", "3", "--init", "perturbed", "--seed", "24",
                    e6], check=True, capture_output=True)
    place = os.path.join(tmp, "replicas.json")
    with open(place, "w") as f:
        json.dump({"experts": 6, "ranks": [[0, 1, 5], [2, 3, 0], [4, 5, 1]]}, f)
    runs = [
        (tiny, ["--prompt", PROMPT, "--temperature", "0", "--max-tokens", "24", "--chunk", "4",
                "--logprobs", "3", "--seed", "1"], [["--dep", "1"], ["--dep", "2"], ["--dep", "8"]]),
        (e6, ["--prompt", PROMPT, "--seed", "7", "--max-tokens", "24", "--chunk", "5",
              "--logprobs", "2"] + samp[:6],
         [["--dep", "4"], ["--dep", "3", "--requests", "5"], ["--dep", "3", "--placement", place],
          ["--requests", "2"]]),
        (tiny, ["--messages", msgs, "--temperature", "0", "--max-tokens", "20", "--seed", "1"],
         [["--dep", "3"]]),
    ]
    for model, args, deps in runs:
        rc, base, err = run(["--model", model, "--json"] + args)
        check("%s %s: runs" % (os.path.basename(model), args[0]), rc == 0, err)
        for dep in deps:
            what = "%s %s %s" % (os.path.basename(model), args[0], " ".join(dep))
            rc, out, err = run(["--model", model, "--json"] + args + dep)
            check(what + ": the same JSON lines", rc == 0 and no_timing(out) == no_timing(base),
                  err[-300:])
            if "--dep" in dep:
                n = dep[dep.index("--dep") + 1]
                check(what + ": the summary names the group",
                      re.search(r"; DEP %s \(" % n, err) is not None, err[-300:])
    rc, out1, _ = run(["--model", tiny, "--prompt", PROMPT, "--temperature", "0",
                       "--max-tokens", "12"])
    rc2, out2, _ = run(["--model", tiny, "--prompt", PROMPT, "--temperature", "0",
                        "--max-tokens", "12", "--dep", "4"])
    check("--dep 4: the same text", rc == rc2 == 0 and out1 == out2 and len(out1) > 0)
    bad_place = os.path.join(tmp, "bad-placement.json")
    with open(bad_place, "w") as f:
        f.write('{"ranks": [[0, 1, 2], [3, 4]]}')
    rc, out, err = run(["--model", e6, "--prompt", "x", "--dep", "2", "--placement", bad_place])
    check("a placement file without expert 5: refused with the reason",
          rc == 1 and out == b"" and "placement %s: expert 5 is held by no rank" % bad_place
          in err and "--placement %s: refused" % bad_place in err, err)
    rc, out, err = run(["--model", e6, "--prompt", "x", "--dep", "3", "--placement", bad_place])
    check("a placement file for another group size: refused",
          rc == 1 and "\"ranks\" lists 2 ranks, the group has 3" in err, err)

    # ---- --max-tokens, --no-stream ------------------------------------------------------
    rc, done, toks, _ = gen_json(tiny, ["--prompt", PROMPT, "--temperature", "0",
                                        "--max-tokens", "7"])
    check("--max-tokens 7", rc == 0 and len(done["ids"]) == 7 and
          done["finish_reason"] == "length" and done["usage"]["completion_tokens"] == 7)
    rc, out, _ = run(["--model", tiny, "--prompt", PROMPT, "--temperature", "0",
                      "--max-tokens", "7", "--no-stream", "--json", "--logprobs", "2"])
    ls = lines(out) if rc == 0 else []
    check("--no-stream --json: one object, the same ids",
          len(ls) == 1 and ls[0]["type"] == "done" and ls[0]["ids"] == done["ids"] and
          [t["id"] for t in ls[0]["tokens"]] == done["ids"] and
          all(len(t["top_logprobs"]) == 2 for t in ls[0]["tokens"]))
    rc, out, _ = run(["--model", tiny, "--prompt", PROMPT, "--temperature", "0",
                      "--max-tokens", "7", "--no-stream"])
    check("--no-stream text", rc == 0 and out.decode() == done["text"])

    # ---- stop at EOS ----------------------------------------------------------------------
    greedy = ref(tiny, ["--prompt", PROMPT, "--max-tokens", "24"])["ids"]
    k = next(i for i in range(2, len(greedy)) if greedy[i] not in greedy[:i])
    eos_dir = os.path.join(tmp, "tiny-eos")
    patch_config(tiny, eos_dir, eos_token_id=greedy[k])
    rc, done, toks, err = gen_json(eos_dir, ["--prompt", PROMPT, "--temperature", "0",
                                             "--max-tokens", "24"])
    check("stops at the config's eos_token_id",
          rc == 0 and done["ids"] == greedy[:k + 1] and done["finish_reason"] == "stop", err)
    if rc == 0:
        last = [t for t in toks if t["type"] == "token"][-1]
        check("the stop token is reported, its text is not",
              last.get("stop") is True and last["text"] == "" and
              done["text"] == "".join(t["text"] for t in toks if t["type"] == "token"))
    eos_list = os.path.join(tmp, "tiny-eos-list")
    eos = [greedy[k], greedy[k - 1]]
    patch_config(tiny, eos_list, eos_token_id=eos)
    first = next(i for i, t in enumerate(greedy) if t in eos)
    rc, done, _, _ = gen_json(eos_list, ["--prompt", PROMPT, "--temperature", "0",
                                         "--max-tokens", "24"])
    check("eos_token_id as a list", rc == 0 and done["ids"] == greedy[:first + 1] and
          done["finish_reason"] == "stop")

    # ---- the context ------------------------------------------------------------------------
    ctx_dir = os.path.join(tmp, "tiny-ctx")
    patch_config(tiny, ctx_dir, max_position_embeddings=16)
    short = "one two three"
    n_short = len(ref(tiny, ["--prompt", short, "--max-tokens", "1"])["prompt_ids"])
    rc, done, _, err = gen_json(ctx_dir, ["--prompt", short, "--temperature", "0",
                                          "--max-tokens", "100"])
    check("generation ends at max_position_embeddings",
          rc == 0 and len(done["ids"]) == 16 - n_short and done["finish_reason"] == "length", err)
    rc, out, err = run(["--model", ctx_dir, "--prompt", PROMPT * 3])
    check("a prompt longer than the context: exit 1 with a message",
          rc == 1 and "does not fit the context of 16 tokens" in err and out == b"", err)
    rc, done, _, err = gen_json(tiny, ["--prompt", short, "--temperature", "0",
                                       "--context", str(n_short + 2), "--max-tokens", "50"])
    check("--context", rc == 0 and len(done["ids"]) == 2, err)
    rc, _, err = run(["--model", tiny, "--prompt", short, "--context", str(n_short)])
    check("--context no larger than the prompt: exit 1", rc == 1 and "does not fit" in err, err)
    rc, _, err = run(["--model", ctx_dir, "--prompt", short, "--context", "17"])
    check("--context above max_position_embeddings: exit 1",
          rc == 1 and "max_position_embeddings" in err, err)

    # ---- text output on a terminal and on a pipe ----------------------------------------------
    rc, done, _, _ = gen_json(tiny, ["--messages", msgs, "--temperature", "0",
                                     "--max-tokens", "30"])
    reasoning = done["message"].get("reasoning_content", "")
    content = done["message"]["content"]
    rc, out, _ = run(["--model", tiny, "--messages", msgs, "--temperature", "0",
                      "--max-tokens", "30"])
    quoted = "".join("> " + l for l in reasoning.splitlines(True))
    want_pipe = quoted
    if content:
        want_pipe += ("" if not quoted or quoted.endswith("\n") else "\n") + \
            ("\n" if quoted else "") + content
    check("pipe: reasoning lines quoted with '> ', then the content",
          rc == 0 and out.decode() == want_pipe, repr(out.decode()) + " vs " + repr(want_pipe))
    rc, out2, _ = run(["--model", tiny, "--messages", msgs, "--temperature", "0",
                       "--max-tokens", "30", "--no-stream"])
    check("pipe, --no-stream: the same text", rc == 0 and out2 == out)

    rc, done, _, _ = gen_json(tiny, ["--messages", msgs, "--no-thinking", "--temperature", "0",
                                     "--max-tokens", "30"])
    rc2, out, _ = run(["--model", tiny, "--messages", msgs, "--no-thinking", "--temperature",
                       "0", "--max-tokens", "30"])
    check("pipe, thinking off: the content as it is",
          rc == rc2 == 0 and done["message"]["content"] and
          out.decode() == done["message"]["content"])

    master, slave = pty.openpty()
    e = dict(os.environ)
    e.pop("NO_COLOR", None)
    p = subprocess.Popen([GEN, "--model", tiny, "--messages", msgs, "--temperature", "0",
                          "--max-tokens", "30"], stdout=slave, stderr=subprocess.PIPE, env=e)
    os.close(slave)
    tty = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        tty += chunk
    p.wait(timeout=60)
    os.close(master)
    tty = tty.decode().replace("\r\n", "\n")
    want_tty = "\x1b[2m" + reasoning + "\x1b[0m" if reasoning else ""
    if content:
        want_tty += ("" if not reasoning or reasoning.endswith("\n") else "\n") + \
            ("\n" if reasoning else "") + content
    if not (content or reasoning).endswith("\n"):
        want_tty += "\n"
    check("terminal: reasoning dimmed, the line ended",
          p.returncode == 0 and tty == want_tty, repr(tty) + " vs " + repr(want_tty))

    # ---- $TANDEM_MODEL ---------------------------------------------------------------------
    rc, out, err = run(["--json", "--prompt", PROMPT, "--temperature", "0", "--max-tokens", "5"],
                       env={"TANDEM_MODEL": tiny})
    check("$TANDEM_MODEL names the model", rc == 0 and lines(out)[-1]["ids"] == greedy[:5], err)

    # ---- bad input ----------------------------------------------------------------------------
    bad_json = os.path.join(tmp, "bad.json")
    open(bad_json, "w").write("{\"messages\": [")
    refused = os.path.join(tmp, "refused.json")
    json.dump({"messages": [{"role": "wizard", "content": "hi"}]}, open(refused, "w"))
    empty_dir = os.path.join(tmp, "empty")
    os.mkdir(empty_dir)
    notok = os.path.join(tmp, "no-tokenizer")
    shutil.copytree(noeng, notok)
    os.remove(os.path.join(notok, "tokenizer.json"))
    missing = os.path.join(tmp, "missing")
    cases = [
        ("a directory that does not exist", ["--model", missing, "--prompt", "x"], 1, missing),
        ("a directory without a checkpoint", ["--model", empty_dir, "--prompt", "x"], 1,
         empty_dir),
        ("a checkpoint without tokenizer.json", ["--model", notok, "--prompt", "x"], 1,
         "no tokenizer.json"),
        ("a request that is not JSON", ["--model", tiny, "--messages", bad_json], 1, "not JSON"),
        ("a request file that does not exist",
         ["--model", tiny, "--messages", os.path.join(tmp, "nope.json")], 1,
         "No such file"),
        ("a request the format refuses", ["--model", tiny, "--messages", refused], 1,
         "request refused"),
        ("an empty prompt", ["--model", tiny, "--prompt", ""], 1, "empty"),
        ("a negative temperature", ["--model", tiny, "--prompt", "x", "--temperature", "-1"], 2,
         "--temperature"),
        ("top_p 0", ["--model", tiny, "--prompt", "x", "--top-p", "0"], 2, "--top-p"),
        ("top_p above 1", ["--model", tiny, "--prompt", "x", "--top-p", "1.5"], 2, "--top-p"),
        ("--logprobs 21", ["--model", tiny, "--prompt", "x", "--logprobs", "21"], 2,
         "--logprobs"),
        ("--logprobs without --json", ["--model", tiny, "--prompt", "x", "--logprobs", "2"], 2,
         "--json"),
        ("--max-tokens 0", ["--model", tiny, "--prompt", "x", "--max-tokens", "0"], 2,
         "--max-tokens"),
        ("--max-tokens abc", ["--model", tiny, "--prompt", "x", "--max-tokens", "abc"], 2,
         "--max-tokens"),
        ("--seed -1", ["--model", tiny, "--prompt", "x", "--seed", "-1"], 2, "--seed"),
        ("both --prompt and --messages", ["--model", tiny, "--prompt", "x", "--messages", msgs],
         2, "one of"),
        ("neither --prompt nor --messages", ["--model", tiny], 2, "one of"),
        ("no model", ["--prompt", "x"], 2, "TANDEM_MODEL"),
        ("--thinking with --prompt", ["--model", tiny, "--prompt", "x", "--thinking"], 2,
         "--messages"),
        ("an unknown option", ["--model", tiny, "--prompt", "x", "--bogus"], 2, "usage"),
        ("a stray argument", ["--model", tiny, "--prompt", "x", "extra"], 2, "extra"),
        ("--dep 0", ["--model", tiny, "--prompt", "x", "--dep", "0"], 2, "--dep"),
        ("--dep 257", ["--model", tiny, "--prompt", "x", "--dep", "257"], 2, "--dep"),
        ("--requests 0", ["--model", tiny, "--prompt", "x", "--requests", "0"], 2,
         "--requests"),
        ("--placement without --dep", ["--model", tiny, "--prompt", "x", "--placement", msgs],
         2, "--placement goes with --dep"),
        ("a placement file that does not exist",
         ["--model", tiny, "--prompt", "x", "--dep", "2", "--placement",
          os.path.join(tmp, "nope.json")], 1, "No such file"),
    ]
    for what, args, code, msg in cases:
        rc, out, err = run(args)
        check("%s: exit %d, message" % (what, code), rc == code and msg in err and out == b"",
              "rc %d, stderr %r" % (rc, err))
    rc, out, _ = run(["--help"])
    check("--help", rc == 0 and out.startswith(b"usage: generate"))
finally:
    shutil.rmtree(tmp, ignore_errors=True)

print("test_generate_tool: %s" % ("all checks passed" if failures == 0 else
                                  "%d check(s) failed" % failures))
sys.exit(1 if failures else 0)
