#!/usr/bin/env -S sh -c 'exec "${0%/*}/../../../tools/python" "$0" "$@"'
"""tests/integration/e2e/reqmodel_test.py — the request model's fields end to
end on a real cluster (routerd + prefilld + decoded on loopback), each checked
against what it must change, so that a field that is ignored fails:

  sampling      synthetic engine, 2 prefill x 2 decode: top_k, min_p, the
                penalties (their log-probabilities against a Python
                reimplementation, tools/synth-expect), stop_token_ids,
                include_stop_str_in_output, n = 3 (one prefill, distinct
                seeds, streamed and not), the openai client's extra_body
                streamed and not, /tokenize and /detokenize, bad input
  v41-sampling  the tiny V4.1 checkpoint: min_tokens against EOS forced by
                logit_bias, ignore_eos, skip_special_tokens (replies and
                /detokenize), chat_template_kwargs.thinking, n = 3 and the
                penalties equal to tools/generate's

usage: reqmodel_test.py SCENARIO BUILDDIR"""
import json
import math
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import (MODEL, SLOW, SYNTH_KEY, SYNTH_VOCAB, check, detok,  # noqa: E402
                     http_call, run_scenario, synth)
from cluster import chat_prompt  # noqa: E402
from e2e_test import prefill_done_lines, tiny_model  # noqa: E402


def expect(prompt, max_tokens, **sp):
    """The synthetic engine's ids for a prompt under the sampler's rule."""
    return synth.tokens(SYNTH_KEY, SYNTH_VOCAB, prompt, max_tokens - 1, **sp)


def chat_text(client, body, stream):
    """(text of each choice, finish of each, usage) through the openai client."""
    if not stream:
        r = client.chat.completions.create(**body)
        return ([c.message.content for c in r.choices], [c.finish_reason for c in r.choices],
                r.usage)
    n = body.get("n", 1)
    text, finish, usage = [""] * n, [None] * n, None
    with client.chat.completions.create(**body, stream=True,
                                        stream_options={"include_usage": True}) as s:
        for ch in s:
            usage = ch.usage or usage
            for c in ch.choices:
                text[c.index] += c.delta.content or ""
                finish[c.index] = c.finish_reason or finish[c.index]
    return text, finish, usage


def comp_text(client, body, stream):
    if not stream:
        r = client.completions.create(**body)
        return [c.text for c in r.choices], [c.finish_reason for c in r.choices], r.usage
    n = body.get("n", 1)
    text, finish, usage = [""] * n, [None] * n, None
    with client.completions.create(**body, stream=True,
                                   stream_options={"include_usage": True}) as s:
        for ch in s:
            usage = ch.usage or usage
            for c in ch.choices:
                text[c.index] += c.text or ""
                finish[c.index] = c.finish_reason or finish[c.index]
    return text, finish, usage


# ---- sampling: the synthetic engine ----------------------------------------------------


def check_top_k(client):
    """top_k 1 at temperature 1.5 is greedy, on 20 prompts (a draw at 1.5
    leaves the top candidate more than half the time: these differ)."""
    rng = random.Random(25)
    differs = 0
    for i in range(20):
        ids = [rng.randrange(1, SYNTH_VOCAB) for _ in range(5 + i)]
        r = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=1.5,
                                      seed=i, extra_body={"top_k": 1})
        want = detok(expect(ids, 8))
        check(r.choices[0].text == want, "top_k 1, prompt %d: %r, greedy %r" %
              (i, r.choices[0].text, want))
        differs += detok(expect(ids, 8, temperature=1.5, seed=i)) != want
    check(differs >= 10, "temperature 1.5 alone gave greedy on %d of 20 prompts" % (20 - differs))
    print("top_k 1: greedy on 20 prompts (temperature 1.5 alone differs on %d)" % differs,
          flush=True)


