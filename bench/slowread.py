# bench/slowread.py — a streamed chat read slowly, for bench/slow-readers and
# bench/soak: a socket with a small receive buffer (so that what the client
# has not read waits at routerd), read at a set rate in bytes per second,
# which the caller may change (speed_up); the SSE events once it ended.
import json
import socket
import threading
import time


class SlowReader(threading.Thread):
    def __init__(self, api, key, body, rate, rcvbuf=4096, timeout=600):
        super().__init__(daemon=True)
        host, port = api.rsplit(":", 1)
        data = json.dumps(dict(body, stream=True)).encode()
        self.sock = socket.socket()
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((host, int(port)))
        self.sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\n"
                          b"Authorization: Bearer " + key.encode() + b"\r\n"
                          b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                          % len(data) + data)
        self.rate, self.buf, self.ended, self.closed = rate, bytearray(), False, False
        self.t_end = None
        self.lock = threading.Lock()
        self.start()

    def run(self):
        while True:
            with self.lock:
                rate = self.rate
            if rate <= 0:
                time.sleep(0.05)
                continue
            try:
                d = self.sock.recv(max(1, min(rate, 1 << 20)))
            except OSError:
                d = b""
            if not d:
                self.closed = True   # the server ended the connection
                break
            self.buf += d
            if self.buf.endswith(b"\r\n0\r\n\r\n"):   # the chunked answer's end
                break
            if rate < 1 << 30:
                time.sleep(len(d) / rate)
        self.ended = True
        self.t_end = time.time()
        self.sock.close()

    def speed_up(self, rate=1 << 30):
        with self.lock:
            self.rate = rate

    def events(self):
        """The SSE data payloads received (the answer's chunked framing undone)."""
        _, _, body = bytes(self.buf).partition(b"\r\n\r\n")
        out, i = [], 0
        while i < len(body):
            j = body.find(b"\r\n", i)
            if j < 0:
                break
            try:
                n = int(body[i:j], 16)
            except ValueError:
                break
            if n == 0:
                break
            out.append(body[j + 2:j + 2 + n])
            i = j + 2 + n + 2
        text = b"".join(out).decode(errors="replace")
        return [ev[6:] for ev in text.split("\n\n") if ev.startswith("data: ")]

    def complete(self, max_tokens):
        """Whether the stream ended with [DONE], no error, max_tokens tokens."""
        ev = self.events()
        if not ev or ev[-1] != "[DONE]":
            return False
        n = 0
        for e in ev[:-1]:
            j = json.loads(e)
            if "error" in j:
                return False
            for ch in j.get("choices", []):
                lp = ch.get("logprobs")
                n += len(lp["content"]) if lp and lp.get("content") else 0
        return n == max_tokens
