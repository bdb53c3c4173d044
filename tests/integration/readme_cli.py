#!/usr/bin/env python3
"""Runs every command of the README's CLI tour exactly as written there, with a fresh, empty HOME
and a fresh working directory (so `~/.starling`, `b.key` and `ckpt` are created as a new user's
would be). Only addresses are substituted: the listen ports of the README (4001, 4002) become
ports the kernel hands out just before, the documentation address 203.0.113.7 becomes 127.0.0.1,
and `/p2p/12D3KooW...` or a bare `...` becomes the address the matching node printed; `starling
node` and `starling train` get `--port-mapping off` (never ask this machine's router).

Usage: readme_cli.py README.md BUILD_DIR
Long-running commands (`starling node`, `starling dht` without put/get) run in the background
and are waited for by their printed address; every other command must exit 0 within its bound,
and its output is checked against what the README's comment says it prints."""
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time


def tour_commands(readme):
    """The `build/bin/starling ...` commands of the README's CLI tour, continuation lines joined
    and trailing comments removed, in order."""
    text = open(readme, encoding="utf-8").read()
    section = text.split("## CLI tour", 1)[1]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    commands, current = [], ""
    for line in block.splitlines():
        stripped = line.strip()
        if not current and not stripped.startswith("build/bin/starling"):
            continue  # a comment line (or the continuation of one)
        code = strip_comment(line)
        if code.rstrip().endswith("\\"):
            current += code.rstrip()[:-1] + " "
            continue
        commands.append((current + code).strip())
        current = ""
    if not commands:
        sys.exit("no `build/bin/starling` commands found in the README's CLI tour")
    return commands