def check_penalties(client):
    """Each penalty changes the log-probabilities exactly as defined: every
    candidate's (top_logprobs 8: the whole row of the synthetic engine)
    against synth-expect's row, at every step; the draws follow."""
    messages = [{"role": "user", "content": "a penalty for repeating: abcabcabc"}]
    prompt = chat_prompt(messages)
    cases = [{"repetition_penalty": 1.7}, {"presence_penalty": 1.5},
             {"frequency_penalty": 0.9}, {"repetition_penalty": 0.6, "presence_penalty": -1.0,
                                          "frequency_penalty": 1.3}]
    for pen in cases:
        for temperature in (0.0, 0.8):
            body = dict(model=MODEL, messages=messages, max_tokens=40, seed=7,
                        temperature=temperature, logprobs=True, top_logprobs=8)
            r = client.chat.completions.create(**body, extra_body=pen)
            ids, rows = synth.run(SYNTH_KEY, SYNTH_VOCAB, prompt, 39, temperature=temperature,
                                  seed=7, **pen)
            plain, prows = synth.run(SYNTH_KEY, SYNTH_VOCAB, prompt, 39,
                                     temperature=temperature, seed=7)
            # (the synthetic logits are <= 0 and the top one 0: a repetition
            # penalty moves the others, so greedy ids may stay)
            check(rows != prows and (temperature == 0 or ids != plain),
                  "penalty %r at %g changes nothing on this prompt" % (pen, temperature))
            got = r.choices[0].logprobs.content
            check(len(got) == len(ids), "%r: %d logprob entries, %d tokens" %
                  (pen, len(got), len(ids)))
            for k, (e, tok, row) in enumerate(zip(got, ids, rows)):
                check(e.bytes == [tok], "%r T %g token %d: %r, expected id %d" %
                      (pen, temperature, k, e.bytes, tok))
                check(abs(e.logprob - row[tok]) < 1e-4, "%r token %d: logprob %g, expected %g" %
                      (pen, k, e.logprob, row[tok]))
                for t in e.top_logprobs:
                    want = row.get(t.bytes[0], -math.inf)
                    want = -9999.0 if want == -math.inf else want
                    check(abs(t.logprob - want) < 1e-4, "%r token %d alternative %d: %g, "
                          "expected %g" % (pen, k, t.bytes[0], t.logprob, want))


def check_min_p(client):
    """min_p at temperature 2: 2000 draws (the ids, from the log-probabilities'
    bytes), none below min_p x the top probability (at temperature 2) at its
    position, every one synth-expect's; without min_p such draws come."""
    below = {True: 0, False: 0}
    draws = 0
    for i in range(4):
        messages = [{"role": "user", "content": "draw %d" % i}]
        prompt = chat_prompt(messages)
        for use in (True, False):
            extra = {"min_p": 0.4} if use else {}
            r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=500,
                                               temperature=2.0, seed=100 + i, logprobs=True,
                                               extra_body=extra)
            got = [e.bytes[0] for e in r.choices[0].logprobs.content]
            want = expect(prompt, 500, temperature=2.0, seed=100 + i,
                          min_p=0.4 if use else 0.0)
            check(got == want, "min_p %s, request %d: ids differ from synth-expect's" % (use, i))
            ph = synth.prefix_hashes(SYNTH_KEY, prompt)[-1]
            for tok in got:
                cand = synth.candidates(ph, SYNTH_VOCAB)
                w = {cc: math.exp((l - cand[0][1]) / 2.0) for cc, l in cand}
                below[use] += w.get(tok, 0.0) < 0.4
                draws += use
                ph = synth.mix64(ph ^ synth.mix64(tok + synth.GAMMA))
    check(draws == 2000 and below[True] == 0 and below[False] > 50,
          "draws below min_p: %d with it (of %d), %d without" % (below[True], draws,
                                                                 below[False]))
    print("min_p: %d draws, none below the threshold (%d without min_p)" %
          (draws, below[False]), flush=True)


