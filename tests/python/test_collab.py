"""Three Python processes train a small MLP together with starling.Optimizer (collab_peer.py):
once wrapping torch.optim.Adam, once a Python-written optimizer. All peers end at the same
epoch with bit-identical parameters, and the evaluation loss falls."""
import json
import os
import subprocess
import sys
import unittest

PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "collab_peer.py")


def read_json(proc):
    for line in proc.stdout:
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("peer exited without a result (exit code %s)" % proc.wait())


class CollabTest(unittest.TestCase):
    def collaborate(self, optimizer, peers=3, epochs=5):
        run_id = "pytest-" + optimizer
        args = [sys.executable, "-u", PEER, "--run-id", run_id, "--optimizer", optimizer,
                "--epochs", str(epochs), "--peers", str(peers)]
        procs = []
        try:
            first = subprocess.Popen(args + ["--seed", "1"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
            procs.append(first)
            maddrs = read_json(first)["maddrs"]
            for i in range(1, peers):
                p = subprocess.Popen(args + ["--seed", str(i + 1), "--initial-peers"] + maddrs,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                procs.append(p)
                read_json(p)
            results = [read_json(p) for p in procs]
        finally:
            for p in procs:
                try:
                    p.stdin.write("done\n")
                    p.stdin.close()
                except (BrokenPipeError, ValueError):
                    pass
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                p.stdout.close()
        for p in procs:
            self.assertEqual(p.returncode, 0)
        print(optimizer, results)
        epochs_seen = {r["epoch"] for r in results}
        self.assertEqual(len(epochs_seen), 1, results)
        self.assertGreaterEqual(epochs_seen.pop(), epochs)
        self.assertEqual(len({r["hash"] for r in results}), 1, "parameters differ: %s" % results)
        self.assertTrue(all(r["rounds_ok"] >= 1 for r in results), results)
        for r in results:
            self.assertLess(r["loss"], 0.8 * r["loss0"], r)

    def test_three_peers_adam(self):
        self.collaborate("adam")

    def test_three_peers_python_optimizer(self):
        self.collaborate("python")


if __name__ == "__main__":
    unittest.main(verbosity=2)
