#!/usr/bin/env python3
"""The run dashboard in a real browser.

A `starling dht` bootstrap node, a `starling monitor` (client-mode node + dashboard on port 0)
and two `starling train` peers on loopback; headless Chromium (driven over the DevTools
protocol on a pipe: --remote-debugging-pipe, no extra packages) loads the monitor's page and
the test reads the rendered DOM: both contributors listed (one named with HTML/script, which
must show as text), Chart.js loaded and the charts holding data points, the epoch advancing
between two reads, no script injected. Also: the bootstrap node's own dashboard (`starling dht
--dashboard`) lists both, and the monitor's and a trainer's `/metrics` (`--metrics
127.0.0.1:0`) parse as Prometheus text. Keeps a screenshot in the output directory and prints
the update-to-DOM latency median and the monitor's RSS. Every wait has a deadline.

Usage: dashboard_browser.py BIN_DIR OUT_DIR
Exit 77 (skip) without chromium or the Fashion-MNIST dataset.
"""
import base64
import json
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

BIN, OUT = sys.argv[1], sys.argv[2]
DATA = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
EVIL = "<img src=x onerror=alert(1)>"  # a peer-supplied name: must render as text
RUN = "dashboard-test"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

if not CHROMIUM:
    print("chromium is not installed (Debian package chromium): skipping")
    sys.exit(77)
if not any(os.path.exists(f"{DATA}/train-images-idx3-ubyte{ext}") for ext in ("", ".gz")):
    print("dataset-fashion-mnist is not installed: skipping")
    sys.exit(77)

os.makedirs(OUT, exist_ok=True)
work = tempfile.mkdtemp(prefix="starling-dashboard-")
env = dict(os.environ, HOME=work, STARLING_HOME=os.path.join(work, "home"))
procs = []


def start(name, args, extra_env=None):
    log = open(os.path.join(OUT, name + ".log"), "w")
    p = subprocess.Popen(args, stdout=subprocess.PIPE if name == "monitor" else log,
                         stderr=log, env=dict(env, **(extra_env or {})))
    procs.append(p)
    return p


def fail(msg):
    print("FAIL:", msg)
    for f in sorted(os.listdir(OUT)):
        if f.endswith(".log"):
            print("---", f)
            print(open(os.path.join(OUT, f)).read()[-3000:])
    sys.exit(1)


def wait_for(what, check, deadline_s):
    until = time.monotonic() + deadline_s
    while True:
        v = check()
        if v:
            return v
        if time.monotonic() > until:
            fail(f"{what}: not within {deadline_s} s")
        time.sleep(0.05)


class Cdp:
    """The DevTools protocol over chromium's --remote-debugging-pipe (fd 3 in, fd 4 out)."""

    def __init__(self, url):
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()

        def child_fds():
            # The pipes' own descriptors may be 3 or 4: move them out of the way first.
            r, w = os.dup(to_chrome_r), os.dup(from_chrome_w)
            r, w = os.dup2(r, 100), os.dup2(w, 101)
            os.dup2(r, 3)
            os.dup2(w, 4)

        profile = os.path.join(work, "chromium")
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-pipe", f"--user-data-dir={profile}", "--window-size=1280,1000",
             "about:blank"],
            stdout=open(os.path.join(OUT, "chromium.log"), "w"), stderr=subprocess.STDOUT,
            preexec_fn=child_fds, close_fds=False, env=env)
        procs.append(self.proc)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.buf = b""
        self.next_id = 0
        target = self.call("Target.createTarget", {"url": url})["targetId"]
        self.session = self.call("Target.attachToTarget",
                                 {"targetId": target, "flatten": True})["sessionId"]

    def call(self, method, params=None, session=None, deadline_s=30):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.to_chrome, json.dumps(msg).encode() + b"\0")
        until = time.monotonic() + deadline_s
        while True:
            while b"\0" in self.buf:
                raw, self.buf = self.buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self.next_id:
                    if "error" in reply:
                        fail(f"{method}: {reply['error']}")
                    return reply["result"]
            left = until - time.monotonic()
            if left <= 0:
                fail(f"chromium did not answer {method} within {deadline_s} s")
            ready, _, _ = select.select([self.from_chrome], [], [], left)
            if ready:
                chunk = os.read(self.from_chrome, 1 << 20)
                if not chunk:
                    fail("chromium closed the DevTools pipe")
                self.buf += chunk

    def evaluate(self, expr):
        r = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True},
                      self.session)
        return r.get("result", {}).get("value")


