#!/usr/bin/env -S sh -c 'exec "${0%/*}/../../../tools/python" "$0" "$@"'
"""tests/integration/e2e/structured_test.py — structured output end to end on
the tiny V4.1 checkpoint (tools/mk-tiny-model), 2 prefill x 2 decode, through
the openai client. With random weights the grammar does all the work:

  structured-dep  prefilld --dep over 2 ranks, decoded --dep over 2: concurrent
              constrained requests, each rank sampling its own rows under
              its requests' constraints; every reply valid
  structured  client.chat.completions.parse with a pydantic model (strict
              json_schema), json_object, vLLM's guided_choice / guided_regex /
              structured_outputs.json and the completions API, a reply cut by
              max_tokens (length, a valid prefix), thinking whose reasoning
              ends by logit_bias (free reasoning, constrained content), and
              the 400s that name the problem (unsupported keyword,
              unsatisfiable schema, a regex that does not compile, json_object
              without 'json', a spec over the size limit)

usage: structured_test.py SCENARIO BUILDDIR"""
import json
import os
import re
import sys
import threading
from typing import List, Literal

import openai
from pydantic import BaseModel, Field
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import check, run_scenario  # noqa: E402
from e2e_test import tiny_model  # noqa: E402

MODEL = "tandem-deepseek-v41"


class Pet(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=30)
    kind: Literal["cat", "dog", "fish"]
    tags: List[Literal["a", "b"]] = Field(max_length=3)


def bad_request(fn, words, what):
    try:
        fn()
    except openai.BadRequestError as e:
        msg = str(e)
        check(all(w in msg for w in words), "%s: 400 %r lacks %r" % (what, msg, words))
        return
    check(False, "%s: no 400" % what)


