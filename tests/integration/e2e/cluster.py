"""tests/integration/e2e/cluster.py — the end-to-end harness: a real cluster
(routerd + prefilld + decoded) on free loopback ports with a fresh secret and
keys in a temporary directory, the expected output of every request computed
independently (tools/synth-expect), and the checks the scenarios share.
Every process is started here and stopped by its own pid."""
import http.client
import importlib.machinery
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
KEY, ADMIN_KEY = "sk-e2e-key", "adm-e2e-key"
MODEL = "tandem-synthetic"

# The engine options every process of the cluster gets: a non-default key (so
# the expectation must follow the option), a small layout with every segment
# kind (ratio 2 + partial, ratio 1, window, engram, counters) so 200 requests'
# KV fits on a 2-core machine.
# The vocabulary is the byte-level tokenizer's: routerd refuses an engine whose
# ids it could not show.
SYNTH_KEY, SYNTH_VOCAB = 7331, 256
ENGINE = ["--engine", "synthetic", "--synth-key", str(SYNTH_KEY),
          "--synth-vocab", str(SYNTH_VOCAB), "--kv-layers", "6", "--kv-sources", "1:2,4:1",
          "--kv-window", "32", "--kv-block-entries", "16"]
# Slow daemons (the sanitizer build) get longer waits: $E2E_SLOW (a factor).
SLOW = float(os.environ.get("E2E_SLOW", "1"))


