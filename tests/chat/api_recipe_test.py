#!/usr/bin/env -S sh -c 'exec "${0%/*}/../../tools/python" "$0" "$@"'
# tests/chat/api_recipe_test.py — routerd's Messages and Responses adapters
# against the reference, deepseek-recipe 0.2.0: for every request of
# api_cases.py the prompt text and token ids routerd encodes (tools/api-encode)
# equal the recipe's conversion and V4.1 encoding of the same request, a
# request the recipe refuses is refused, and for the same model output the
# stream events equal the recipe's generators' (ids aside).
# The tokenizer is a tools/mk-tiny-model checkpoint's (the V4 vocabulary with
# the V4.1 chat format's special tokens), the one the e2e cluster serves.
# usage: api_recipe_test.py API_ENCODE MK_TINY_MODEL
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import api_cases  # noqa: E402

try:
    import deepseek_recipe as dr
except ImportError as e:
    print("SKIP: %s (pip install -r requirements.txt)" % e)
    sys.exit(77)

assert dr.__version__ == "0.2.0", dr.__version__
TMP = tempfile.TemporaryDirectory()
subprocess.run([sys.argv[2], os.path.join(TMP.name, "tiny")], check=True,
               stdout=subprocess.DEVNULL)
TOKJSON = os.path.join(TMP.name, "tiny", "tokenizer.json")
OPT = dr.ConversionOptions().with_model_alias(api_cases.M, dr.ModelVersion.DeepseekV41Flash)
OPT_OFF = dr.ConversionOptions(default_thinking_mode=False).with_model_alias(
    api_cases.M, dr.ModelVersion.DeepseekV41Flash)
ENC = dr.DeepseekV41Encoding().with_tokenizer(dr.Tokenizer.from_file(TOKJSON))
REQ = {"messages": dr.MessagesRequest, "responses": dr.ResponsesRequest}

# Refusals of routerd's that the recipe does not make, each for a reason
# docs/api.md gives: max_tokens is required, temperature is 0-1 and a message's
# role is user or assistant in Anthropic's API, unknown fields are refused as
# the API does, images are refused (the model reads text only).
OURS_ONLY = ["max_tokens: Field required",
             # Responses: images and files refused (text only), unknown item types and
             # hosted tools refused rather than dropped, structured output refused
             # until the grammar engine enforces it, background responses refused
             "Unsupported value for 'input[0].content[0]': content parts of type 'input_image'",
             "Unsupported value for 'input[0].type': input items of type 'foo'",
             "Unsupported value for 'tools[0].type': tools of type 'web_search'",
             # json_object without the word json: the recipe asks it of Responses'
             # input as OpenAI does (both refuse; listed for the message)
             "Unsupported value for 'background'", "temperature: must be between 0 and 1",
             "Unrecognized request argument supplied: bogus",
             "messages.0.role: the role must be 'user' or 'assistant'",
             "messages.0.content.0: content blocks of type 'image' are not supported"]


def recipe(api, body, opt=OPT):
    try:
        cr = REQ[api](body).convert(opt)
    except (dr.ConversionError, ValueError) as e:
        return {"error": str(e)}
    conv = cr.conversation
    return {"prompt": ENC.render_conversation(conv).prompt, "ids": ENC.encode(conv),
            "thinking": conv.thinking_mode, "cr": cr}


def recipe_events(api, body, pieces, finish, nprompt):
    req = REQ[api](body)
    echo = req.echo() if api == "responses" else None
    cr = req.convert(OPT)
    if api == "responses":
        gen = REQ[api].chunk_generator(cr, "resp_ID1", api_cases.M).with_echo(echo)
    else:
        gen = REQ[api].chunk_generator(cr, "ID1", api_cases.M)
    sp = dr.StreamProcessor(gen, cr.parsing_options)
    out = sp.push(dr.InferenceChunk.ready(prompt_usage=dr.PromptUsage(
        prompt_tokens=nprompt, prompt_cache_hit_tokens=0)))
    for p in pieces:   # a stop string ends the processor
        if not sp.finished:
            out += sp.push(dr.InferenceChunk.text(p, 1))
    if not sp.finished:
        out += sp.push(dr.InferenceChunk.finish(dr.InferenceFinishReason.Length if finish ==
                                                "length" else dr.InferenceFinishReason.Stop))
        out += sp.finish()
    R = dr.MessagesResponse if api == "messages" else dr.ResponsesResponse
    return [[R.sse_event_name(e), json.loads(e.to_json())] for e in out]


