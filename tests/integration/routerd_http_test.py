#!/usr/bin/env -S sh -c 'exec "${0%/*}/../../tools/python" "$0" "$@"'
"""tests/integration/routerd_http_test.py — black-box tests of routerd's HTTP
front (routerd/http.c): refusals in OpenAI's error JSON with their status, the
read and idle timeouts that never cut a quiet stream, a client's half-close,
and a routerd held at its file-descriptor limit by idle connections. The
cluster (a real routerd, rtr_fake_worker ranks) is routerd_test.py's.
usage: routerd_http_test.py TEST ROUTERD WORKER
TEST: errors | timeouts | halfclose | caps | fdlimit."""
import json
import os
import resource
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import routerd_test  # noqa: E402
from routerd_test import (ADMIN_KEY, KEY, Stream, chat, check, check_error,  # noqa: E402
                          fail, request)

CHAT = json.dumps({"model": "tandem-synthetic", "max_tokens": 10,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()


def connect(port, timeout=10):
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def read_all(s, limit=10.0):
    """Everything the server sends until it closes (or limit seconds)."""
    s.settimeout(limit)
    out = b""
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            d = s.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not d:
            break
        out += d
    return out


def parse(data):
    """The final response in data: (status, headers, body, interim statuses)."""
    interim = []
    while True:
        head, sep, rest = data.partition(b"\r\n\r\n")
        check(sep, "no complete response head in %r" % data[:300])
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            headers[k.strip().lower()] = v.strip()
        if 100 <= status < 200:
            interim.append(status)
            data = rest
            continue
        if "content-length" in headers:
            body = rest[:int(headers["content-length"])]
        elif headers.get("transfer-encoding") == "chunked":
            body, rest2 = b"", rest
            while True:
                size_line, _, rest2 = rest2.partition(b"\r\n")
                n = int(size_line, 16)
                if n == 0:
                    break
                body += rest2[:n]
                rest2 = rest2[n + 2:]
        else:
            body = rest
        return status, headers, body, interim


def raw(port, data, shut=False, limit=10.0):
    s = connect(port)
    s.sendall(data)
    if shut:
        s.shutdown(socket.SHUT_WR)
    out = read_all(s, limit)
    s.close()
    return out


def check_json_error(data, status, code=None, what=""):
    st, h, body, _ = parse(data)
    check(h.get("content-type") == "application/json",
          "%s: content type %r (%r)" % (what, h.get("content-type"), data[:200]))
    try:
        check_error(st, body, status, code)
    except (ValueError, KeyError) as e:
        fail("%s: not an OpenAI error: %r (%s)" % (what, data[:300], e))
    return h


def post(path, body, extra=b"", key=KEY):
    return (b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode() +
            b"\r\n" + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body)


# ---------------------------------------------------------------------------


def test_errors(c):
    """Every refusal of the HTTP layer is OpenAI's error JSON with the right
    status (they were evhttp's HTML pages), and the connection is closed."""
    c.start_router("--max-body", "2048")
    cases = [
        ("body over max-body", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
         b"Content-Length: 5000\r\n\r\n", 413, "request_too_large"),
        ("chunked body over max-body", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n" + b"400\r\n" + b"x" * 1024 + b"\r\n" +
         b"400\r\n" + b"x" * 1024 + b"\r\n" + b"400\r\n" + b"x" * 1024 + b"\r\n0\r\n\r\n",
         413, "request_too_large"),
        ("malformed request line", b"GARBAGE\r\n\r\n", 400, None),
        ("no version", b"GET /health\r\n\r\n", 400, None),
        ("two blanks", b"GET  /health HTTP/1.1\r\n\r\n", 400, None),
        ("HTTP/2.0", b"GET /health HTTP/2.0\r\n\r\n", 505, None),
        ("header line without a colon", b"GET /health HTTP/1.1\r\nHost\r\n\r\n", 400, None),
        ("folded header", b"GET /health HTTP/1.1\r\nA: b\r\n c\r\n\r\n", 400, None),
        ("oversized headers", b"GET /health HTTP/1.1\r\nX-Big: " + b"y" * 70000 + b"\r\n\r\n",
         431, None),
        ("long request line", b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 414, None),
        ("TRACE", b"TRACE / HTTP/1.1\r\nHost: x\r\n\r\n", 405, None),
        ("CONNECT", b"CONNECT x:1 HTTP/1.1\r\nHost: x\r\n\r\n", 405, None),
        ("unknown method", b"BREW /health HTTP/1.1\r\nHost: x\r\n\r\n", 501, None),
        ("invalid chunk size", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
         b"Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", 400, None),
        ("chunk longer than its size", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n2\r\nhello\r\n0\r\n\r\n", 400, None),
        ("conflicting Content-Length", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
         b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", 400, None),
        ("conflicting Content-Length list", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
         b"Content-Length: 5, 6\r\n\r\nhello!", 400, None),
        ("Content-Length with a sign", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
         b"Content-Length: +5\r\n\r\nhello", 400, None),
        ("Content-Length and Transfer-Encoding", b"POST /v1/chat/completions HTTP/1.1\r\n"
         b"Host: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, None),
        ("unknown transfer coding", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
         b"Transfer-Encoding: gzip\r\n\r\n", 501, None),
        ("unknown expectation", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
         b"Expect: the-unexpected\r\nContent-Length: 2\r\n\r\n{}", 417, None),
    ]
    for what, data, status, code in cases:
        out = raw(c.http, data)
        check_json_error(out, status, code, what)
        # the connection is closed after a refusal: read_all ended at EOF
        check(out.endswith(b"}"), "%s: more after the error: %r" % (what, out[-100:]))
    h = check_json_error(raw(c.http, b"TRACE / HTTP/1.1\r\n\r\n"), 405)
    check("GET" in h.get("allow", ""), "405 without Allow: %r" % h)
    # The admin listener refuses the same way.
    check_json_error(raw(c.admin, b"GARBAGE\r\n\r\n"), 400, None, "admin: garbage")
    check_json_error(raw(c.admin, b"POST /admin/drain HTTP/1.1\r\nContent-Length: 70000\r\n\r\n"),
                     413, "request_too_large", "admin: large body")

    # A body over the limit is refused from the head: the 413 comes without
    # the client sending it, and without a 100 Continue to one that asks.
    s = connect(c.http)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
              b"Content-Length: 100000\r\n\r\n")
    out = read_all(s, 5)
    s.close()
    st, _, _, interim = parse(out)
    check(st == 413 and interim == [], "large body with Expect: %d %r" % (st, interim))

    # Accepted: the same Content-Length twice, Expect: 100-continue (the 100
    # comes before the body is sent), chunked, HTTP/1.0, keep-alive with a
    # pipelined second request, and empty lines before a request line.
    body = json.dumps({"node": "nope"}).encode()
    out = raw(c.admin, b"POST /admin/drain HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
              ADMIN_KEY.encode() + b"\r\nContent-Length: %d\r\nContent-Length: %d\r\n"
              b"Connection: close\r\n\r\n" % (len(body), len(body)) + body)
    check_json_error(out, 404, "node_not_found", "duplicate Content-Length")
    s = connect(c.admin)
    s.sendall(b"POST /admin/drain HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
              ADMIN_KEY.encode() + b"\r\nExpect: 100-continue\r\nConnection: close\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body))
    s.settimeout(5)
    first = s.recv(4096)
    check(first.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), "no 100 Continue: %r" % first)
    s.sendall(body)
    out = first + read_all(s, 5)
    s.close()
    check_json_error(out, 404, "node_not_found", "after 100 Continue")
    out = raw(c.admin, b"POST /admin/drain HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
              ADMIN_KEY.encode() + b"\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
              b"5;ext=1\r\n" + body[:5] + b"\r\n%x\r\n" % (len(body) - 5) + body[5:] +
              b"\r\n0\r\nTrailer: x\r\n\r\n")
    check_json_error(out, 404, "node_not_found", "chunked")
    out = raw(c.http, b"GET /health HTTP/1.0\r\n\r\n")
    st, h, body10, _ = parse(out)
    check(st == 200 and json.loads(body10)["status"] == "ok" and h.get("connection") == "close",
          "HTTP/1.0: %r" % out)
    s = connect(c.http)
    s.sendall(b"\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/nothing HTTP/1.1\r\nHost: x\r\n"
              b"Authorization: Bearer " + KEY.encode() + b"\r\nConnection: close\r\n\r\n")
    out = read_all(s, 5)
    s.close()
    first, sep, second = out.partition(b"}")
    check(first.startswith(b"HTTP/1.1 200 OK") and b'"status":"ok"' in out,
          "pipelined first: %r" % out)
    check_json_error(second, 404, None, "pipelined second")
    # HEAD: the headers of the answer, no body.
    out = raw(c.http, b"HEAD /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    check(out.startswith(b"HTTP/1.1 404") and out.endswith(b"\r\n\r\n"), "HEAD: %r" % out)

    # Refusals are counted like the API's own.
    _, _, m = request(c.http, "GET", "/metrics", key=None)
    check(b'errors_total{reason="too_large"} 4' in m, "too_large count: %r" % m[:2000])


def test_timeouts(c):
    """A half-sent request is refused (408) and closed after the read timeout;
    an idle connection is closed after the idle timeout; an SSE stream quiet
    for longer than both stays open and completes."""
    c.start_router("--http-read-timeout", "1s", "--http-idle-timeout", "1s")
    c.start_worker("slow", "--tok-ms", "2500")
    c.wait_up(2)
    stream = Stream(c.http, max_tokens=2)
    check(stream.status == 200, "stream status %d" % stream.status)
    t0 = time.time()

    half = {
        "head": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n",
        "body": post(b"/v1/chat/completions", CHAT)[:-20],
        "nothing": b"",
    }
    socks = {}
    for name, data in half.items():
        socks[name] = connect(c.http)
        socks[name].sendall(data)
    # a slow client whose bytes keep coming: the deadline is for the whole head
    loris = connect(c.http)
    # an idle kept-alive connection: one answer, then nothing
    kept = connect(c.http)
    kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    kept.settimeout(5)
    check(kept.recv(4096).startswith(b"HTTP/1.1 200"), "kept-alive first answer")
    ends = {}
    line = b"GET /health HTTP/1.1\r\nX-Slow: " + b"z" * 100
    for name, s in list(socks.items()) + [("loris", loris), ("kept", kept)]:
        s.setblocking(False)
    deadline = time.time() + 4
    i = 0
    bufs = {}
    while time.time() < deadline and len(ends) < 5:
        if "loris" not in ends and i < len(line):
            try:
                loris.send(line[i:i + 1])
                i += 1
            except OSError:
                pass
        for name, s in list(socks.items()) + [("loris", loris), ("kept", kept)]:
            if name in ends:
                continue
            try:
                d = s.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                d = b""
            if d:
                bufs[name] = bufs.get(name, b"") + d
            else:
                ends[name] = time.time() - t0
        time.sleep(0.05)
    for name in ("head", "body", "nothing", "loris", "kept"):
        check(name in ends, "%s: still open after %.1f s (read/idle timeout 1 s)" %
              (name, time.time() - t0))
        check(ends[name] < 3.0, "%s: closed after %.1f s" % (name, ends[name]))
    for name in ("head", "body", "loris"):
        check_json_error(bufs.get(name, b""), 408, None, name)
    check(not bufs.get("nothing"), "a connection that sent nothing got %r" % bufs.get("nothing"))
    for s in list(socks.values()) + [loris, kept]:
        s.close()

    # The stream: quiet for 2.5 s before its last token, longer than both timeouts.
    ev = stream.events()
    stream.close()
    took = time.time() - t0
    check(ev[-1] == "[DONE]" and len(ev) >= 4, "stream events %r" % ev)
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "")
                   for e in ev[:-1] if json.loads(e).get("choices"))
    check(text == "th", "streamed %r" % text)
    check(took > 2.0, "the stream ended after %.1f s, before its quiet gap" % took)


def test_halfclose(c):
    """A client that half-closes after a complete request (shutdown(SHUT_WR),
    as nc -N does) gets its whole answer; the request is not canceled."""
    c.start_router()
    w = c.start_worker("fake", "--tok-ms", "20")
    c.wait_up(2)
    out = raw(c.http, post(b"/v1/chat/completions", CHAT), shut=True)
    st, _, body, interim = parse(out)
    check(st == 200, "half-closed non-streamed: %r" % out[:300])
    check(set(interim) <= {100}, "interim %r" % interim)
    r = json.loads(body)
    check(r["choices"][0]["message"]["content"] == "the quick " and
          r["choices"][0]["finish_reason"] == "length", "answer %r" % r)

    stream_body = json.dumps({"model": "tandem-synthetic", "max_tokens": 10, "stream": True,
                              "messages": [{"role": "user", "content": "hi"}]}).encode()
    out = raw(c.http, post(b"/v1/chat/completions", stream_body), shut=True)
    st, h, body, _ = parse(out)
    check(st == 200 and h.get("content-type") == "text/event-stream", "stream head %r" % out[:300])
    events = [e[len("data: "):] for e in body.decode().split("\n\n") if e.startswith("data: ")]
    check(events[-1] == "[DONE]", "half-closed stream events %r" % events)
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1])
    check(text == "the quick ", "half-closed stream text %r" % text)

    out = raw(c.http, b"POST /v1/chat/completions HTTP/1.0\r\nAuthorization: Bearer " +
              KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(CHAT) + CHAT, shut=True)
    st, _, body, interim = parse(out)
    check(st == 200 and interim == [] and json.loads(body)["choices"][0]["message"]["content"]
          == "the quick ", "half-closed HTTP/1.0: %r" % out[:300])
    check("cancel" not in open(w.out).read(), "a half-closed request was canceled")

    # A client that really goes away still cancels its request (the half-close
    # looks the same; the probe's reset tells them apart).
    slow = c.start_worker("slow", "--tok-ms", "200")
    c.wait(lambda: sum(r["state"] == "up" for r in c.ranks()) == 4, "slow worker up")
    request(c.admin, "POST", "/admin/drain", {"node": "fake"}, key=ADMIN_KEY)
    s = connect(c.http)
    s.sendall(post(b"/v1/chat/completions", json.dumps({
        "model": "tandem-synthetic", "max_tokens": 200,
        "messages": [{"role": "user", "content": "x"}]}).encode()))
    c.wait(lambda: "admit" in open(slow.out).read(), "request at the slow worker")
    s.close()
    c.wait(lambda: "cancel" in open(slow.out).read(), "Cancel after the client closed", timeout=5)


def test_caps(c):
    """At the cap a new connection takes the place of the least recently
    active idle one, and when every connection has a request in hand it gets
    a 503 at once; request bytes past http-max-buffered get a 503."""
    c.start_router("--http-max-connections", "3", "--http-max-buffered", "1MiB",
                   "--max-body", "4096")
    c.start_worker("slow", "--tok-ms", "300")
    c.wait_up(2)
    idle = connect(c.http)
    streams = [Stream(c.http, max_tokens=8) for _ in range(2)]
    # the third stream takes the idle connection's place: it is closed
    streams.append(Stream(c.http, max_tokens=8))
    idle.settimeout(5)
    check(read_all(idle, 5) == b"", "the idle connection was answered")
    idle.close()
    # all three connections are serving: a fourth is refused at once
    t0 = time.time()
    out = raw(c.http, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", limit=5)
    h = check_json_error(out, 503, None, "over the cap")
    check(h.get("retry-after") == "1" and time.time() - t0 < 1.0,
          "503 at the cap: %r after %.1f s" % (h, time.time() - t0))
    for s in streams:
        ev = s.events()
        check(ev[-1] == "[DONE]", "a stream at the cap: %r" % ev[-2:])
        s.close()
    st, _, _ = request(c.http, "GET", "/health", key=None)
    check(st == 200, "after the streams: %d" % st)
    bad = c.stop()
    check(not bad, "; ".join(bad))

    # Request bytes: heads still being sent count; 20 heads of 60 kB against
    # 1 MiB: 17 fit, the other three get 503.
    c.start_router("--http-max-buffered", "1MiB", "--max-body", "4096")
    socks, refused = [], 0
    for _ in range(20):
        s = connect(c.http)
        s.sendall(b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 60000)
        socks.append(s)
        time.sleep(0.02)
    time.sleep(0.5)
    for s in socks:
        out = read_all(s, 0.05)
        if out:
            check_json_error(out, 503, None, "over the buffered bytes")
            refused += 1
        s.close()
    check(refused == 3, "%d of 20 heads of 60 kB refused at 1 MiB" % refused)
    st, _, _ = request(c.http, "GET", "/health", key=None)
    check(st == 200, "after the heads are gone: %d" % st)


HOLDER = r"""
import socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
held = []
for _ in range(n):
    try:
        held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
    except OSError:
        pass
print(len(held), flush=True)
time.sleep(3600)
"""


def hold(port, n):
    """A process holding n idle connections to port (until killed)."""
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(port), str(n)],
                         stdout=subprocess.PIPE, text=True)
    p.stdout.readline()
    return p


