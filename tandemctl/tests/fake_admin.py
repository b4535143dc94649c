#!/usr/bin/env -S sh -c 'exec "${0%/*}/../../tools/python" "$0" "$@"'
"""tandemctl/tests/fake_admin.py — a stand-in for routerd's admin API, for the
tandemctl tests: binds 127.0.0.1 port 0, writes the port to PORTFILE, checks the
bearer key (not for /health and /ready, as routerd), and answers each "METHOD PATH" from
ROUTES (a JSON file re-read on every request: {"GET /admin/status": [200,
<json or raw string>, delay_s]});
every request body is appended, one line each, to LOG. Further arguments:
"--ready" prints routerd's ready line on stderr, "--port=N" binds port N
instead of a free one (deploy/local-cluster tests)."""
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

portfile, routes_path, key, log_path = sys.argv[1:5]
flags = sys.argv[5:]
port = int(next((f[7:] for f in flags if f.startswith("--port=")), "0"))

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def answer(self, method):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n).decode() if n else ""
        with open(log_path, "a") as f:
            f.write(f"{method} {self.path} {body}\n")
        if self.path not in ("/health", "/ready") and self.headers.get("Authorization") != "Bearer " + key:
            return self.send(401, {"error": {"message": "Incorrect API key provided.",
                                             "type": "invalid_request_error"}})
        with open(routes_path) as f:
            routes = json.load(f)
        r = routes.get(f"{method} {self.path}")
        if r is None:
            return self.send(404, {"error": {"message": "no such route"}})
        if len(r) > 2:
            time.sleep(r[2])
        self.send(r[0], r[1])

    def send(self, code, payload):
        data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.answer("GET")

    def do_POST(self):
        self.answer("POST")

srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
srv.daemon_threads = True
with open(portfile + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
os.rename(portfile + ".tmp", portfile)
if "--ready" in flags:
    port = srv.server_address[1]
    print(f"routerd ready: http=127.0.0.1:{port} ctl=127.0.0.1:9 admin=127.0.0.1:{port}",
          file=sys.stderr, flush=True)
srv.serve_forever()