class Failure(AssertionError):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def _load_synth_expect():
    path = os.path.join(REPO, "tools", "synth-expect")
    loader = importlib.machinery.SourceFileLoader("synth_expect", path)
    spec = importlib.util.spec_from_loader("synth_expect", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


synth = _load_synth_expect()


# ---- What a request must produce -------------------------------------------------


def chat_prompt(messages):
    """The router's chat encoding (routerd/request.c prompt_text):
    "<role>: <content>\\n" per message, then "assistant: "; byte-level tokens."""
    text = "".join("%s: %s\n" % (m["role"], m["content"]) for m in messages) + "assistant: "
    return list(text.encode())


def detok(ids):
    """Generated ids as the router shows them: id is one byte
    (routerd/tok_bytes.c); bytes -> UTF-8 with U+FFFD for each maximal
    ill-formed subpart (routerd/tok.c = Python's 'replace' handler)."""
    return bytes(ids).decode("utf-8", "replace")


class Expect:
    """The synthetic engine's answer to one request, from docs/engine.md."""

    def __init__(self, prompt_ids, max_tokens, temperature=0.0, top_p=1.0, seed=0):
        self.prompt_tokens = len(prompt_ids)
        self.max_tokens = max_tokens
        self.ids = synth.tokens(SYNTH_KEY, SYNTH_VOCAB, prompt_ids, max_tokens - 1,
                                temperature=temperature, top_p=top_p, seed=seed)
        self.text = detok(self.ids)

    @classmethod
    def chat(cls, body):
        return cls(chat_prompt(body["messages"]), body["max_tokens"],
                   body.get("temperature", 1.0), body.get("top_p", 1.0), body["seed"])

    @classmethod
    def completion(cls, body):
        return cls(list(body["prompt"].encode()), body["max_tokens"],
                   body.get("temperature", 1.0), body.get("top_p", 1.0), body["seed"])

    def check(self, what, text, finish, usage):
        check(text == self.text, "%s: text %r, expected %r" % (what, text, self.text))
        check(finish == "length", "%s: finish_reason %r" % (what, finish))
        got = (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)
        want = (self.prompt_tokens, self.max_tokens, self.prompt_tokens + self.max_tokens)
        check(got == want, "%s: usage %r, expected %r" % (what, got, want))


def kv_bytes(nprompt):
    """KV bytes decoded verifies for a prompt of n tokens in the ENGINE layout
    (docs/engine.md): the paged entries complete after n tokens (L1 ratio 2,
    L4 ratio 1; kv 288 + index 68 bytes each) plus every fixed segment (6
    windows of 32 x 512, L1's partial 2 x 4096, engram 3 x 4, counters 8)."""
    paged = (nprompt // 2 + nprompt) * (288 + 68)
    return paged + 6 * 32 * 512 + 2 * 4096 + 3 * 4 + 8


# ---- HTTP ------------------------------------------------------------------------


def http_call(port, method, path, body=None, key=KEY, timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout * SLOW)
    h = {"Authorization": "Bearer " + key} if key else {}
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
        h["Content-Type"] = "application/json"
    try:
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        return r.status, r, r.read()
    finally:
        c.close()


# ---- The cluster -----------------------------------------------------------------


class Proc:
    """One daemon we started: its Popen, log file and ready line."""

    def __init__(self, name, popen, log):
        self.name, self.p, self.log, self.ready = name, popen, log, None
        self.killed = False

    def text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def kill(self):
        self.killed = True
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()


class Cluster:
    """routerd + workers in tmp; bins = {routerd, prefilld, decoded, tandemctl, ctl_peer}."""

    def __init__(self, bins, tmp):
        self.bins, self.tmp = bins, tmp
        self.engine = list(ENGINE)   # engine options of every process started
        self.procs = []       # to stop
        self.procs_all = []   # every process started (logs, counts)
        self.nstarted = {}
        for name, text in (("secret", "e2e-secret-%s\n" % os.urandom(8).hex()),
                           ("wrong-secret", "not-the-cluster-secret\n"),
                           ("api.keys", KEY + "\n"), ("admin.key", ADMIN_KEY + "\n")):
            with open(self.path(name), "w") as f:
                f.write(text)
            os.chmod(self.path(name), 0o600)

    def path(self, name):
        return os.path.join(self.tmp, name)

    def _spawn(self, name, argv, ready_re, timeout=20):
        n = self.nstarted[name] = self.nstarted.get(name, 0) + 1
        log = self.path("%s.%d.log" % (name, n))
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=open(log, "w"),
                             stderr=subprocess.STDOUT)
        proc = Proc(name, p, log)
        self.procs.append(proc)
        self.procs_all.append(proc)
        deadline = time.time() + timeout * SLOW
        while time.time() < deadline:
            m = re.search(ready_re, proc.text())
            if m:
                proc.ready = m
                return proc
            check(p.poll() is None, "%s exited (%s) before it was ready" % (name, p.returncode))
            time.sleep(0.05)
        raise Failure("%s not ready in %.0f s" % (name, timeout * SLOW))

    def start_router(self, *extra):
        self.router = self._spawn("routerd", [
            self.bins["routerd"], *self.engine, "--secret-file", self.path("secret"),
            "--node-id", "router0", "--log-level", "info",
            "--http-listen", "127.0.0.1:0", "--ctl-listen", "127.0.0.1:0",
            "--admin-listen", "127.0.0.1:0", "--api-keys-file", self.path("api.keys"),
            "--admin-key-file", self.path("admin.key"), *extra],
            r"routerd ready: http=[\d.]+:(\d+) ctl=[\d.]+:(\d+) admin=[\d.]+:(\d+)")
        self.http, self.ctl, self.admin = (int(x) for x in self.router.ready.groups())
        self.base_url = "http://127.0.0.1:%d/v1" % self.http
        return self.router

    def start_worker(self, kind, node, *extra, secret="secret", engine=None, wait_ready=True):
        """kind: prefilld | decoded. Ready = its ready line (wait_ready) —
        registration is checked with wait_ranks."""
        argv = [self.bins[kind], *(self.engine if engine is None else engine),
                "--secret-file", self.path(secret), "--node-id", node,
                "--routers", "127.0.0.1:%d" % self.ctl, *extra]
        if wait_ready:
            return self._spawn(node, argv, kind + " ready:")
        n = self.nstarted[node] = self.nstarted.get(node, 0) + 1
        log = self.path("%s.%d.log" % (node, n))
        proc = Proc(node, subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=open(log, "w"),
                                           stderr=subprocess.STDOUT), log)
        self.procs.append(proc)
        self.procs_all.append(proc)
        return proc

    def up(self, prefill=2, decode=2, prefill_ranks=1, decode_ranks=2, router=(),
           prefill_flags=(), decode_flags=()):
        """The usual cluster: prefill0.., decode0..; waits until every rank is up."""
        self.start_router(*router)
        self.workers = {}
        for i in range(prefill):
            self.workers["prefill%d" % i] = self.start_worker(
                "prefilld", "prefill%d" % i, "--ranks", str(prefill_ranks), *prefill_flags)
        for i in range(decode):
            self.workers["decode%d" % i] = self.start_worker(
                "decoded", "decode%d" % i, "--ranks", str(decode_ranks), *decode_flags)
        self.wait_ranks_up(prefill * prefill_ranks + decode * decode_ranks)

    # ---- the admin API --------------------------------------------------------------

    def admin_get(self, path):
        st, _, data = http_call(self.admin, "GET", path, key=ADMIN_KEY)
        check(st == 200, "admin %s: HTTP %d %r" % (path, st, data[:200]))
        return json.loads(data)

    def ranks(self):
        return [dict(rk, node=n["node"]) for n in self.admin_get("/admin/status")["nodes"]
                for rk in n["ranks"]]

    def requests(self):
        return self.admin_get("/admin/requests")["requests"]

    def blocks_used(self):
        """{(node, rank): blocks in use} of every decode rank that is up or draining."""
        return {(r["node"], r["rank"]): r["kv"]["blocks_used"] for r in self.ranks()
                if r["role"] == "decode" and r["state"] != "dead"}

    def wait(self, cond, what, timeout=10.0):
        deadline = time.time() + timeout * SLOW
        while True:
            v = cond()
            if v:
                return v
            if time.time() > deadline:
                raise Failure("timed out after %.0f s waiting for %s" % (timeout * SLOW, what))
            time.sleep(0.05)

    def wait_ranks_up(self, n):
        self.wait(lambda: sum(r["state"] == "up" for r in self.ranks()) == n, "%d ranks up" % n,
                  timeout=20)

    def wait_idle(self, timeout=10.0):
        """No request in flight and no KV block in use on any live decode rank."""
        last = {}

        def idle():
            last["reqs"], last["blocks"] = self.requests(), self.blocks_used()
            return not last["reqs"] and not any(last["blocks"].values())
        try:
            self.wait(idle, "the cluster to be idle", timeout)
        except Failure as e:
            raise Failure("%s: requests %r, blocks %r" % (e, last.get("reqs"), last.get("blocks")))

    def tandemctl(self, *args):
        r = subprocess.run([self.bins["tandemctl"], "--router", "http://127.0.0.1:%d" % self.admin,
                            "--admin-key-file", self.path("admin.key"), *args],
                           capture_output=True, text=True, timeout=20 * SLOW)
        check(r.returncode == 0, "tandemctl %s: exit %d: %s" % (" ".join(args), r.returncode,
                                                               r.stderr))
        return r.stdout

    def metrics(self):
        st, _, data = http_call(self.http, "GET", "/metrics", key=None)
        check(st == 200, "metrics: HTTP %d" % st)
        return data.decode()

    def client(self, **kw):
        import openai
        kw.setdefault("timeout", 30 * SLOW)
        return openai.OpenAI(base_url=self.base_url, api_key=KEY, max_retries=0, **kw)

    def async_client(self, **kw):
        import openai
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=KEY, max_retries=0,
                                  timeout=60 * SLOW, **kw)

    # ---- the end ---------------------------------------------------------------------

    def stop(self):
        """SIGTERM every process still running (workers first), wait, SIGKILL
        what hangs; the exit codes that are not 0 (a sanitizer reports leaks
        and errors through them), except of the processes killed on purpose."""
        bad = []
        for proc in sorted(self.procs, key=lambda x: x.name == "routerd"):
            if proc.p.poll() is None:
                proc.p.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.p.wait(timeout=20 * SLOW)
            except subprocess.TimeoutExpired:
                proc.p.kill()
                proc.p.wait()
                bad.append("%s ignored SIGTERM" % proc.name)
                continue
            if proc.p.returncode != 0 and not proc.killed:
                bad.append("%s exited %d" % (proc.name, proc.p.returncode))
        self.procs = []
        return bad

    def dump_logs(self, tail=6000):
        """The logs' tails on stdout; whole copies in $E2E_LOGDIR if set."""
        keep = os.environ.get("E2E_LOGDIR")
        if keep:
            import shutil
            shutil.rmtree(keep, ignore_errors=True)
            shutil.copytree(self.tmp, keep)
        for f in sorted(os.listdir(self.tmp)):
            if f.endswith((".log", ".out")):
                with open(os.path.join(self.tmp, f), errors="replace") as fh:
                    print("---- %s (tail)\n%s" % (f, fh.read()[-tail:]))