def test_structured(c):
    model = tiny_model(c)
    c.up(prefill=2, decode=2, decode_ranks=1, router=("--tokenizer", model))
    client = c.client()
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    msgs = [{"role": "user", "content": "Describe a pet as JSON."}]
    off = {"chat_template_kwargs": {"thinking": False}}

    # pydantic through the openai client: every reply parses and validates
    for seed in range(4):
        r = client.chat.completions.parse(model=MODEL, messages=msgs, response_format=Pet,
                                          temperature=1, seed=seed, max_tokens=256,
                                          extra_body=off)
        pet = r.choices[0].message.parsed
        check(r.choices[0].finish_reason == "stop" and isinstance(pet, Pet),
              "parse seed %d: %r %r %r" % (seed, r.choices[0].finish_reason,
                                           r.choices[0].message.content, r))
    # json_object: a JSON object
    r = client.chat.completions.create(model=MODEL, messages=msgs, temperature=1, seed=3,
                                       max_tokens=512, response_format={"type": "json_object"},
                                       extra_body=off)
    if r.choices[0].finish_reason == "stop":
        check(isinstance(json.loads(r.choices[0].message.content), dict),
              "json_object: %r" % r.choices[0].message.content)
    # vLLM's fields, chat and completions
    r = client.chat.completions.create(model=MODEL, messages=msgs, temperature=1, seed=5,
                                       max_tokens=32,
                                       extra_body={"guided_choice": ["yes", "no", "perhaps"],
                                                   **off})
    check(r.choices[0].message.content in ("yes", "no", "perhaps"),
          "guided_choice: %r" % r.choices[0].message.content)
    r = client.completions.create(model=MODEL, prompt="Code:", temperature=1, seed=6,
                                  max_tokens=32, extra_body={"guided_regex": "[A-Z]{3}-[0-9]{2}"})
    check(re.fullmatch("[A-Z]{3}-[0-9]{2}", r.choices[0].text) is not None,
          "guided_regex: %r" % r.choices[0].text)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1,
                                                     "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    r = client.completions.create(model=MODEL, prompt="Number:", temperature=1, seed=7,
                                  max_tokens=32,
                                  extra_body={"structured_outputs": {"json": schema}})
    v = json.loads(r.choices[0].text)
    check(1 <= v["n"] <= 9, "structured_outputs.json: %r" % r.choices[0].text)
    # cut by max_tokens: length, and the text is a valid prefix
    r = client.chat.completions.create(model=MODEL, messages=msgs, temperature=1, seed=8,
                                       max_tokens=3, extra_body=off,
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "p", "strict": True,
                                           "schema": Pet.model_json_schema()}})
    text = r.choices[0].message.content
    check(r.choices[0].finish_reason == "length" and text.startswith("{\""),
          "max_tokens 3: %r %r" % (r.choices[0].finish_reason, text))

    # thinking: the reasoning is free, the content constrained after </think>
    unthink = tok.token_to_id("</think>")
    eos = tok.token_to_id("<｜end▁of▁sentence｜>")
    r = client.chat.completions.create(
        model=MODEL, messages=msgs, temperature=1, seed=9, max_tokens=256,
        logit_bias={str(unthink): 6, str(eos): -100},
        extra_body={"chat_template_kwargs": {"thinking": True},
                    "guided_choice": ["alpha", "beta"]})
    m = r.choices[0].message
    check(m.content in ("alpha", "beta"), "thinking: content %r" % m.content)
    check(getattr(m, "reasoning_content", None) not in (None, "alpha", "beta"),
          "thinking: reasoning %r" % getattr(m, "reasoning_content", None))

    # bad input: 400s that name the problem, the cluster still serving
    def rf(schema):
        return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema,
                                                        "strict": True}}
    bad_request(lambda: client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=8,
        response_format=rf({"type": "object", "properties": {"x": {"patternProperties": {}}}})),
        ["response_format.json_schema.schema.properties.x.patternProperties is not supported"],
        "unsupported keyword")
    bad_request(lambda: client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=8,
        response_format=rf({"type": "integer", "minimum": 9, "maximum": 2})),
        ["minimum is above maximum"], "unsatisfiable bounds")
    bad_request(lambda: client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=8,
        response_format=rf({"type": "object", "properties": {"a": {"$ref": "#"}},
                            "required": ["a"], "additionalProperties": False})),
        ["no finite string"], "recursion without a base case")
    bad_request(lambda: client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=8, extra_body={"guided_regex": "a(b"}),
        ["guided_regex", "invalid regex"], "a regex that does not compile")
    bad_request(lambda: client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
        response_format={"type": "json_object"}), ["must contain the word 'json'"],
        "json_object without json")
    bad_request(lambda: client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=8,
        response_format=rf({"enum": ["x" * 1000] * 300})), ["over the limit"],
        "a schema over the size limit")
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0)
    check(r.choices[0].finish_reason in ("stop", "length"), "still serving")
    c.wait_idle()


def test_structured_dep(c):
    model = tiny_model(c)
    c.up(prefill=1, decode=1, prefill_ranks=2, decode_ranks=2, router=("--tokenizer", model),
         prefill_flags=("--chunk-tokens", "8", "--dep", "--compute-threads", "1"),
         decode_flags=("--dep", "--compute-threads", "1"))
    check(re.search(r"dep group of 2 ranks", c.workers["prefill0"].text()),
          "prefilld: no dep group in its ready line")
    client = c.client()
    off = {"chat_template_kwargs": {"thinking": False}}
    results = [None] * 8

    def one(i):
        msgs = [{"role": "user", "content": "JSON pet number %d, please." % i}]
        try:
            if i % 2 == 0:
                r = client.chat.completions.parse(model=MODEL, messages=msgs, response_format=Pet,
                                                  temperature=1, seed=i, max_tokens=256,
                                                  extra_body=off)
                results[i] = r.choices[0].message.parsed
            else:
                r = client.chat.completions.create(
                    model=MODEL, messages=msgs, temperature=1, seed=i, max_tokens=16,
                    extra_body={"guided_choice": ["red", "green", "blue"], **off})
                results[i] = r.choices[0].message.content
        except Exception as e:  # reported below
            results[i] = e

    for rnd in range(2):
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(results))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, r in enumerate(results):
            ok = isinstance(r, Pet) if i % 2 == 0 else r in ("red", "green", "blue")
            check(ok, "dep round %d request %d: %r" % (rnd, i, r))
    c.wait_idle()


def main():
    return run_scenario(globals(), sys.argv[1], sys.argv[2])


if __name__ == "__main__":
    sys.exit(main())
