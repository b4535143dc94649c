#!/usr/bin/env -S sh -c 'exec "${0%/*}/../../tools/python" "$0" "$@"'
"""tests/integration/worker_start_test.py — a worker daemon's start-up seen
from outside: the TCP ports its data plane opens (data-address) and the
progress it reports while it loads a model (log lines, systemd STATUS= before
READY=1). No router runs: --routers names a closed loopback port; the ranks
start their UCX workers and the engine loads all the same.
usage: worker_start_test.py TEST PREFILLD DECODED MK_TINY_MODEL
TEST: listen | load. listen exits 77 (skipped) on a host without a
non-loopback IPv4 interface: there its listeners on loopback prove nothing."""
import fcntl
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

SLOW = float(os.environ.get("E2E_SLOW", "1"))


def fail(msg):
    raise AssertionError(msg)


def check(cond, msg):
    if not cond:
        fail(msg)


def closed_port():
    """A loopback port nothing listens on (the routers the workers try)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def ipv4_addresses():
    """{interface: IPv4 address} of this host's interfaces that have one."""
    out = {}
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _, name in socket.if_nameindex():
        try:
            req = struct.pack("256s", name.encode()[:15])
            out[name] = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])  # SIOCGIFADDR
        except OSError:
            pass
    s.close()
    return out


def listening(pid):
    """The local addresses of the TCP sockets pid listens on."""
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            m = re.match(r"socket:\[(\d+)\]", os.readlink("/proc/%d/fd/%s" % (pid, fd)))
        except OSError:
            continue
        if m:
            inodes.add(m.group(1))
    out = []
    for path, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = open(path).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:   # 0A: LISTEN
                continue
            host, port = f[1].split(":")
            raw = bytes.fromhex(host)
            # the kernel prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            out.append((socket.inet_ntop(family, raw), int(port, 16)))
    return out


class Daemon:
    def __init__(self, tmp, exe, name, args, env=None):
        self.name = name
        self.log = os.path.join(tmp, "%s.log" % name)
        self.p = subprocess.Popen([exe, "--secret-file", os.path.join(tmp, "secret"),
                                   "--node-id", name, "--compute-threads", "1", *args],
                                  stdin=subprocess.DEVNULL, stdout=open(self.log, "w"),
                                  stderr=subprocess.STDOUT, env=env)

    def text(self):
        return open(self.log, errors="replace").read()

    def wait_ready(self):
        deadline = time.time() + 20 * SLOW
        while time.time() < deadline:
            if re.search(r"(prefilld|decoded) ready:", self.text()):
                return
            check(self.p.poll() is None, "%s exited %s: %s" % (self.name, self.p.returncode,
                                                              self.text()[-2000:]))
            time.sleep(0.05)
        fail("%s not ready in %.0f s: %s" % (self.name, 20 * SLOW, self.text()[-2000:]))

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout=10 * SLOW)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            fail("%s did not stop on SIGTERM" % self.name)
        check(rc == 0, "%s exited %d: %s" % (self.name, rc, self.text()[-2000:]))


def test_listen(tmp, prefilld, decoded, mktiny):
    """Each rank's UCX worker opens one TCP listener (its tcp transport), on
    the data interface only: loopback when every router is on loopback."""
    routers = "127.0.0.1:%d" % closed_port()
    others = {n: a for n, a in ipv4_addresses().items() if not a.startswith("127.")}

    def listeners(exe, name, *extra):
        d = Daemon(tmp, exe, name, ["--routers", routers, "--ranks", "2", *extra])
        try:
            d.wait_ready()
            return listening(d.p.pid), d.text()
        finally:
            d.stop()

    for exe, kind in ((prefilld, "prefilld"), (decoded, "decoded")):
        got, log = listeners(exe, kind + "-default")
        check(len(got) == 2, "%s: %d listeners for 2 ranks: %r" % (kind, len(got), got))
        check(all(a in ("127.0.0.1", "::1") for a, _ in got),
              "%s: listeners beyond loopback with every router on loopback: %r" % (kind, got))
        check("data plane: ucx tcp on lo" in log, "%s: data plane not logged: %s" % (kind, log))
        r = subprocess.run([exe, "--secret-file", os.path.join(tmp, "secret"), "--routers",
                            routers, "--data-address", "10.255.255.254"], capture_output=True,
                           timeout=20 * SLOW)
        check(r.returncode == 2 and b"data-address 10.255.255.254 is neither" in r.stderr,
              "%s: a foreign data-address: exit %d, %r" % (kind, r.returncode, r.stderr[-400:]))
    if not others:
        print("SKIP: no non-loopback IPv4 interface: loopback listeners prove nothing here")
        return 77
    name, addr = sorted(others.items())[0]
    for exe, kind in ((prefilld, "prefilld"), (decoded, "decoded")):
        # every interface, as UCX opens them by default: this host shows the difference
        got, _ = listeners(exe, kind + "-all", "--data-address", "*")
        check(any(a == addr for a, _ in got), "%s: data-address *: none on %s: %r"
              % (kind, addr, got))
        for spec in (addr, name):
            got, _ = listeners(exe, kind + "-" + spec, "--data-address", spec)
            check(len(got) == 2 and all(a == addr for a, _ in got),
                  "%s: data-address %s: listeners %r, wanted 2 on %s" % (kind, spec, got, addr))
    return 0


