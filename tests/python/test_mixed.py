"""Mixed runs: `starling train` (C++) peers and Python peers (starling.Optimizer with model=,
mixed_peer.py) in one collaboration on loopback, on the built-in Fashion-MNIST MLP.

- Two C++ trainers start; a Python peer joins once they are past epoch 2 (it downloads their
  state: parameters and Adam's moments); one C++ trainer is killed (SIGKILL) once the Python
  peer is averaging with them; a second Python peer joins late. Every live peer ends at the
  same epoch with the same param_hash (`starling train`'s hash) and Adam step count.
- Two Python peers with aggregation='centered-clip', verify=True and worker momentum, an honest
  C++ trainer and a C++ owner returning shifted averages (--attack wrong-average): every honest
  peer bans the cheater and nobody else, and they end with the same parameters.
- A C++ trainer joins a run of one Python peer and downloads its state: same param_hash.
- A Python peer whose model has another architecture gets a clear error from
  load_state_from_peers().

Run by ctest (python_mixed) with the module directory and the `starling` binary as arguments."""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from peers import Proc

MODULE_DIR = os.path.abspath(sys.argv.pop(1) if len(sys.argv) > 1 else "build/python")
STARLING = os.path.abspath(sys.argv.pop(1) if len(sys.argv) > 1 else "build/bin/starling")
PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mixed_peer.py")
DATA = "/usr/share/datasets/fashion-mnist"


def cpp_epoch(line):
    m = re.search(r"\bepoch (\d+)", line)
    return int(m.group(1)) if m else None