def strip_comment(line):
    """The line without a trailing `# comment` (a # outside quotes, after whitespace)."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Tour:
    def __init__(self, build):
        self.bin = os.path.join(build, "bin", "starling")
        self.work = tempfile.mkdtemp(prefix="starling-readme-")
        self.home = os.path.join(self.work, "home")
        self.cwd = os.path.join(self.work, "cwd")
        os.makedirs(self.home)
        os.makedirs(self.cwd)
        self.env = dict(os.environ, HOME=self.home)
        self.env.pop("STARLING_HOME", None)
        self.ports = {}  # README port -> real port
        self.addr_of = {}  # README port -> full multiaddr a node printed
        self.last_dht = None  # the latest background dht node's address
        self.background = []
        self.n = 0

    def substitute(self, cmd):
        args = shlex.split(cmd)
        args[0] = self.bin if args[0] == "build/bin/starling" else args[0]
        out = []
        for i, a in enumerate(args):
            m = re.fullmatch(r"/ip4/[0-9.]+/tcp/(\d+)/p2p/12D3KooW\.\.\.", a)
            if m:
                if m.group(1) not in self.addr_of:
                    sys.exit(f"README uses the address of a node on port {m.group(1)} that no command started")
                out.append(self.addr_of[m.group(1)])
                continue
            if a == "..." and out and out[-1] in ("--initial-peers", "-p"):
                out.append(self.last_dht)
                continue
            m = re.fullmatch(r"/ip4/(0\.0\.0\.0|203\.0\.113\.7|127\.0\.0\.1)/tcp/(\d+)", a)
            if m:
                port = self.ports.setdefault(m.group(2), free_port())
                out.append(f"/ip4/127.0.0.1/tcp/{port}")
                continue
            out.append(a)
        # `starling node|train` map their ports through the home router by default: the test
        # must not talk to this machine's gateway (its loopback listeners are never mapped,
        # but `train` listens on 0.0.0.0 by default).
        if len(args) > 1 and args[1] in ("node", "train") and "--port-mapping" not in args:
            out += ["--port-mapping", "off"]
        return args[0:1] + out[1:]

    def log(self, name):
        return os.path.join(self.work, f"{self.n:02d}-{name}.log")

    def start_background(self, args, readme_port, pattern, name):
        log = self.log(name)
        f = open(log, "w")
        p = subprocess.Popen(args, cwd=self.cwd, env=self.env, stdout=f, stderr=subprocess.STDOUT)
        self.background.append(p)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            text = open(log).read()
            m = re.search(pattern, text)
            if m:
                return m.group(1) if m.groups() else None
            if p.poll() is not None:
                fail(f"{shlex.join(args)} exited {p.returncode}", log)
            time.sleep(0.1)
        fail(f"{shlex.join(args)}: no line matching /{pattern}/ within 30 s", log)

    def run(self, cmd):
        self.n += 1
        args = self.substitute(cmd)
        sub = args[1]
        is_dht_node = sub == "dht" and not any(a in ("put", "get") for a in args[2:3])
        print(f"$ {cmd}\n  as: {shlex.join(args)}", flush=True)
        if sub == "node":
            port = readme_port(cmd)
            addr = self.start_background(args, port, r"listening on (/ip4/\S+/p2p/\S+)", "node")
            self.addr_of[port] = addr.replace("/ip4/0.0.0.0/", "/ip4/127.0.0.1/")
            print(f"  -> {self.addr_of[port]}")
            return
        if is_dht_node:
            if "--client" in args:
                self.start_background(args, None, r"routing table ([1-9]\d*) nodes", "dht-client")
                print("  -> client joined")
                return
            addr = self.start_background(args, None, r"dht address (\S+)", "dht")
            port = readme_port(cmd, "--announce") or readme_port(cmd)
            if port:
                self.addr_of[port] = addr
            self.last_dht = addr
            print(f"  -> {addr}")
            return
        timeout = 900 if sub == "train" else 60
        log = self.log(sub)
        with open(log, "w") as f:
            try:
                rc = subprocess.run(args, cwd=self.cwd, env=self.env, stdout=f,
                                    stderr=subprocess.STDOUT, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                fail(f"did not finish within {timeout} s", log)
        out = open(log).read()
        if rc != 0:
            fail(f"exited {rc}", log)
        self.check(args, out, log)

    def check(self, args, out, log):
        sub = args[1]
        expect = {
            "id": r"^12D3KooW\w+$",
            "ping": r"rtt",
            "echo": r"echo: " + re.escape(args[args.index("--text") + 1]) if "--text" in args else "",
            "train": r"accuracy",
        }.get(sub, "")
        if sub == "dht" and args[2] == "put":
            expect = r"stored .+ on [1-9]"
        if sub == "dht" and args[2] == "get":
            expect = r"subkey \"w1\" = \"busy\"" if args[3] == "workers" else r"value"
        if expect and not re.search(expect, out, re.M):
            fail(f"output does not match /{expect}/", log)
        if sub == "id":
            key = os.path.join(self.home, ".starling", "identity.key")
            if not os.path.isfile(key):
                fail(f"{key} was not created", log)
            modes = (oct(os.stat(os.path.dirname(key)).st_mode & 0o777), oct(os.stat(key).st_mode & 0o777))
            if modes != ("0o700", "0o600"):
                fail(f"identity directory/file modes {modes}, want 0700/0600", log)
        print("  ok: " + (out.strip().splitlines() or [""])[-1][:120], flush=True)

    def stop(self):
        for p in self.background:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 15
        for p in self.background:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                fail(f"a background command did not stop within 15 s of Ctrl-C: {shlex.join(p.args)}", None)


def readme_port(cmd, flag="--listen"):
    m = re.search(re.escape(flag) + r" /ip4/[0-9.]+/tcp/(\d+)", cmd)
    return m.group(1) if m else None


def fail(msg, log):
    print(f"FAILED: {msg}")
    if log:
        print(open(log).read()[-4000:])
    raise SystemExit(1)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tour = Tour(sys.argv[2])
    commands = tour_commands(sys.argv[1])
    try:
        for cmd in commands:
            tour.run(cmd)
        tour.stop()
    except SystemExit as e:
        for p in tour.background:
            if p.poll() is None:
                p.kill()
        print(f"# logs kept in {tour.work}")
        raise
    subprocess.run(["rm", "-rf", tour.work])
    print(f"readme_cli: ok ({len(commands)} commands)")


if __name__ == "__main__":
    main()
