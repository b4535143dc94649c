#!/usr/bin/env -S sh -c 'exec "${0%/*}/../../tools/python" "$0" "$@"'
"""tests/integration/routerd_cache_test.py — routerd's KV-aware prefill
placement (docs/kvrouting.md) against fake prefill ranks with prefix caches
(rtr_fake_worker --cache-block/--cache-prompt): a prompt goes to the rank
holding its prefix though another has less load, by load with cache-weight 0;
the usage reports cached tokens; /metrics and /admin/status show the figures;
a flush reaches the rank, which then reports itself cleared and is forgotten;
malformed events and too many blocks are logged, never fatal.
usage: routerd_cache_test.py TEST ROUTERD WORKER; TEST: place | weight0 | junk."""
import json
import os
import re
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import routerd_test  # noqa: E402
from routerd_test import ADMIN_KEY, check, check_error, metric, request  # noqa: E402

BLOCK = 16
HELD = "".join(chr(ord("a") + i % 26) for i in range(200))   # 12 whole blocks of 16
PROMPT = HELD + "tail"   # 204 tokens: its first 12 blocks are HELD's


def complete(c, prompt):
    st, _, data = request(c.http, "POST", "/v1/completions",
                          {"model": "tandem-synthetic", "prompt": prompt, "max_tokens": 3})
    check(st == 200, "completion: %d %r" % (st, data))
    return json.loads(data)


def prefills(w):
    """The prefills a fake prefill rank served: [(tokens, cached)]."""
    return [(int(a), int(b)) for a, b in
            re.findall(r"^prefill \S+ tokens=(\d+) cached=(\d+)$", open(w.out).read(), re.M)]


def cache_of(c, node):
    return next(r for r in c.ranks() if r["node"] == node and r["role"] == "prefill")["cache"]


def start(c, *router_args, junk=False):
    c.start_router(*router_args)
    c.start_worker("d", "--role", "decode")
    pa = c.start_worker("pa", "--role", "prefill", "--cache-block", str(BLOCK), "--cache-prompt",
                        HELD, "--queued-tokens", "100", *(["--cache-junk"] if junk else []))
    pb = c.start_worker("pb", "--role", "prefill", "--cache-block", str(BLOCK))
    c.wait_up(3)
    c.wait(lambda: all(cache_of(c, n)["stats"] is not None for n in ("pa", "pb")),
           "the prefill ranks' first cache reports")
    return pa, pb


def lbl(node):
    return '{node="%s",rank="0",role="prefill"}' % node