def control_probe(port, frame, timeout=5.0):
    """Send raw bytes to a control port; True when the peer closes the
    connection within timeout."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(frame)
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if not s.recv(4096):
                    return True
            except ConnectionResetError:
                return True
            except socket.timeout:
                return False
        return False
    finally:
        s.close()


def run_scenario(scenarios, name, build):
    """Run scenarios["test_" + name] (a function of a Cluster) on a fresh
    cluster of the binaries in build; its logs on failure. The exit code."""
    bins = {"routerd": "routerd/routerd", "prefilld": "prefilld/prefilld",
            "decoded": "decoded/decoded", "tandemctl": "tandemctl/tandemctl",
            "ctl_peer": "tests/integration/ctl_peer"}
    bins = {k: os.path.join(build, v) for k, v in bins.items()}
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="tandem-e2e-") as tmp:
        c = Cluster(bins, tmp)
        c.build = build
        try:
            scenarios["test_" + name.replace("-", "_")](c)
            bad = c.stop()
            check(not bad, "; ".join(bad))
        except Exception as e:  # any failure, expected or not, keeps the logs
            print("FAIL %s: %s: %s" % (name, type(e).__name__, e))
            c.stop()
            c.dump_logs()
            return 1
        finally:
            c.stop()
    print("ok %s (%.1f s)" % (name, time.time() - t0))
    return 0