def timed(what, fn, limit=1.0):
    t0 = time.time()
    try:
        st, _, data = fn()
    except OSError as e:
        fail("%s: no answer after %.1f s: %s" % (what, time.time() - t0, e))
    dt = time.time() - t0
    check(st == 200, "%s: %d %r" % (what, st, data[:200]))
    check(dt < limit, "%s took %.2f s" % (what, dt))


def low_nofile():
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def log_lines(c):
    with open(c.rlog, "rb") as f:
        return f.read().count(b"\n")


def test_fdlimit(c):
    """routerd with a file-descriptor limit of 256 and idle connections held
    past it on both listeners: /health (API and admin) and a chat request
    still answer within 1 s, and the log grows by a bounded number of lines.
    Then without connection caps: accept() fails with EMFILE, accepting pauses
    (one warning per episode), and routerd serves again once they are gone."""
    c.start_router(preexec=low_nofile)
    c.start_worker("fake")
    c.wait_up(2)
    before = log_lines(c)
    holders = [hold(c.http, 150), hold(c.http, 150), hold(c.admin, 100)]
    try:
        time.sleep(0.5)
        for _ in range(3):
            timed("admin /health", lambda: request(c.admin, "GET", "/health", key=None))
            timed("api /health", lambda: request(c.http, "GET", "/health", key=None))
            timed("chat", lambda: chat(c.http, max_tokens=2))
        check(c.procs[0].poll() is None, "routerd died")
        grown = log_lines(c) - before
        check(grown <= 20, "the log grew by %d lines:\n%s" %
              (grown, open(c.rlog).read()[-3000:]))
    finally:
        for p in holders:
            p.kill()
            p.wait()
    bad = c.stop()
    check(not bad, "; ".join(bad))

    # No caps: the descriptors run out, accept() fails.
    c.start_router("--http-max-connections", "0", "--admin-max-connections", "0",
                   preexec=low_nofile)
    before = log_lines(c)
    holders = [hold(c.http, 150), hold(c.http, 150)]
    try:
        time.sleep(1.0)
        check(c.procs[-1].poll() is None, "routerd died")
        text = open(c.rlog).read()
        check(text.count("accept failed:") <= 2, "accept failures logged %d times" %
              text.count("accept failed:"))
        grown = log_lines(c) - before
        check(grown <= 20, "the log grew by %d lines:\n%s" % (grown, text[-3000:]))
    finally:
        for p in holders:
            p.kill()
            p.wait()
    time.sleep(1.5)   # the pause is at most 1 s
    timed("api /health after the flood", lambda: request(c.http, "GET", "/health", key=None))
    timed("admin /health after the flood", lambda: request(c.admin, "GET", "/health", key=None))
    check("accepting again" in open(c.rlog).read(), "no end of the episode logged")


if __name__ == "__main__":
    sys.exit(routerd_test.main(globals()))