def test_place(c):
    pa, pb = start(c)
    check("prefix cache blocks of 16 tokens" in open(c.rlog).read(),
          "the registration log names the cache")
    c.wait(lambda: cache_of(c, "pa")["blocks_tracked"] == 12, "pa's 12 blocks tracked")
    check(cache_of(c, "pb")["blocks_tracked"] == 0, "pb tracks blocks")
    check(cache_of(c, "pa")["block_tokens"] == BLOCK, "block_tokens: %r" % cache_of(c, "pa"))
    dec = next(r for r in c.ranks() if r["role"] == "decode")
    check("cache" not in dec, "a decode rank has a cache entry: %r" % dec)

    # pa: 100 queued + 204 - 192 cached = 112 < pb: 0 + 204 — pa, for its cache
    r = complete(c, PROMPT)
    check(prefills(pa) == [(204, 192)] and prefills(pb) == [],
          "placement: pa %r, pb %r" % (prefills(pa), prefills(pb)))
    u = r["usage"]
    check(u["prompt_tokens"] == 204 and u.get("prompt_tokens_details") == {"cached_tokens": 192},
          "usage: %r" % u)
    # a prompt it holds nothing of: by load (pb)
    r = complete(c, "z" * 40)
    check(len(prefills(pb)) == 1 and len(prefills(pa)) == 1, "by load: pb %r" % prefills(pb))
    check("prompt_tokens_details" not in r["usage"], "usage without a hit: %r" % r["usage"])

    # /metrics: the rank's figures and the router's counters
    c.wait(lambda: metric(c.http, "tandem_router_rank_cache_hit_tokens_total%s"
                          % lbl("pa")[:-1] + ',tier="pool"}') == 192, "pa's hit report")
    want = {
        "tandem_router_rank_prefill_placed_total" + lbl("pa"): 1,
        "tandem_router_rank_prefill_placed_total" + lbl("pb"): 1,
        "tandem_router_rank_prefill_prompt_tokens_total" + lbl("pa"): 204,
        "tandem_router_rank_cache_predicted_tokens_total" + lbl("pa"): 192,
        "tandem_router_rank_cache_reported_tokens_total" + lbl("pa"): 192,
        "tandem_router_rank_placed_by_cache_total" + lbl("pa"): 1,
        "tandem_router_rank_placed_by_cache_total" + lbl("pb"): 0,
        "tandem_router_rank_cache_lookup_tokens_total" + lbl("pa"): 204,
        "tandem_router_rank_cache_computed_tokens_total" + lbl("pa"): 12,
        "tandem_router_rank_cache_pool_blocks" + lbl("pa"): 12,
        lbl("pa").join(["tandem_router_rank_cache_bytes", ""])[:-1] + ',tier="pool"}': 12 * 4096,
        lbl("pa").join(["tandem_router_rank_cache_budget_bytes", ""])[:-1] + ',tier="host"}':
            64 << 20,
    }
    got = {k: metric(c.http, k) for k in want}
    check(got == want, "metrics: %r" % {k: v for k, v in got.items() if want[k] != v})
    s = cache_of(c, "pa")
    check(s["placed"] == 1 and s["placed_by_cache"] == 1 and s["reported_cached_tokens"] == 192
          and s["stats"]["hit_pool_tokens"] == 192, "status cache: %r" % s)

    # flush: unknown node 404; the node's ranks get it, then are forgotten
    st, _, data = request(c.admin, "POST", "/admin/cache/flush", {"node": "nope"}, key=ADMIN_KEY)
    check_error(st, data, 404, "node_not_found", "node")
    st, _, data = request(c.admin, "POST", "/admin/cache/flush", {"node": "pa"}, key=None)
    check(st == 401, "flush without the admin key: %d" % st)
    st, _, data = request(c.admin, "POST", "/admin/cache/flush", {"node": "d"}, key=ADMIN_KEY)
    check(st == 200 and json.loads(data)["ranks"] == 0, "flush of a node without caches: %r" % data)
    st, _, data = request(c.admin, "POST", "/admin/cache/flush", {"node": "pa"}, key=ADMIN_KEY)
    check(st == 200 and json.loads(data) == {"node": "pa", "status": "flushing", "ranks": 1},
          "flush: %d %r" % (st, data))
    c.wait(lambda: "cache_flush flushed by the operator" in open(pa.out).read(),
           "the flush at pa")
    c.wait(lambda: cache_of(c, "pa")["blocks_tracked"] == 0, "pa's blocks forgotten (cleared)")
    complete(c, PROMPT)
    check(len(prefills(pb)) == 2 and len(prefills(pa)) == 1,
          "after the flush, by load: pa %r, pb %r" % (prefills(pa), prefills(pb)))

    # a rank whose connection ends loses its set and its figures
    pa.send_signal(signal.SIGTERM)
    pa.wait(timeout=10)
    c.wait(lambda: cache_of(c, "pa")["stats"] is None, "pa's report gone with it")
    check(cache_of(c, "pa")["blocks_tracked"] == 0, "a dead rank keeps blocks")


def test_weight0(c):
    pa, pb = start(c, "--cache-weight", "0")
    c.wait(lambda: cache_of(c, "pa")["blocks_tracked"] == 12, "pa's 12 blocks tracked")
    complete(c, PROMPT)
    check(prefills(pb) == [(204, 0)] and prefills(pa) == [],
          "cache-weight 0: by load (pb): pa %r, pb %r" % (prefills(pa), prefills(pb)))
    check(metric(c.http, "tandem_router_rank_placed_by_cache_total" + lbl("pb")) == 0,
          "by_cache with weight 0")
    st, _, data = request(c.admin, "GET", "/admin/config", key=ADMIN_KEY)
    check(st == 200 and "cache-weight" in data.decode(), "cache-weight in the config view")


def test_junk(c):
    pa, pb = start(c, "--cache-max-blocks", "5", junk=True)
    log = lambda: open(c.rlog).read()   # noqa: E731
    c.wait(lambda: "seq went backwards" in log(), "the malformed events logged")
    check("seq skipped events" in log() and "hash 0 added" in log(), "malformed: %s" % log())
    check(cache_of(c, "pa")["blocks_tracked"] == 0, "pa's untrusted blocks kept")
    check(log().count("more than 5 cache blocks announced") == 1,
          "the cap logged once: %s" % log())
    # a rank with the blocks and under the cap holds 5 blocks: 80 of the prompt's tokens
    pc = c.start_worker("pc", "--role", "prefill", "--cache-block", str(BLOCK),
                        "--cache-prompt", HELD, "--queued-tokens", "50")
    c.wait(lambda: any(r["node"] == "pc" and r["state"] == "up" for r in c.ranks()), "pc up")
    c.wait(lambda: cache_of(c, "pc")["blocks_tracked"] == 5, "pc's blocks capped at 5")
    complete(c, PROMPT)   # pc: 50 + 204 - 80 = 174 < pa, pb: 204 (pa's 100 queued)
    check(len(prefills(pc)) == 1 and prefills(pc)[0][1] == 192,
          "pc: %r, pa %r, pb %r" % (prefills(pc), prefills(pa), prefills(pb)))
    check(metric(c.http, "tandem_router_rank_cache_predicted_tokens_total" + lbl("pc")) == 80,
          "predicted with the cap")
    check(all(p.poll() is None for p in c.procs), "a process died")


if __name__ == "__main__":
    sys.exit(routerd_test.main(globals()))