def check_choices(c, client):
    """n = 3: one prefill, each choice its own seed (S + i), streamed and not,
    completions and chat; usage counts every choice."""
    messages = [{"role": "user", "content": "three ways, please"}]
    for kind, stream in (("completion", False), ("completion", True), ("chat", False),
                         ("chat", True)):
        before = len(prefill_done_lines(c))
        if kind == "chat":
            prompt = chat_prompt(messages)
            text, finish, usage = chat_text(client, dict(model=MODEL, messages=messages,
                                                         max_tokens=12, n=3, seed=40,
                                                         temperature=0.9), stream)
        else:
            prompt = list(b"Once upon a time")
            text, finish, usage = comp_text(client, dict(model=MODEL, prompt="Once upon a time",
                                                         max_tokens=12, n=3, seed=40,
                                                         temperature=0.9), stream)
        want = [detok(expect(prompt, 12, temperature=0.9, seed=40 + i)) for i in range(3)]
        what = "n=3 %s %s" % (kind, "stream" if stream else "non-stream")
        check(text == want, "%s: %r, expected %r" % (what, text, want))
        check(len(set(want)) == 3, "%s: the seeds gave equal choices" % what)
        check(finish == ["length"] * 3, "%s: finish %r" % (what, finish))
        check(usage.completion_tokens == 36 and usage.prompt_tokens == len(prompt),
              "%s: usage %r" % (what, usage))
        c.wait(lambda: len(prefill_done_lines(c)) > before, "the prefill done line")
        time.sleep(0.1)
        check(len(prefill_done_lines(c)) == before + 1, "%s: %d prefills" %
              (what, len(prefill_done_lines(c)) - before))


def check_stops(client):
    """stop_token_ids ends a choice at that id (counted, its text left out
    unless include_stop_str_in_output, as vLLM does); include_stop_str_in_output
    keeps a stop string; a stop string in one of n choices ends that one only."""
    ids = list(b"stop here")
    full = expect(ids, 30)
    stop_id = full[9]
    first = full.index(stop_id)
    for incl in (False, True):
        r = client.completions.create(model=MODEL, prompt="stop here", max_tokens=30,
                                      temperature=0,
                                      extra_body={"stop_token_ids": [stop_id],
                                                  "include_stop_str_in_output": incl})
        want = detok(full[:first + 1] if incl else full[:first])
        check(r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == first + 1
              and r.choices[0].text == want,
              "stop_token_ids (include %s): %r %s %d, expected %r" %
              (incl, r.choices[0].text, r.choices[0].finish_reason,
               r.usage.completion_tokens, want))
    text = detok(full)
    stop = text[12:14]
    at = text.index(stop)
    for incl in (False, True):
        r = client.completions.create(model=MODEL, prompt="stop here", max_tokens=30,
                                      temperature=0, stop=[stop],
                                      extra_body={"include_stop_str_in_output": incl})
        want = text[:at + len(stop)] if incl else text[:at]
        check(r.choices[0].text == want and r.choices[0].finish_reason == "stop",
              "include_stop_str_in_output %s: %r, expected %r" % (incl, r.choices[0].text, want))
    # n = 2 at temperature 0.9: choice 0's stop string ends it alone
    c0 = detok(expect(ids, 30, temperature=0.9, seed=3))
    c1 = detok(expect(ids, 30, temperature=0.9, seed=4))
    s = next(c0[k:k + 2] for k in range(6, 25) if c0[k:k + 2] not in c1)
    r = client.completions.create(model=MODEL, prompt="stop here", max_tokens=30,
                                  temperature=0.9, seed=3, n=2, stop=[s])
    got = {ch.index: (ch.text, ch.finish_reason) for ch in r.choices}
    check(got == {0: (c0[:c0.index(s)], "stop"), 1: (c1, "length")},
          "a stop string in one of two choices: %r" % got)


def check_extra_body(client):
    """The openai package with vLLM's extra_body, streamed and not: every
    field applied (chat_template_kwargs has no effect on the byte-level
    stand-in's prompt, docs/api.md)."""
    messages = [{"role": "user", "content": "extra body"}]
    extra = {"top_k": 3, "min_p": 0.15, "repetition_penalty": 1.4, "min_tokens": 4,
             "chat_template_kwargs": {"thinking": False}}
    want = detok(expect(chat_prompt(messages), 24, temperature=1.2, seed=9, top_k=3,
                        min_p=0.15, repetition_penalty=1.4))
    plain = detok(expect(chat_prompt(messages), 24, temperature=1.2, seed=9))
    check(want != plain, "the extra fields change nothing on this prompt")
    for stream in (False, True):
        body = dict(model=MODEL, messages=messages, max_tokens=24, temperature=1.2, seed=9,
                    extra_body=extra)
        text, finish, _ = chat_text(client, body, stream)
        check(text == [want] and finish == ["length"],
              "extra_body %s: %r, expected %r" % ("stream" if stream else "", text, want))


