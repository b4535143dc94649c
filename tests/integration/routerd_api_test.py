#!/usr/bin/env -S sh -c 'exec "${0%/*}/../../tools/python" "$0" "$@"'
"""tests/integration/routerd_api_test.py — the Messages API (and the
Responses API) on routerd with fake worker ranks: answers and streams in the
protocol's shapes, errors in its format with precise messages (also the
refusals the HTTP layer makes before a route runs), x-api-key, the version
header, count_tokens, the model list in Anthropic's shape.
The Responses store: a stored response is found after a restart, another
key's GET and DELETE get 404, the store keeps within its byte budget, and
two routers sharing its directory never read part of a file.
usage: routerd_api_test.py TEST ROUTERD WORKER; TEST: messages | responses |
store."""
import json
import os
import re
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import routerd_test  # noqa: E402
from routerd_test import KEY, check, request  # noqa: E402

M = "tandem-synthetic"
AV = {"anthropic-version": "2023-06-01"}


def msg(port, body, key=KEY, headers=AV):
    return request(port, "POST", "/v1/messages", body, key=key, headers=headers)


def body(**kw):
    b = {"model": M, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    b.update(kw)
    return b


def check_aerr(st, data, want, typ, needle):
    """Anthropic's error format: {"type":"error","error":{"type","message"}}."""
    check(st == want, "status %d, wanted %d: %r" % (st, want, data))
    e = json.loads(data)
    check(e.get("type") == "error" and set(e["error"]) == {"type", "message"}, "shape %r" % e)
    check(e["error"]["type"] == typ, "error type %r, wanted %r" % (e["error"]["type"], typ))
    check(needle in e["error"]["message"], "message %r lacks %r" % (e["error"]["message"], needle))


def sse(port, b, headers=AV):
    """A streamed Messages request: [(event, data)]."""
    st, r, data = request(port, "POST", "/v1/messages", b, headers=headers)
    check(st == 200 and r.getheader("Content-Type") == "text/event-stream", "stream %d" % st)
    out = []
    for block in data.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = dict(l.split(": ", 1) for l in block.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_messages(c):
    c.start_router("--http-read-timeout", "1s")
    # Refusals before any worker: Anthropic's format on its routes only.
    st, _, data = msg(c.http, body(), key=None)
    check_aerr(st, data, 401, "authentication_error", "API key")
    st, r, data = msg(c.http, body())
    check_aerr(st, data, 529, "overloaded_error", "overloaded")
    check(r.getheader("Retry-After") == "1", "Retry-After %r" % r.getheader("Retry-After"))
    st, _, data = request(c.http, "POST", "/v1/chat/completions",
                          {"model": M, "messages": [{"role": "user", "content": "x"}]})
    check(st == 503 and "code" in json.loads(data)["error"], "chat keeps OpenAI's format")
    # A refusal of the HTTP layer (a body that never comes: 408) on /v1/messages.
    s = socket.create_connection(("127.0.0.1", c.http), timeout=30)
    s.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
    got = b""
    while True:
        d = s.recv(4096)
        if not d:
            break
        got += d
    s.close()
    head, _, payload = got.partition(b"\r\n\r\n")
    check(head.startswith(b"HTTP/1.1 408"), "408 head %r" % head[:40])
    check(json.loads(payload)["type"] == "error", "408 in Anthropic's format: %r" % payload)

    c.start_worker("fake")
    c.wait_up(2)
    st, r, data = msg(c.http, body(), key=None, headers=dict(AV, **{"x-api-key": KEY}))
    check(st == 200, "x-api-key: %d %r" % (st, data))
    m = json.loads(data)
    check(m["type"] == "message" and m["role"] == "assistant" and m["id"].startswith("msg_"),
          "message %r" % m)
    check(m["content"] == [{"type": "text", "text": "the quick "}], "content %r" % m["content"])
    check(m["stop_reason"] == "max_tokens" and m["usage"]["output_tokens"] == 10, "stop %r" % m)
    check(m["usage"]["input_tokens"] == len("user: hi\nassistant: "), "usage %r" % m["usage"])
    st, _, data = msg(c.http, body(), key="sk-wrong", headers=dict(AV, **{"x-api-key": "nope"}))
    check_aerr(st, data, 401, "authentication_error", "API key")
    # Bearer works too; beta headers are ignored; no version header is the one version.
    st, _, data = msg(c.http, body(), headers={"anthropic-beta": "whatever-2025"})
    check(st == 200, "no version, a beta header: %d" % st)
    st, _, data = msg(c.http, body(stop_sequences=["brown"], max_tokens=40))
    m = json.loads(data)
    check(m["stop_reason"] == "stop_sequence" and m["stop_sequence"] == "brown" and
          m["content"][0]["text"] == "the quick ", "stop sequence %r" % m)

    st, _, data = msg(c.http, body(stop_sequences=["zzz", "brown", "qu"], max_tokens=40))
    m = json.loads(data)
    check(m["stop_reason"] == "stop_sequence" and m["stop_sequence"] == "qu" and
          m["content"][0]["text"] == "the ", "which stop sequence %r" % m)
    ev = sse(c.http, body(stream=True, max_tokens=15))
    names = [e for e, _ in ev]
    check(names[:3] == ["message_start", "content_block_start", "ping"] and
          names[-3:] == ["content_block_stop", "message_delta", "message_stop"], "events %r" % names)
    check(all(d["type"] == e for e, d in ev), "event names equal their types")
    text = "".join(d["delta"]["text"] for e, d in ev if e == "content_block_delta")
    check(text == "the quick brown", "streamed %r" % text)
    md = ev[-2][1]
    check(md["delta"]["stop_reason"] == "max_tokens" and md["usage"]["output_tokens"] == 15,
          "message_delta %r" % md)

    st, _, data = request(c.http, "POST", "/v1/messages/count_tokens",
                          {"model": M, "messages": [{"role": "user", "content": "hello"}]},
                          headers=AV)
    check(st == 200 and json.loads(data) == {"input_tokens": len("user: hello\nassistant: ")},
          "count_tokens %d %r" % (st, data))
    # count_tokens has no max_tokens: a thinking budget is not held against one
    st, _, data = request(c.http, "POST", "/v1/messages/count_tokens",
                          {"model": M, "messages": [{"role": "user", "content": "hello"}],
                           "thinking": {"type": "enabled", "budget_tokens": 4096}},
                          headers=AV)
    check(st == 200, "count_tokens with a thinking budget: %d %r" % (st, data))
    st, _, data = msg(c.http, body(thinking={"type": "enabled", "budget_tokens": 10}))
    check_aerr(st, data, 400, "invalid_request_error",
               "thinking.budget_tokens: must be less than max_tokens")
    st, _, data = request(c.http, "GET", "/v1/models", headers=AV)
    d = json.loads(data)
    check(d["data"][0]["type"] == "model" and d["data"][0]["id"] == M and
          d["has_more"] is False, "anthropic models %r" % d)
    st, _, data = request(c.http, "GET", "/v1/models")
    check(json.loads(data)["object"] == "list", "openai models")

    # Bad input: each refused in Anthropic's format, precisely.
    for b, hdr, typ, needle in [
        (body(), {"anthropic-version": "2024-01-01"}, "invalid_request_error",
         "'2024-01-01' is not a version this server speaks"),
        ({"model": M, "messages": [{"role": "user", "content": "x"}]}, AV,
         "invalid_request_error", "max_tokens: Field required"),
        (body(messages=[{"role": "user", "content": [{"type": "foo"}]}]), AV,
         "invalid_request_error", "messages.0.content.0: a user message cannot hold a content "
         "block of type 'foo'"),
        (body(messages=[{"role": "user", "content": [{"type": "tool_result",
                                                       "tool_use_id": "t9", "content": "x"}]}]),
         AV, "invalid_request_error", "no tool_use block with id 't9' in the previous message"),
        (body(tools=[{"type": "web_search_20250305", "name": "web_search"}]), AV,
         "invalid_request_error", "server tools such as web search"),
        (body(temperature=1.5), AV, "invalid_request_error", "temperature: must be between 0 and 1"),
        (body(model="nope"), AV, "not_found_error", "nope"),
        ("{not json", AV, "invalid_request_error", "not valid JSON"),
    ]:
        st, _, data = msg(c.http, b, headers=hdr)
        check_aerr(st, data, 404 if typ == "not_found_error" else 400, typ, needle)


KEY2 = "sk-test-2"


def two_keys(c):
    with open(c.path("keys"), "w") as f:
        f.write("%s\n%s\n" % (KEY, KEY2))


def resp(port, b, key=KEY):
    st, r, data = request(port, "POST", "/v1/responses", b, key=key)
    return st, json.loads(data)


def check_oerr(st, data, want, needle, param=None):
    check(st == want, "status %d, wanted %d: %r" % (st, want, data))
    e = json.loads(data)["error"]
    check(set(e) == {"message", "type", "param", "code"}, "error fields %r" % e)
    check(needle in e["message"], "message %r lacks %r" % (e["message"], needle))
    if param is not None:
        check(e["param"] == param, "param %r, wanted %r" % (e["param"], param))


def test_responses(c):
    two_keys(c)
    store = c.path("store")
    c.start_router("--responses-dir", store)
    c.start_worker("fake")
    c.wait_up(2)
    st, r = resp(c.http, {"model": M, "input": "hi", "max_output_tokens": 10,
                          "metadata": {"k": "v"}})
    check(st == 200 and r["object"] == "response" and r["id"].startswith("resp_"), "resp %r" % r)
    check(r["status"] == "incomplete" and r["incomplete_details"] == {"reason":
                                                                      "max_output_tokens"},
          "incomplete %r" % r)
    check(r["output"][0]["type"] == "message" and
          r["output"][0]["content"][0]["text"] == "the quick ", "output %r" % r["output"])
    check(r["store"] is True and r["metadata"] == {"k": "v"} and r["max_output_tokens"] == 10,
          "echo %r" % r)
    check(r["usage"]["input_tokens"] == len("user: hi\nassistant: ") and
          r["usage"]["output_tokens"] == 10, "usage %r" % r["usage"])
    fid = r["id"]
    check(os.path.exists(os.path.join(store, fid + ".json")), "stored file")
    check(os.stat(os.path.join(store, fid + ".json")).st_mode & 0o777 == 0o600, "mode 0600")

    # GET, another key's GET and DELETE: 404; cancel: only background ones.
    st, _, data = request(c.http, "GET", "/v1/responses/" + fid)
    check(st == 200 and json.loads(data) == r, "GET %d %r" % (st, data))
    for m in ("GET", "DELETE"):
        st, _, data = request(c.http, m, "/v1/responses/" + fid, key=KEY2)
        check_oerr(st, data, 404, "No response found with id '%s'" % fid)
    st, _, data = request(c.http, "POST", "/v1/responses/%s/cancel" % fid)
    check_oerr(st, data, 400, "Only responses created with background")
    st, _, data = request(c.http, "POST", "/v1/responses/resp_nope/cancel")
    check_oerr(st, data, 404, "No response found")
    st, _, data = request(c.http, "GET", "/v1/responses/../../etc/passwd")
    check(st == 404, "a path is no id: %d" % st)

    # previous_response_id: the stored conversation, then the new input.
    st, r2 = resp(c.http, {"model": M, "input": "more", "previous_response_id": fid,
                           "max_output_tokens": 3})
    check(st == 200 and r2["previous_response_id"] == fid, "chained %r" % r2)
    want = len("user: hi\nassistant: the quick \nuser: more\nassistant: ")
    check(r2["usage"]["input_tokens"] == want, "chained prompt %d, wanted %d"
          % (r2["usage"]["input_tokens"], want))
    st, _, data = request(c.http, "POST", "/v1/responses",
                          {"model": M, "input": "x", "previous_response_id": fid}, key=KEY2)
    check_oerr(st, data, 404, "Previous response with id '%s' not found" % fid,
               "previous_response_id")
    st, _, data = request(c.http, "POST", "/v1/responses",
                          {"model": M, "input": "x", "previous_response_id": "resp_none"})
    check_oerr(st, data, 404, "not found", "previous_response_id")

    # store false: answered, not stored.
    st, r3 = resp(c.http, {"model": M, "input": "hi", "max_output_tokens": 2, "store": False})
    check(r3["store"] is False and not os.path.exists(os.path.join(store, r3["id"] + ".json")),
          "store false %r" % r3)

    # Streaming: OpenAI's event sequence with sequence numbers.
    st, rr, data = request(c.http, "POST", "/v1/responses",
                           {"model": M, "input": "hi", "max_output_tokens": 5, "stream": True})
    ev = [(l.split("\n")[0][7:], json.loads(l.split("\n")[1][6:]))
          for l in data.decode().split("\n\n") if l.strip()]
    names = [n for n, _ in ev]
    check(names[:4] == ["response.created", "response.in_progress",
                        "response.output_item.added", "response.content_part.added"] and
          names[-4:] == ["response.output_text.done", "response.content_part.done",
                         "response.output_item.done", "response.incomplete"], "events %r" % names)
    check([d["sequence_number"] for _, d in ev] == list(range(len(ev))), "sequence numbers")
    text = "".join(d["delta"] for n, d in ev if n == "response.output_text.delta")
    check(text == "the q", "streamed %r" % text)
    sid = ev[0][1]["response"]["id"]
    st, _, data = request(c.http, "GET", "/v1/responses/" + sid)
    check(st == 200 and json.loads(data)["output"] == ev[-1][1]["response"]["output"],
          "stored stream")

    # Bad input, in OpenAI's format, precisely.
    for b, want, needle, param in [
        ({"model": M, "input": [{"type": "function_call_output", "call_id": "zz",
                                 "output": "x"}]}, 400,
         "no function_call item with this call_id", "input[0].call_id"),
        ({"model": M, "input": [{"type": "mystery"}]}, 400,
         "input items of type 'mystery' are not supported", "input[0].type"),
        ({"model": M, "input": "x", "text": {"format": {"type": "json_schema", "name": "a",
                                                        "schema": {"type": "object"}}}}, 400,
         "structured output needs the model's tokenizer", "text.format"),
        ({"model": M, "input": "x", "tools": [{"type": "web_search"}]}, 400,
         "tools of type 'web_search'", "tools[0].type"),
        ({"model": M}, 400, "Missing required parameter: 'input'", "input"),
        ({"model": M, "input": "x", "background": True}, 400, "background responses", None),
    ]:
        st, _, data = request(c.http, "POST", "/v1/responses", b)
        check_oerr(st, data, want, needle, param)

    # DELETE by the owner; then it is gone.
    st, _, data = request(c.http, "DELETE", "/v1/responses/" + fid)
    check(st == 200 and json.loads(data) == {"id": fid, "object": "response", "deleted": True},
          "delete %d %r" % (st, data))
    st, _, data = request(c.http, "GET", "/v1/responses/" + fid)
    check(st == 404, "deleted: %d" % st)


def test_store(c):
    """Restart, byte budget, two routers sharing the directory."""
    store = c.path("store")
    p = c.start_router("--responses-dir", store, "--responses-max-bytes", "64KiB")
    w = c.start_worker("fake")
    c.wait_up(2)
    st, r = resp(c.http, {"model": M, "input": "keep me", "max_output_tokens": 4})
    check(st == 200, "first %r" % r)
    keep = r["id"]
    # A restart: a new routerd on the same directory finds it.
    for q in (w, p):
        q.terminate()
        q.wait(timeout=10)
        c.procs.remove(q)
    c.start_router("--responses-dir", store, "--responses-max-bytes", "64KiB")
    st, _, data = request(c.http, "GET", "/v1/responses/" + keep)
    check(st == 200 and json.loads(data)["id"] == keep, "after a restart: %d %r" % (st, data))
    port_b = c.http

    # Router A (with a worker) writes past the budget while router B reads
    # every stored file it sees: each is whole (200), never part of one.
    c.start_router("--responses-dir", store, "--responses-max-bytes", "64KiB")
    port_a = c.http
    c.start_worker("fakeA")
    c.wait_up(2)
    import threading
    done = threading.Event()
    seen, bad = set(), []

    def reader():
        while not done.is_set():
            for f in os.listdir(store):
                if not f.endswith(".json"):
                    continue
                st, _, data = request(port_b, "GET", "/v1/responses/" + f[:-5])
                if st == 200:
                    seen.add(f)
                    json.loads(data)
                elif st != 404 or os.path.exists(os.path.join(store, f)):
                    bad.append((f, st, data[:200]))
    t = threading.Thread(target=reader)
    t.start()
    ids = []
    for i in range(60):
        st, r = resp(port_a, {"model": M, "input": "x" * 200 + str(i),
                              "max_output_tokens": 40})
        check(st == 200, "write %d: %r" % (i, r))
        ids.append(r["id"])
        total = sum(os.path.getsize(os.path.join(store, f)) for f in os.listdir(store)
                    if f.endswith(".json"))
        check(total <= 64 * 1024, "store %d bytes, over its budget" % total)
    done.set()
    t.join()
    check(not bad, "a reader got part of a file: %r" % bad[:3])
    check(len(seen) > 10, "the reader saw %d files" % len(seen))
    st, _, _ = request(port_b, "GET", "/v1/responses/" + ids[-1])
    check(st == 200, "the newest is kept")
    st, _, _ = request(port_b, "GET", "/v1/responses/" + keep)
    check(st == 404, "the oldest went first")
    check(not [f for f in os.listdir(store) if f.startswith(".tmp")], "no temporary file left")
    st, _, data = request(port_a, "GET", "/metrics", key=None)
    text = data.decode()
    got = {k: int(v) for k, v in re.findall(r"^(tandem_router_responses_\w+) (\d+)$", text, re.M)}
    total = sum(os.path.getsize(os.path.join(store, f)) for f in os.listdir(store)
                if f.endswith(".json"))
    check(got.get("tandem_router_responses_max_bytes") == 64 * 1024 and
          got.get("tandem_router_responses_stored_bytes") == total and
          got.get("tandem_router_responses_dropped_total", 0) > 0, "store metrics %r" % got)


if __name__ == "__main__":
    sys.exit(routerd_test.main(globals()))