@unittest.skipUnless(os.path.isdir(DATA), DATA + " missing (dataset-fashion-mnist)")
class MixedTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.procs = []
        self.env = dict(os.environ, PYTHONPATH=MODULE_DIR, OMP_NUM_THREADS="1",
                        STARLING_LOG="info")
        addrs = os.path.join(self.dir.name, "boot.addrs")
        self.boot = self.start([STARLING, "dht", "--identity", self.path("boot.key"),
                                "--listen", "/ip4/127.0.0.1/tcp/0", "--addr-file", addrs],
                               stream=None)
        end = time.monotonic() + 20
        while not (os.path.exists(addrs) and os.path.getsize(addrs) > 0):
            self.assertLess(time.monotonic(), end, "bootstrap node did not start")
            self.assertIsNone(self.boot.p.poll(), "bootstrap node exited")
            time.sleep(0.05)
        with open(addrs) as f:
            self.boot_addr = f.readline().strip()

    def tearDown(self):
        for p in reversed(self.procs):
            if p.p.poll() is None:
                p.release()
        for p in reversed(self.procs):
            if p is self.boot:
                p.p.send_signal(signal.SIGINT)
            p.stop(timeout=20)
        self.dir.cleanup()

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def start(self, args, stdin=False, stream="stdout"):
        p = Proc(args, self.env, stdin=stdin, stream=stream)
        self.procs.append(p)
        return p

    def cpp(self, name, run_id, epochs, linger, *extra):
        return self.start([STARLING, "train", "--identity", self.path(name + ".key"),
                           "--initial-peers", self.boot_addr, "--listen", "/ip4/127.0.0.1/tcp/0",
                           "--data-dir", DATA, "--threads", "1", "--run-id", run_id,
                           "--max-epochs", str(epochs), "--linger", str(linger),
                           "--report", self.path(name + ".json"), *extra], stream="stderr")

    def peer_id(self, name):
        """Creates the identity `name`.key and returns its peer id (`starling id`)."""
        out = subprocess.run([STARLING, "id", "--identity", self.path(name + ".key")],
                             capture_output=True, text=True, timeout=30, check=True)
        return out.stdout.split()[0]

    def py(self, run_id, epochs, seed, *extra):
        return self.start([sys.executable, "-u", PEER, "--initial-peers", self.boot_addr,
                           "--run-id", run_id, "--epochs", str(epochs), "--seed", str(seed),
                           *extra], stdin=True)

    def go(self, proc):
        proc.p.stdin.write("go\n")
        proc.p.stdin.flush()

    def report(self, proc, name, timeout):
        proc.p.wait(timeout=timeout)
        self.assertEqual(proc.p.returncode, 0, "".join(proc.log[-20:]))
        with open(self.path(name + ".json")) as f:
            return json.load(f)

    def test_two_cpp_two_python_one_killed(self):
        run, epochs = "mixed-kill", 60
        # The Python peers start (torch, data, DHT node) and join on cue.
        p1 = self.py(run, epochs, 1, "--wait-go")
        p2 = self.py(run, epochs, 2, "--wait-go")
        p1.json("ready", 120)
        p2.json("ready", 120)
        c1 = self.cpp("c1", run, epochs, 20)
        c2 = self.cpp("c2", run, epochs, 20)
        c1.wait_line(lambda l: True if (cpp_epoch(l) or 0) >= 2 else None, 120)
        self.go(p1)
        first = p1.json("epoch_reached", 120)["epoch_reached"]
        # p1 is averaging with the C++ peers (two more steps, and a third of the run), then
        # c1 dies mid-run.
        kill_at = max(first + 2, epochs // 3)
        p1.wait_line(lambda l: True if '"epoch_reached": ' in l and
                     json.loads(l)["epoch_reached"] >= kill_at else None, 120)
        c1.p.kill()
        c1.p.wait()
        self.go(p2)
        r1 = p1.json("hash", 300)
        r2 = p2.json("hash", 300)
        rc = self.report(c2, "c2", 300)
        p1.release()
        p2.release()
        print("python", r1, r2, "\nc++", rc, file=sys.stderr)
        self.assertEqual({r1["epoch"], r2["epoch"], rc["epoch"]}, {epochs})
        self.assertEqual(r1["hash"], rc["param_hash"])
        self.assertEqual(r2["hash"], rc["param_hash"])
        self.assertEqual(r1["sharing"], "adam")
        self.assertEqual(r1["adam_steps"], [epochs])  # Adam's step count came along too
        self.assertEqual(r2["adam_steps"], [epochs])
        self.assertGreaterEqual(r1["state_downloads"], 1)  # from a C++ peer (the only donors)
        self.assertGreaterEqual(r1["rounds_ok"], 2)
        self.assertGreaterEqual(r2["state_downloads"], 1)

    def test_python_peers_ban_a_cheating_owner(self):
        # Two Python peers (centered-clip, verify, worker momentum), an honest C++ trainer and
        # a C++ owner that returns shifted averages: every honest peer bans the cheater (the
        # Python peers through banned_peers()), bans nobody else, and ends with the same
        # parameters.
        run, epochs = "mixed-hostile", 24
        hostile = ["--aggregation", "centered-clip", "--verify", "--worker-momentum", "0.9"]
        bad_id = self.peer_id("bad")
        p1 = self.py(run, epochs, 1, "--wait-go", *hostile)
        p2 = self.py(run, epochs, 2, "--wait-go", *hostile)
        p1.json("ready", 120)
        p2.json("ready", 120)
        self.go(p1)
        self.go(p2)
        c = self.cpp("c", run, epochs, 30, *hostile)
        bad = self.cpp("bad", run, epochs, 0, *hostile, "--attack", "wrong-average")
        r1 = p1.json("hash", 300)
        r2 = p2.json("hash", 300)
        rc = self.report(c, "c", 300)
        bad.p.kill()
        bad.p.wait()
        p1.release()
        p2.release()
        print("python", r1, r2, "\nc++", rc, file=sys.stderr)
        self.assertEqual(r1["banned"], [bad_id], r1)
        self.assertEqual(r2["banned"], [bad_id], r2)
        banned_by_c = set(re.findall(r"banned peer (\w+)", "".join(c.log)))
        self.assertEqual(banned_by_c, {bad_id})
        self.assertEqual({r1["epoch"], r2["epoch"], rc["epoch"]}, {epochs})
        self.assertEqual(r1["hash"], rc["param_hash"])
        self.assertEqual(r2["hash"], rc["param_hash"])

    def test_cpp_downloads_from_python_and_another_model_is_refused(self):
        run, epochs = "mixed-down", 3
        p = self.py(run, epochs, 1)
        r = p.json("hash", 120)
        self.assertEqual(r["epoch"], epochs)
        c = self.cpp("c", run, epochs, 0)
        rc = self.report(c, "c", 180)
        self.assertGreaterEqual(rc["state_downloads"], 1)
        self.assertEqual(rc["epoch"], epochs)
        self.assertEqual(rc["param_hash"], r["hash"])
        bad = self.py(run, epochs, 3, "--hidden", "128", "--load-only")
        got = bad.json("load_error", 120)
        self.assertEqual(got["load_error"], "ValueError", got)
        self.assertIn("shape", got["message"])
        p.release()


if __name__ == "__main__":
    unittest.main(verbosity=2)