PROBE = """JSON.stringify({
  updates: Number(document.body.dataset.updates || 0),
  epoch: Number(document.body.dataset.epoch || 0),
  rows: [...document.querySelectorAll('#contributors tbody tr')].map(
      tr => ({peer: tr.dataset.peer, name: tr.children[1].textContent})),
  injected: document.querySelectorAll('#contributors img, #contributors script').length,
  chart: typeof Chart,
  loss_points: Number(document.getElementById('loss-chart').dataset.points),
  sps_points: Number(document.getElementById('sps-chart').dataset.points),
  acc_points: Number(document.getElementById('acc-chart').dataset.points),
  accuracy: document.getElementById('accuracy').textContent,
  latencies: window.starlingLatencies || [],
})"""


METRIC_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(rf"^({METRIC_NAME})(?:\{{(?:{LABEL}(?:,{LABEL})*)?\}})? "
                    r"([-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|NaN|[-+]?Inf))$")
COMMENT = re.compile(rf"^# (HELP|TYPE) ({METRIC_NAME})(?: (.*))?$")


def parse_prometheus(text):
    """The Prometheus text exposition format (0.0.4): every line a HELP/TYPE comment or a
    sample; every sample's family typed before it. Returns {name: [value, ...]}."""
    types, samples = {}, {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line:
            continue
        m = COMMENT.match(line)
        if m:
            if m.group(1) == "TYPE":
                if m.group(3) not in ("counter", "gauge", "histogram", "summary", "untyped"):
                    fail(f"/metrics line {n}: bad type {m.group(3)!r}")
                types[m.group(2)] = m.group(3)
            continue
        m = SAMPLE.match(line)
        if not m:
            fail(f"/metrics line {n} is not Prometheus text: {line!r}")
        if m.group(1) not in types:
            fail(f"/metrics line {n}: sample of an untyped family {m.group(1)}")
        samples.setdefault(m.group(1), []).append(float(m.group(2)))
    return samples


def main():
    addr_file = os.path.join(work, "boot.addr")
    # The bootstrap node serves the same dashboard (starling dht --dashboard).
    start("boot", [f"{BIN}/starling", "dht", "--listen", "/ip4/127.0.0.1/tcp/0",
                   "--addr-file", addr_file, "--identity", os.path.join(work, "boot.key"),
                   "--dashboard", "127.0.0.1:0", "--run-id", RUN])
    wait_for("bootstrap address", lambda: os.path.exists(addr_file) and os.path.getsize(addr_file),
             30)
    boot = open(addr_file).read().split()[0]

    monitor = start("monitor", [f"{BIN}/starling", "monitor", "--initial-peers", boot,
                                "--run-id", RUN, "--http", "127.0.0.1:0", "--poll-interval", "0.5"])
    url = None
    until = time.monotonic() + 30
    line_buf = b""
    while url is None:
        left = until - time.monotonic()
        if left <= 0:
            fail("the monitor printed no dashboard address within 30 s")
        ready, _, _ = select.select([monitor.stdout], [], [], left)
        if ready:
            chunk = os.read(monitor.stdout.fileno(), 4096)
            if not chunk:
                fail("the monitor exited")
            line_buf += chunk
            for line in line_buf.decode(errors="replace").splitlines():
                if line.startswith("dashboard http://"):
                    url = line.split()[1]

    for name, display, metrics in (("alice", "alice", "127.0.0.1:0"), ("evil", EVIL, "on")):
        start(name, [f"{BIN}/starling", "train", "--initial-peers", boot, "--run-id", RUN,
                     "--listen", "/ip4/127.0.0.1/tcp/0", "--target-batch-size", "512",
                     "--threads", "1", "--metrics-interval", "0.5", "--name", display,
                     "--metrics", metrics, "--eval-every", "20", "--max-seconds", "150",
                     "--linger", "0",
                     "--identity", os.path.join(work, name + ".key")])

    cdp = Cdp(url)
    cdp.call("Emulation.setDeviceMetricsOverride",
             {"width": 1280, "height": 1000, "deviceScaleFactor": 1, "mobile": False},
             cdp.session)

    def probe():
        v = cdp.evaluate(PROBE)
        return json.loads(v) if v else None

    def both_listed():
        s = probe()
        return s if s and len(s["rows"]) == 2 and s["loss_points"] >= 2 else None

    s = wait_for("both contributors on the page with loss points", both_listed, 120)
    names = sorted(r["name"] for r in s["rows"])
    if names != sorted(["alice", EVIL]):
        fail(f"contributor names {names}")
    if s["injected"] != 0:
        fail("a peer-supplied name became markup")
    if s["chart"] != "function":
        fail("Chart.js did not load from the monitor")
    if s["sps_points"] < 2:
        fail("the samples/s chart has no points")
    first_epoch, first_updates = s["epoch"], s["updates"]
    later = wait_for("the epoch advancing on the page",
                     lambda: (lambda t: t if t and t["epoch"] > first_epoch and
                              t["updates"] > first_updates else None)(probe()), 60)
    # The page updates live: collect latencies over a few more updates.
    wait_for("ten more updates", lambda: (lambda t: t if t and t["updates"] >= later["updates"] + 10
                                          else None)(probe()), 60)
    final = wait_for("held-out accuracy on the page",
                     lambda: (lambda t: t if t and t["acc_points"] >= 1 else None)(probe()), 60)

    # The bootstrap node's embedded dashboard shows the same contributors.
    def boot_dashboard():
        for line in open(os.path.join(OUT, "boot.log"), errors="replace"):
            if line.startswith("dashboard http://"):
                return line.split()[1]
        return None

    def boot_state():
        with urllib.request.urlopen(wait_for("the dht node's dashboard", boot_dashboard, 30) +
                                    "api/state", timeout=10) as r:
            st = json.loads(r.read())
        return st if len(st["contributors"]) == 2 else None
    wait_for("both contributors on starling dht --dashboard", boot_state, 30)

    # The trainer's own Prometheus endpoint (--metrics 127.0.0.1:0 prints its address).
    def trainer_endpoint():
        for line in open(os.path.join(OUT, "alice.log"), errors="replace"):
            if line.startswith("metrics http://"):
                return line.split()[1]
        return None
    endpoint = wait_for("alice's metrics endpoint", trainer_endpoint, 30)
    with urllib.request.urlopen(endpoint, timeout=10) as r:
        tprom = parse_prometheus(r.read().decode())
    for family in ("starling_trainer_epoch", "starling_trainer_step_seconds_total",
                   "starling_trainer_round_seconds_total", "starling_trainer_matchmaking_seconds_total",
                   "starling_trainer_bytes_sent_total", "starling_trainer_peers",
                   "starling_trainer_round_failures_total"):
        if family not in tprom:
            fail(f"trainer /metrics lacks {family}: {sorted(tprom)}")
    if tprom["starling_trainer_rounds_total"][0] < 1 or tprom["starling_trainer_peers"][0] != 2:
        fail(f"trainer /metrics: {tprom}")
    with urllib.request.urlopen(url + "metrics", timeout=10) as r:
        prom = parse_prometheus(r.read().decode())
    if prom.get("starling_run_peers") != [2.0] or len(prom.get("starling_peer_epoch", [])) != 2:
        fail(f"/metrics: {prom}")
    shot = cdp.call("Page.captureScreenshot", {"format": "png"}, cdp.session)
    png = os.path.join(OUT, "dashboard.png")
    with open(png, "wb") as f:
        f.write(base64.b64decode(shot["data"]))
    rss_kb = 0
    with open(f"/proc/{monitor.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
    lat = [x for x in final["latencies"] if x >= 0]
    print(f"contributors {names}; epoch {first_epoch} -> {later['epoch']}; "
          f"{final['updates']} updates; loss points {final['loss_points']}")
    print(f"update-to-DOM latency median {statistics.median(lat):.0f} ms "
          f"(p90 {sorted(lat)[int(len(lat) * 0.9)]:.0f} ms, {len(lat)} updates)")
    print(f"monitor RSS {rss_kb / 1024:.1f} MB")
    print(f"screenshot {png}")
    print("dashboard_browser: ok")


try:
    main()
finally:
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in reversed(procs):
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    shutil.rmtree(work, ignore_errors=True)
