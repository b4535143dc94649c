#!/usr/bin/env -S sh -c 'exec "${0%/*}/../../../tools/python" "$0" "$@"'
"""tests/integration/e2e/api_clients_test.py — the Responses and Messages APIs
through the official clients (the openai and anthropic packages,
requirements.txt) against a real cluster: 2 prefill x 2 decode daemons on a
tools/mk-tiny-model checkpoint (its context is 1024 tokens).
- openai: client.responses.create and client.responses.stream, a
  function-tool round trip through previous_response_id (the stored
  conversation holds the call the output answers);
- anthropic: client.messages.create, client.messages.stream, a tool_use ->
  tool_result round trip, client.messages.count_tokens equal to the usage's
  input_tokens;
- a request chained by previous_response_id continues on the decode rank
  that kept the previous turn's state (decoded --retain): its cached tokens
  are that turn's prompt and reply;
- structured output: Responses' text.format (json_schema) and Messages'
  output_config.format hold the reply to the schema (random weights: the
  grammar does all the work);
- thinking.budget_tokens caps the reasoning: greedy, the reply of a budget
  shorter than the uncapped reasoning ends after exactly that many tokens,
  its thinking a prefix of the uncapped one's.
usage: api_clients_test.py SCENARIO BUILDDIR  (SCENARIO: api-clients)"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import KEY, SLOW, check, run_scenario  # noqa: E402

import anthropic  # noqa: E402
import openai  # noqa: E402
from e2e_test import metric_value  # noqa: E402

M = "tandem-deepseek-v41"
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
T0 = {"temperature": 0}   # (this anthropic client has no temperature parameter)
A_WEATHER = {"name": "get_weather", "description": "Weather of a city.",
             "input_schema": WEATHER["parameters"]}


def check_responses(c, client):
    r = client.responses.create(model=M, input="Say hi.", max_output_tokens=16, temperature=0,
                                metadata={"run": "e2e"})
    check(r.object == "response" and r.id.startswith("resp_") and
          r.status in ("completed", "incomplete"), "create: %r" % r)
    check(r.usage.output_tokens >= 1 and r.metadata == {"run": "e2e"}, "usage %r" % r.usage)
    got = client.responses.retrieve(r.id)
    check(got.id == r.id and got.output == r.output, "retrieve: %r" % got)

    events, final = [], None
    with client.responses.stream(model=M, input="Say hi.", max_output_tokens=16,
                                 temperature=0) as s:
        for ev in s:
            events.append(ev.type)
            if ev.type in ("response.completed", "response.incomplete"):
                final = ev.response   # (get_final_response wants a completed one)
    check(events[0] == "response.created" and events[-1] in ("response.completed",
                                                             "response.incomplete"),
          "stream events %r" % events)
    def texts(resp):   # item ids carry the response's id: the items' kinds and texts
        return [(it.type, [p.text for p in (getattr(it, "content", None) or [])])
                for it in resp.output]
    check(texts(final) == texts(r) and final.usage.output_tokens == r.usage.output_tokens,
          "streamed %r, created %r" % (final.output, r.output))

    # A function-tool round trip: the call (as the client's history) is stored
    # with the first response; the second answers it by previous_response_id.
    first = client.responses.create(
        model=M, tools=[WEATHER], max_output_tokens=8, temperature=0,
        reasoning={"effort": "none"},
        input=[{"role": "user", "content": "Weather in Paris?"},
               {"type": "function_call", "call_id": "call_e2e_1", "name": "get_weather",
                "arguments": '{"city": "Paris"}'},
               {"type": "function_call_output", "call_id": "call_e2e_1", "output": "18C"}])
    second = client.responses.create(
        model=M, tools=[WEATHER], max_output_tokens=8, temperature=0,
        reasoning={"effort": "none"}, previous_response_id=first.id,
        input=[{"type": "function_call", "call_id": "call_e2e_2", "name": "get_weather",
                "arguments": '{"city": "Lyon"}'},
               {"type": "function_call_output", "call_id": "call_e2e_2", "output": "12C"}])
    check(second.previous_response_id == first.id and
          second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens,
          "chained: %r after %r" % (second.usage, first.usage))
    try:
        client.responses.create(model=M, input="x", previous_response_id="resp_missing")
        check(False, "an unknown previous_response_id was taken")
    except Exception as e:  # openai.NotFoundError
        check(getattr(e, "status_code", None) == 404, "unknown previous id: %r" % e)
    client.responses.delete(second.id)


def check_messages(c):
    # This client sends anthropic-version 2026-10-21 by default, a version
    # this server does not speak (docs/api.md): it is told 2023-06-01.
    a = anthropic.Anthropic(base_url="http://127.0.0.1:%d" % c.http, api_key=KEY,
                            max_retries=0, timeout=30 * SLOW,
                            default_headers={"anthropic-version": "2023-06-01"})
    msgs = [{"role": "user", "content": "Say hi."}]
    m = a.messages.create(model=M, max_tokens=16, messages=msgs, extra_body=T0,
                          thinking={"type": "disabled"})
    check(m.type == "message" and m.role == "assistant" and m.stop_reason in
          ("end_turn", "max_tokens"), "create: %r" % m)
    n = a.messages.count_tokens(model=M, messages=msgs, thinking={"type": "disabled"})
    check(n.input_tokens == m.usage.input_tokens, "count_tokens %d, usage %d"
          % (n.input_tokens, m.usage.input_tokens))
    with a.messages.stream(model=M, max_tokens=16, messages=msgs, extra_body=T0,
                           thinking={"type": "disabled"}) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    want = "".join(b.text for b in m.content if b.type == "text")
    check(text == want and final.usage.output_tokens == m.usage.output_tokens,
          "streamed %r, created %r" % (text, want))

    # tool_use -> tool_result, streamed.
    hist = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_e2e", "name": "get_weather",
                 "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_e2e", "content": "18C"}]}]
    with a.messages.stream(model=M, max_tokens=12, messages=hist, tools=[A_WEATHER],
                           extra_body=T0) as s:
        final = s.get_final_message()
    check(final.stop_reason in ("end_turn", "max_tokens", "tool_use") and
          final.content and final.content[0].type == "thinking", "tool round: %r" % final)
    try:
        a.messages.create(model=M, max_tokens=8, messages=[hist[0], hist[2]])
        check(False, "a tool_result without its tool_use was taken")
    except anthropic.BadRequestError as e:
        check("no tool_use block with id 'toolu_e2e'" in str(e), "message %s" % e)
    return a


PET = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 30},
    "kind": {"enum": ["cat", "dog", "fish"]}},
    "required": ["name", "age", "kind"], "additionalProperties": False}


def pet_ok(text):
    import json
    v = json.loads(text)
    return (set(v) == {"name", "age", "kind"} and isinstance(v["name"], str) and
            len(v["name"]) <= 8 and 0 <= v["age"] <= 30 and v["kind"] in ("cat", "dog", "fish"))


def check_structured(c, client, a):
    for seed in range(2):   # (Responses has no seed: two random draws)
        r = client.responses.create(
            model=M, input="Describe a pet as JSON.", max_output_tokens=256, temperature=1,
            reasoning={"effort": "none"},
            text={"format": {"type": "json_schema", "name": "pet", "strict": True,
                             "schema": PET}})
        check(r.status == "completed" and pet_ok(r.output_text),
              "text.format seed %d: %s %r" % (seed, r.status, r.output_text))
    m = a.messages.create(model=M, max_tokens=256, thinking={"type": "disabled"},
                          messages=[{"role": "user", "content": "Describe a pet."}],
                          output_config={"format": {"type": "json_schema", "schema": PET}},
                          extra_body={"temperature": 1})
    text = "".join(b.text for b in m.content if b.type == "text")
    check(m.stop_reason == "end_turn" and pet_ok(text),
          "output_config.format: %s %r" % (m.stop_reason, text))
    try:
        client.responses.create(model=M, input="x", text={"format": {
            "type": "json_schema", "name": "bad",
            "schema": {"type": "object", "properties": {"x": {"patternProperties": {}}}}}})
        check(False, "an unsupported schema keyword was taken")
    except openai.BadRequestError as e:
        check("text.format.schema.properties.x.patternProperties is not supported" in str(e),
              "schema refusal: %s" % e)


def check_chain_kv(c, client):
    """Thinking off, the next turn's prompt extends the kept state token for
    token: it is prefilled on the decode rank that kept it."""
    q = dict(model=M, max_output_tokens=8, temperature=0, reasoning={"effort": "none"})
    before = metric_value(c, "tandem_router_continue_total")
    kept = metric_value(c, "tandem_router_kept_states_total")
    first = client.responses.create(input="Tell me about rivers and stones and clouds.", **q)
    c.wait(lambda: metric_value(c, "tandem_router_kept_states_total") > kept,
           "the first turn's state kept")
    second = client.responses.create(input="And more?", previous_response_id=first.id, **q)
    want = first.usage.input_tokens + first.usage.output_tokens - 1
    check(first.status == "incomplete", "the first turn ended early: %r" % first.status)
    check(second.usage.input_tokens_details.cached_tokens == want and
          metric_value(c, "tandem_router_continue_total") == before + 1,
          "chained: %d cached (want %d), continues %d -> %d"
          % (second.usage.input_tokens_details.cached_tokens, want, before,
             metric_value(c, "tandem_router_continue_total")))


def check_budget(c, client, a):
    """Greedy: the uncapped reasoning's tokens (the Responses usage), then a
    budget below them ends the reply after exactly budget tokens."""
    q = "Think about the number seven."
    full = client.responses.create(model=M, input=q, max_output_tokens=40, temperature=0)
    r = full.usage.output_tokens_details.reasoning_tokens
    think = "".join(p.text for it in full.output if it.type == "reasoning"
                    for p in (it.content or []))
    budget = 6
    check(r > budget, "the uncapped reasoning is %d tokens: pick a shorter budget" % r)
    m = a.messages.create(model=M, max_tokens=40, extra_body=T0,
                          thinking={"type": "enabled", "budget_tokens": budget},
                          messages=[{"role": "user", "content": q}])
    got = "".join(b.thinking for b in m.content if b.type == "thinking")
    check(m.stop_reason == "max_tokens" and m.usage.output_tokens == budget,
          "budget %d: %s after %d tokens" % (budget, m.stop_reason, m.usage.output_tokens))
    check(think.startswith(got) and len(got) < len(think) and
          not [b for b in m.content if b.type == "text"],
          "capped thinking %r, uncapped %r" % (got, think))


def test_api_clients(c):
    model = c.path("tiny-model")
    r = subprocess.run([os.path.join(c.build, "tools", "mk-tiny-model"), model],
                       capture_output=True, timeout=60)
    check(r.returncode == 0, "mk-tiny-model: %r" % r.stderr[-400:])
    c.engine = ["--engine", "deepseek-v41", "--model", model]
    c.up(prefill=2, decode=2, decode_ranks=1,
         router=("--tokenizer", model, "--responses-dir", c.path("responses")),
         decode_flags=("--retain", "4"))
    client = c.client()
    check_responses(c, client)
    check_chain_kv(c, client)
    a = check_messages(c)
    check_structured(c, client, a)
    check_budget(c, client, a)
    for d in ("decode0", "decode1"):   # their kept states let go of
        c.tandemctl("drain", d)
    c.wait_idle()


if __name__ == "__main__":
    sys.exit(run_scenario(globals(), sys.argv[1], sys.argv[2]))
