"""starling.DHT: two nodes on loopback store and read plain values and sub-keys with
expiration times, values expire, errors are Python exceptions, the context manager shuts the
node down. Run by ctest (python_dht) with the build's module directory as argv[1]."""
import os
import signal
import subprocess
import sys
import threading
import time
import unittest

MODULE_DIR = sys.argv.pop(1) if len(sys.argv) > 1 else "build/python"
sys.path.insert(0, MODULE_DIR)
import torch  # noqa: E402,F401  (the module links against torch's python library)
import starling  # noqa: E402

LISTEN = ["/ip4/127.0.0.1/tcp/0"]


class DhtTest(unittest.TestCase):
    def test_store_get_subkeys(self):
        with starling.DHT(listen=LISTEN) as a:
            self.assertTrue(a.peer_id.startswith("12D3KooW"))
            self.assertTrue(all("/p2p/" + a.peer_id in m for m in a.get_visible_maddrs()))
            with starling.DHT(initial_peers=a.get_visible_maddrs(), listen=LISTEN) as b:
                t = starling.get_dht_time()
                self.assertTrue(b.store("k", b"v1", t + 30))
                got = a.get("k")
                self.assertEqual(got.value, b"v1")
                self.assertAlmostEqual(got.expiration_time, t + 30, delta=1)
                self.assertTrue(b.store("d", "x", t + 30, subkey="s1"))
                self.assertTrue(a.store("d", "y", t + 30, subkey=b"s2"))
                d = b.get("d", latest=True).value
                self.assertEqual({k: v.value for k, v in d.items()}, {b"s1": b"x", b"s2": b"y"})
                self.assertIsNone(a.get("missing"))
                with self.assertRaises(TypeError):
                    b.store("k", 3, t + 30)
        with self.assertRaises(starling.StarlingError):
            a.get("k")  # shut down by the context manager

    def test_ctrl_c_during_get(self):
        # The only other node is SIGSTOPped: a get waits for its request deadline (5 s). A
        # SIGINT 0.3 s into the get must raise KeyboardInterrupt at once (not at the deadline)
        # and leave the node usable.
        peer = subprocess.Popen(
            [sys.executable, "-u", "-c",
             "import sys, time; sys.path.insert(0, sys.argv[1]); import torch, starling\n"
             "d = starling.DHT(listen=['/ip4/127.0.0.1/tcp/0'])\n"
             "print(d.get_visible_maddrs()[0], flush=True)\n"
             "time.sleep(120)", MODULE_DIR], stdout=subprocess.PIPE, text=True)
        old = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            maddr = peer.stdout.readline().strip()
            self.assertIn("/p2p/", maddr)
            with starling.DHT(initial_peers=[maddr], listen=LISTEN) as a:
                peer.send_signal(signal.SIGSTOP)
                timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
                t0 = time.monotonic()
                timer.start()
                with self.assertRaises(KeyboardInterrupt):
                    a.get("nobody-answers")
                took = time.monotonic() - t0
                timer.join()
                print("ctrl-c during get: raised after %.2f s" % took, file=sys.stderr)
                self.assertLess(took, 1.5)
                peer.send_signal(signal.SIGCONT)
                self.assertIsNone(a.get("still-missing"))
        finally:
            signal.signal(signal.SIGINT, old)
            peer.kill()
            peer.wait()
            peer.stdout.close()

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            starling.DHT(initial_peers=["garbage"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