# What differs by design: times; "store" (the recipe stores nothing, routerd
# stores by default); reasoning_tokens (the recipe's text chunks count none,
# routerd counts the reasoning's tokens); metadata (the recipe's echo reports
# {}, routerd reports the request's, as OpenAI does).
UNEQUAL = ("created_at", "completed_at", "store", "reasoning_tokens", "metadata")


def scrub(v):
    """Tool-call ids are random on both sides: blanked; UNEQUAL fields dropped."""
    if isinstance(v, dict):
        return {k: ("ID" if k in ("id", "call_id") and isinstance(x, str) and
                    x.startswith("call_") else scrub(x))
                for k, x in v.items() if k not in UNEQUAL}
    if isinstance(v, list):
        return [scrub(x) for x in v]
    return v


def main():
    tool = sys.argv[1]
    cases = [{"api": "messages", "body": b} for b in api_cases.MESSAGES]
    cases += [{"api": "responses", "body": b} for b in getattr(api_cases, "RESPONSES", [])]
    cases += [{"api": a, "body": b, "default_thinking": False}
              for a, b in api_cases.NO_DEFAULT_THINKING]
    streams = [{"api": a, "body": b, "pieces": p, "finish": f}
               for a, b, p, f in [("messages",) + s for s in api_cases.STREAMS]
               + getattr(api_cases, "RSTREAMS", [])]
    got = json.loads(subprocess.run([tool, "--tokenizer", TOKJSON, "--model", api_cases.M, "-"],
                                    input=json.dumps({"cases": cases + streams}).encode(),
                                    stdout=subprocess.PIPE, check=True).stdout)["results"]
    bad = equal = refused = 0
    for i, c in enumerate(cases):
        r = recipe(c["api"], c["body"], OPT_OFF if c.get("default_thinking") is False else OPT)
        g = got[i]
        what = "%s case %d" % (c["api"], i)
        if "error" in r:
            if "status" not in g:
                print("FAILED: %s: the recipe refuses (%s), routerd does not" % (what, r["error"]))
                bad += 1
            else:
                refused += 1
            continue
        if "status" in g:
            if not any(g["error"].startswith(o) for o in OURS_ONLY):
                print("FAILED: %s: routerd refuses: %s" % (what, g["error"]))
                bad += 1
            else:
                refused += 1
            continue
        if g["prompt"] != r["prompt"] or g["ids"] != r["ids"] or g["thinking"] != r["thinking"]:
            print("FAILED: %s: prompt differs\n  routerd: %r\n  recipe:  %r"
                  % (what, g["prompt"], r["prompt"]))
            bad += 1
            continue
        io = r["cr"].inference_options
        if io.max_tokens is not None and io.max_tokens != g["max_tokens"]:
            print("FAILED: %s: max_tokens %d, recipe %d" % (what, g["max_tokens"], io.max_tokens))
            bad += 1
            continue
        equal += 1
    nstream = 0
    for k, s in enumerate(streams):
        g = got[len(cases) + k]
        if "events" not in g:
            print("FAILED: stream %d: routerd refused the request: %s" % (k, g.get("error")))
            bad += 1
            continue
        want = recipe_events(s["api"], s["body"], s["pieces"], s["finish"], len(g["ids"]))
        if scrub(g["events"]) != scrub(want):
            print("FAILED: stream %d differs" % k)
            for a, b in zip(scrub(g["events"]) + [None] * 99, scrub(want)):
                print("  %s %s\n  %s %s" % ("  " if a == b else "!=", json.dumps(a),
                                           "  ", json.dumps(b)))
            bad += 1
        else:
            nstream += 1
    print("%d requests with equal prompts and ids, %d refused by both (or by routerd, as "
          "documented), %d streams with equal events; %d failures"
          % (equal, refused, nstream, bad))
    if equal < 30:
        print("FAILED: too few prompts compared")
        bad += 1
    sys.exit(1 if bad else 0)


main()