def test_load(tmp, prefilld, decoded, mktiny):
    """Loading a model is reported while it runs: systemd gets STATUS= lines
    (loading N tensors, then how far, then loaded) before READY=1, the log the
    same lines."""
    model = os.path.join(tmp, "tiny")
    r = subprocess.run([mktiny, model], capture_output=True, timeout=60)
    check(r.returncode == 0, "mk-tiny-model: %r" % r.stderr[-400:])
    routers = "127.0.0.1:%d" % closed_port()
    for exe, kind, every in ((decoded, "decoded", None), (prefilld, "prefilld", "0")):
        path = os.path.join(tmp, "notify-" + kind)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(0.2)
        env = dict(os.environ, NOTIFY_SOCKET=path)
        env.pop("TD_PROGRESS_MS", None)
        if every is not None:
            env["TD_PROGRESS_MS"] = every   # every tensor a line
        d = Daemon(tmp, exe, kind, ["--routers", routers, "--engine", "deepseek-v41",
                                    "--model", model], env=env)
        msgs = []
        try:
            deadline = time.time() + 20 * SLOW
            while not any(m.startswith("READY=1") for m in msgs) and time.time() < deadline:
                try:
                    msgs.append(sock.recv(4096).decode())
                except socket.timeout:
                    check(d.p.poll() is None, "%s exited: %s" % (kind, d.text()[-2000:]))
            check(any(m.startswith("READY=1") for m in msgs), "%s: no READY=1: %r" % (kind, msgs))
        finally:
            d.stop()
            sock.close()
        ready = [i for i, m in enumerate(msgs) if m.startswith("READY=1")][0]
        status = [m[len("STATUS="):] for m in msgs[:ready] if m.startswith("STATUS=")]
        what = "model %s" % model
        check(status and status[0].startswith(what + ": loading ") and "tensors" in status[0],
              "%s: the first STATUS should say the model is loading: %r" % (kind, status))
        check(status[-1].startswith(what + ": loaded "),
              "%s: the last STATUS before READY should say it is loaded: %r" % (kind, status))
        steps = [int(m.group(1)) for m in (re.search(r": loading: (\d+) of (\d+) tensors", s)
                                           for s in status) if m]
        if every == "0":
            check(len(steps) > 100 and steps == sorted(set(steps)),
                  "%s: with TD_PROGRESS_MS=0 a rising STATUS per tensor: %r" % (kind, steps))
        log = d.text()
        check(re.search(r"info: model .*: loading \d+ tensors, ", log) and
              re.search(r"info: model .*: loaded \d+ tensors, ", log),
              "%s: the log lacks the progress lines: %s" % (kind, log[-2000:]))
        check(log.index(": loaded ") < log.index(kind + " ready:"),
              "%s: ready before the model was loaded" % kind)
    return 0


def main():
    name, prefilld, decoded, mktiny = sys.argv[1:5]
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "secret"), "w") as f:
            f.write("worker-start-secret\n")
        os.chmod(os.path.join(tmp, "secret"), 0o600)
        try:
            rc = globals()["test_" + name](tmp, prefilld, decoded, mktiny)
        except AssertionError as e:
            print("FAIL: %s" % e)
            return 1
    if rc == 0:
        print("ok")
    return rc


if __name__ == "__main__":
    sys.exit(main())