def check_tokenize(c):
    """/tokenize equals the tokenizer (a completion's prompt, a chat's
    encoding), /detokenize gives the text back; behind the API key."""
    text = "Grüße, tokenizer ✓"
    st, _, data = http_call(c.http, "POST", "/tokenize", {"prompt": text, "model": MODEL,
                                                          "add_special_tokens": True})
    got = json.loads(data)
    check(st == 200 and got["tokens"] == list(text.encode()) and
          got["count"] == len(text.encode()) and got["max_model_len"] > 0,
          "tokenize: %d %r" % (st, data[:200]))
    messages = [{"role": "user", "content": "hi"}]
    st, _, data = http_call(c.http, "POST", "/tokenize", {"messages": messages})
    check(st == 200 and json.loads(data)["tokens"] == chat_prompt(messages),
          "tokenize messages: %d %r" % (st, data[:200]))
    st, _, data = http_call(c.http, "POST", "/detokenize", {"tokens": list(text.encode())})
    check(st == 200 and json.loads(data)["prompt"] == text, "detokenize: %d %r" % (st, data))
    for path, body, param in (("/detokenize", {"tokens": [1, 256]}, "tokens[1]"),
                              ("/tokenize", {"prompt": "x", "bogus": 1}, None),
                              ("/tokenize", {"prompt": "x", "model": "nope"}, None)):
        st, _, data = http_call(c.http, "POST", path, body)
        err = json.loads(data)["error"]
        check(st in (400, 404) and err["param"] == param, "%s %r: %d %r" % (path, body, st, err))
    st, _, _ = http_call(c.http, "POST", "/tokenize", {"prompt": "x"}, key=None)
    check(st == 401, "tokenize without a key: %d" % st)


def check_bad_input(c):
    """Each out-of-range field gets a 400 naming it."""
    base = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    for field, value in (("n", 17), ("top_k", -2), ("min_p", 1.5), ("min_p", -0.1),
                         ("repetition_penalty", 0), ("presence_penalty", 2.5),
                         ("frequency_penalty", -3), ("stop_token_ids", [3, 256]),
                         ("best_of", 2), ("use_beam_search", True)):
        st, _, data = http_call(c.http, "POST", "/v1/chat/completions", dict(base, **{field: value}))
        err = json.loads(data)["error"]
        want = field + "[1]" if field == "stop_token_ids" else field
        check(st == 400 and err["param"] == want and field in err["message"],
              "%s=%r: %d %r" % (field, value, st, err))


def test_sampling(c):
    c.up(prefill=2, decode=2, decode_ranks=1)
    client = c.client()
    check_top_k(client)
    check_penalties(client)
    check_min_p(client)
    check_choices(c, client)
    check_stops(client)
    check_extra_body(client)
    check_tokenize(c)
    check_bad_input(c)
    c.wait_idle()


# ---- v41-sampling: the tiny checkpoint ----------------------------------------------


def generate(c, model, ids, *args):
    r = subprocess.run([os.path.join(c.build, "tools", "generate"), "--model", model,
                        "--prompt-ids", " ".join(map(str, ids)), "--json", "--no-stream",
                        *args], capture_output=True, timeout=120 * SLOW)
    check(r.returncode == 0, "generate %r: %r" % (args, r.stderr[-400:]))
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


