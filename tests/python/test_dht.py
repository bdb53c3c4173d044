"""starling.DHT between two nodes on loopback: store/get, sub-keys, TTL, errors, context manager."""
import unittest

import torch  # noqa: F401  (the module links against torch's libraries)
import starling

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


class DhtTest(unittest.TestCase):
    def test_store_get_between_two_nodes(self):
        with starling.DHT(listen=LOOPBACK) as a:
            self.assertTrue(a.peer_id.startswith("12D3KooW"))
            self.assertEqual(len(a.visible_maddrs), 1)
            self.assertIn("/p2p/" + a.peer_id, a.visible_maddrs[0])
            with starling.DHT(initial_peers=a.visible_maddrs, listen=LOOPBACK) as b:
                self.assertNotEqual(a.peer_id, b.peer_id)
                exp = starling.get_dht_time() + 30
                self.assertTrue(b.store("plain", b"v1", exp))
                got = a.get("plain")
                self.assertEqual(got.value, b"v1")
                self.assertAlmostEqual(got.expiration_time, exp, delta=2.0)
                self.assertTrue(a.store("text", "hello", exp))
                self.assertEqual(b.get("text", latest=True).value, b"hello")
                self.assertIsNone(a.get("missing"))

                # Sub-keys: one dictionary, each writer its own sub-key.
                self.assertTrue(b.store("dict", "x", exp, subkey="s1"))
                self.assertTrue(a.store("dict", b"y", exp, subkey=b"s2"))
                d = a.get("dict", latest=True).value
                self.assertEqual({k: v.value for k, v in d.items()}, {b"s1": b"x", b"s2": b"y"})

                # An expiration time in the past stores nothing.
                self.assertFalse(a.store("old", b"z", starling.get_dht_time() - 1))

    def test_errors_are_python_exceptions(self):
        with self.assertRaises(ValueError) as ctx:
            starling.DHT(initial_peers=["garbage"])
        self.assertIn("garbage", str(ctx.exception))
        with self.assertRaises(TypeError):
            starling.DHT(listen=LOOPBACK, initial_peers=42)
        with starling.DHT(listen=LOOPBACK) as a:
            with self.assertRaises(TypeError):
                a.store("k", 3, starling.get_dht_time() + 10)
            with self.assertRaises(TypeError):
                a.get(b"\xff" * 3, latest="no", extra=1)
        self.assertFalse(a.is_alive)
        with self.assertRaises(starling.StarlingError) as ctx:
            a.get("k")
        self.assertIn("shut down", str(ctx.exception))
        self.assertTrue(issubclass(starling.StarlingError, RuntimeError))
        a.shutdown()  # idempotent

    def test_context_manager_shuts_down_on_exception(self):
        dht = None
        with self.assertRaises(KeyError):
            with starling.DHT(listen=LOOPBACK) as dht:
                raise KeyError("inside")
        self.assertFalse(dht.is_alive)


if __name__ == "__main__":
    unittest.main(verbosity=2)
