"""The parity test: three Python processes training the Fashion-MNIST MLP together
(starling.Optimizer around torch.optim.Adam, mixed_peer.py) for EPOCHS collaborative steps of
the target batch (1,024 samples) reach, within 1 point, the test accuracy of one process
training alone in plain PyTorch on the same samples: EPOCHS steps of Adam on the mean gradient
of 1,024 samples (equal samples as bench/run-lm.sh counts them: steps times the target), and
end with identical parameters. Run by ctest (python_parity) with the module directory as
argument."""
import os
import sys
import tempfile
import time
import unittest

from peers import Proc

MODULE_DIR = os.path.abspath(sys.argv.pop(1) if len(sys.argv) > 1 else "build/python")
PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mixed_peer.py")
DATA = "/usr/share/datasets/fashion-mnist"
EPOCHS = 200  # optimizer steps of 1,024 samples: ~3.4 passes over the training set


@unittest.skipUnless(os.path.isdir(DATA), DATA + " missing (dataset-fashion-mnist)")
class ParityTest(unittest.TestCase):
    def test_three_peers_match_one_alone(self):
        env = dict(os.environ, PYTHONPATH=MODULE_DIR, OMP_NUM_THREADS="1")
        procs = []

        def peer(seed, *extra):
            p = Proc([sys.executable, "-u", PEER, "--run-id", "parity", "--epochs", str(EPOCHS),
                      "--seed", str(seed), "--deadline", "500", *extra], env, stdin=True)
            procs.append(p)
            return p

        try:
            first = peer(1, "--wait-go")
            boot = first.json("maddrs", 120)["maddrs"]
            others = [peer(s, "--wait-go", "--initial-peers", *boot) for s in (2, 3)]
            together = [first] + others
            for p in together:
                p.json("ready", 120)
            t0 = time.monotonic()
            for p in together:
                p.p.stdin.write("go\n")
                p.p.stdin.flush()
            results = [p.json("hash", 480) for p in together]
            seconds = time.monotonic() - t0
            alone = peer(1, "--plain-steps", str(EPOCHS))
            solo = alone.json("hash", 480)
        finally:
            for p in procs:
                p.stop()
        print("together", results, "\nalone", solo, "\n%.1f s, %d samples computed together" %
              (seconds, sum(r["samples"] for r in results)), file=sys.stderr)
        for p in procs:
            self.assertEqual(p.p.returncode, 0, "".join(p.log[-10:]))
        self.assertEqual({r["epoch"] for r in results}, {EPOCHS})
        self.assertEqual(len({r["hash"] for r in results}), 1, results)
        # A collaboration of three: at least two averaged in most rounds. (On a loaded machine
        # the third can fall behind at the start and then only download the others' state at
        # every epoch: it still ends with the same parameters.)
        self.assertGreaterEqual(sum(r["rounds_ok"] >= EPOCHS // 2 for r in results), 2, results)
        acc = results[0]["accuracy"]
        self.assertGreater(acc, solo["accuracy"] - 0.01,
                           "together %.4f, alone %.4f at %d samples" %
                           (acc, solo["accuracy"], solo["samples"]))


if __name__ == "__main__":
    unittest.main(verbosity=2)