def test_v41_sampling(c):
    model = tiny_model(c)
    c.up(prefill=1, decode=1, decode_ranks=1, router=("--tokenizer", model))
    client = c.client()
    cfg = json.load(open(os.path.join(model, "config.json")))["text_config"]
    eos = cfg["eos_token_id"]
    eos = eos[0] if isinstance(eos, list) else eos
    name = "tandem-deepseek-v41"
    st, _, data = http_call(c.http, "POST", "/tokenize", {"prompt": "Tiny models sample too."})
    ids = json.loads(data)["tokens"]
    force = {"logit_bias": {str(eos): 100}}
    # min_tokens against EOS forced by logit_bias: the reply is still min_tokens long
    r = client.completions.create(model=name, prompt=ids, max_tokens=20, temperature=0,
                                  extra_body=force)
    check(r.usage.completion_tokens == 1 and r.choices[0].finish_reason == "stop",
          "forced EOS: %r" % r.usage)
    r = client.completions.create(model=name, prompt=ids, max_tokens=20, temperature=0,
                                  logprobs=1, extra_body=dict(force, min_tokens=6))
    toks = r.choices[0].logprobs.tokens
    check(r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "stop" and
          len(toks) == 7, "min_tokens 6: %r %r" % (r.usage, toks))
    # ignore_eos: EOS does not end it; skip_special_tokens false shows it
    spell = json.loads(http_call(c.http, "POST", "/detokenize",
                                 {"tokens": [eos], "skip_special_tokens": False})[2])["prompt"]
    skipped = json.loads(http_call(c.http, "POST", "/detokenize",
                                   {"tokens": [eos], "skip_special_tokens": True})[2])["prompt"]
    check(spell != "" and skipped == "", "detokenize eos: %r / %r" % (spell, skipped))
    for skip in (True, False):
        r = client.completions.create(model=name, prompt=ids, max_tokens=5, temperature=0,
                                      extra_body=dict(force, ignore_eos=True,
                                                      skip_special_tokens=skip))
        check(r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length" and
              (r.choices[0].text == "" if skip else r.choices[0].text == spell * 5),
              "ignore_eos, skip_special_tokens %s: %r" % (skip, r.choices[0].text))
    # chat_template_kwargs.thinking: the prompt of thinking off, no reasoning
    messages = [{"role": "user", "content": "Think or not?"}]
    t_off = json.loads(http_call(c.http, "POST", "/tokenize", {
        "messages": messages, "chat_template_kwargs": {"thinking": False}})[2])["tokens"]
    t_dis = json.loads(http_call(c.http, "POST", "/tokenize", {
        "messages": messages, "thinking": {"type": "disabled"}})[2])["tokens"]
    t_on = json.loads(http_call(c.http, "POST", "/tokenize", {"messages": messages})[2])["tokens"]
    check(t_off == t_dis and t_off != t_on, "chat_template_kwargs.thinking: %d / %d / %d ids" %
          (len(t_off), len(t_dis), len(t_on)))
    r = client.chat.completions.create(model=name, messages=messages, max_tokens=8,
                                       temperature=0,
                                       extra_body={"chat_template_kwargs": {"thinking": False}})
    check(getattr(r.choices[0].message, "reasoning_content", None) is None,
          "thinking off: %r" % r.choices[0].message)
    # n = 3 and the penalties on the real model: tools/generate's, seed S + i
    r = client.completions.create(model=name, prompt=ids, max_tokens=10, temperature=0.9,
                                  seed=21, n=3, logprobs=1)
    for i, ch in enumerate(r.choices):
        g = generate(c, model, ids, "--max-tokens", "10", "--temperature", "0.9", "--seed",
                     str(21 + i), "--logprobs", "0")
        lp = [t["logprob"] for t in g["tokens"]]
        check(ch.index == i and ch.logprobs.token_logprobs == lp,
              "n=3 choice %d: %r, generate %r" % (i, ch.logprobs.token_logprobs, lp))
    pen = ["--repetition-penalty", "1.5", "--presence-penalty", "0.5", "--frequency-penalty",
           "0.7", "--min-p", "0.05", "--top-k", "20"]
    g = generate(c, model, ids, "--max-tokens", "12", "--temperature", "0.8", "--seed", "5",
                 "--logprobs", "0", *pen)
    r = client.completions.create(model=name, prompt=ids, max_tokens=12, temperature=0.8,
                                  seed=5, logprobs=1,
                                  extra_body={"repetition_penalty": 1.5, "presence_penalty": 0.5,
                                              "frequency_penalty": 0.7, "min_p": 0.05,
                                              "top_k": 20})
    lp = [t["logprob"] for t in g["tokens"]]
    check(r.choices[0].logprobs.token_logprobs == lp,
          "penalties: %r, generate %r" % (r.choices[0].logprobs.token_logprobs, lp))
    c.wait_idle()


def main():
    return run_scenario(globals(), sys.argv[1], sys.argv[2])


if __name__ == "__main__":
    sys.exit(main())
