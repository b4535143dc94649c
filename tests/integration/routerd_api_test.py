#!/usr/bin/env -S sh -c 'exec "${0%/*}/../../tools/python" "$0" "$@"'
"""tests/integration/routerd_api_test.py — the Messages API (and the
Responses API) on routerd with fake worker ranks: answers and streams in the
protocol's shapes, errors in its format with precise messages (also the
refusals the HTTP layer makes before a route runs), x-api-key, the version
header, count_tokens, the model list in Anthropic's shape.
usage: routerd_api_test.py TEST ROUTERD WORKER; TEST: messages."""
import json
import os
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


if __name__ == "__main__":
    sys.exit(routerd_test.main(globals()))
