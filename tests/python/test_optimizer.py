"""starling.Optimizer with torch.optim.Adam and with an optimizer written in Python: two (or
three) peers in threads, each with its own DHT node on loopback, train a small regression
model together; every epoch both hold identical parameters, the loss falls, the Python
optimizer's step ran on the calling threads, a joiner downloads parameters and optimizer state,
errors surface as Python exceptions. Run by ctest (python_optimizer) with the build's module
directory as argv[1]."""
import sys
import threading
import unittest

sys.path.insert(0, sys.argv.pop(1) if len(sys.argv) > 1 else "build/python")
import torch  # noqa: E402
import starling  # noqa: E402

LISTEN = ["/ip4/127.0.0.1/tcp/0"]


class MomentumSGD(torch.optim.Optimizer):
    """A user's own optimizer, in Python; records the threads its step ran on."""

    def __init__(self, params, lr=0.05, momentum=0.9):
        super().__init__(params, dict(lr=lr, momentum=momentum))
        self.threads = set()

    @torch.no_grad()
    def step(self, closure=None):
        self.threads.add(threading.get_ident())
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if "buf" not in st:
                    st["buf"] = torch.zeros_like(p)
                st["buf"].mul_(g["momentum"]).add_(p.grad)
                p.add_(st["buf"], alpha=-g["lr"])


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def data(seed, n=64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    w = torch.arange(8, dtype=torch.float32).unsqueeze(1) / 8
    return x, x @ w + 0.1 * torch.randn(n, 1, generator=g)


class Peer:
    def __init__(self, dht, make_opt, run_id, epochs, seed, **kw):
        self.model = make_model()
        self.inner = make_opt(self.model.parameters())
        self.opt = starling.Optimizer(dht=dht, run_id=run_id, optimizer=self.inner,
                                      target_batch_size=128, batch_size_per_step=32, **kw)
        if hasattr(self.inner, "threads"):
            self.inner.threads.clear()  # the state's initialisation step ran on this thread
        self.epochs, self.seed = epochs, seed
        self.snapshots = {}  # epoch -> flat parameters
        self.losses = []
        self.thread_id = None
        self.error = None

    def run(self):
        self.thread_id = threading.get_ident()
        try:
            step = 0
            while self.opt.local_epoch < self.epochs:
                x, y = data(self.seed * 100000 + step, 32)
                step += 1
                loss = torch.nn.functional.mse_loss(self.model(x), y)
                loss.backward()
                self.losses.append(loss.item())
                if self.opt.step():
                    self.snapshots[self.opt.local_epoch] = torch.cat(
                        [p.detach().reshape(-1).clone() for p in self.model.parameters()])
                self.opt.zero_grad()
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e


def train_together(make_opt, run_id, epochs=12, **kw):
    with starling.DHT(listen=LISTEN) as a, \
            starling.DHT(initial_peers=a.get_visible_maddrs(), listen=LISTEN) as b:
        peers = [Peer(a, make_opt, run_id, epochs, 1, **kw),
                 Peer(b, make_opt, run_id, epochs, 2, **kw)]
        threads = [threading.Thread(target=p.run) for p in peers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=240)
        alive = [t.is_alive() for t in threads]
        rounds = [p.opt.status()["rounds_ok"] for p in peers]
        for p in peers:
            p.opt.shutdown()
        return peers, alive, rounds


class OptimizerTest(unittest.TestCase):
    def check(self, peers, alive, rounds):
        self.assertEqual(alive, [False, False], "training did not finish in time")
        # (A peer that missed a round on a loaded machine downloads instead: counts may differ.)
        self.assertGreaterEqual(min(rounds), 3, "the peers did not average")
        for p in peers:
            self.assertIsNone(p.error, repr(p.error))
        common = sorted(set(peers[0].snapshots) & set(peers[1].snapshots))
        self.assertGreaterEqual(len(common), 3, (peers[0].snapshots.keys(), peers[1].snapshots.keys()))
        for e in common:
            self.assertTrue(torch.equal(peers[0].snapshots[e], peers[1].snapshots[e]),
                            f"parameters differ at epoch {e}")
        for p in peers:
            first = sum(p.losses[:4]) / 4
            last = sum(p.losses[-4:]) / 4
            self.assertLess(last, 0.5 * first, f"loss {first:.3f} -> {last:.3f}")

    def test_adam(self):
        self.check(*train_together(lambda ps: torch.optim.Adam(ps, lr=0.01), "py-adam"))

    def test_python_optimizer_steps_on_the_calling_thread(self):
        peers, alive, rounds = train_together(lambda ps: MomentumSGD(ps, lr=0.02), "py-sgd")
        self.check(peers, alive, rounds)
        for p in peers:
            self.assertEqual(p.inner.threads, {p.thread_id})

    def test_joiner_downloads_parameters_and_optimizer_state(self):
        with starling.DHT(listen=LISTEN) as a, \
                starling.DHT(initial_peers=a.get_visible_maddrs(), listen=LISTEN) as b:
            first = Peer(a, lambda ps: torch.optim.Adam(ps, lr=0.01), "py-join", 8, 1)
            t = threading.Thread(target=first.run)
            t.start()
            t.join(timeout=120)
            self.assertFalse(t.is_alive())
            self.assertIsNone(first.error)
            self.assertEqual(first.opt.local_epoch, 8)
            # A second peer joins; the first serves its state while it waits for it.
            model = make_model()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)  # other parameters: the download must replace them
            adam = torch.optim.Adam(model.parameters(), lr=0.01)
            second = starling.Optimizer(dht=b, run_id="py-join", optimizer=adam,
                                        target_batch_size=128, batch_size_per_step=32)
            stop = threading.Event()

            def serve():
                while not stop.is_set():
                    first.opt.serve_state_requests()
                    stop.wait(0.01)

            server = threading.Thread(target=serve)
            server.start()
            try:
                second.load_state_from_peers()
            finally:
                stop.set()
                server.join()
            self.assertEqual(second.local_epoch, 8)
            for p, q in zip(first.model.parameters(), model.parameters()):
                self.assertTrue(torch.equal(p, q))
            s1, s2 = first.inner.state_dict()["state"], adam.state_dict()["state"]
            for k in s1:
                for name in ("exp_avg", "exp_avg_sq", "step"):
                    self.assertTrue(torch.equal(s1[k][name], s2[k][name]), name)
            self.assertGreater(float(s2[0]["step"]), 0)
            second.shutdown()
            first.opt.shutdown()

    def test_errors_are_python_exceptions(self):
        with starling.DHT(listen=LISTEN) as a:
            model = make_model()
            with self.assertRaises(TypeError):
                starling.Optimizer(dht=a, run_id="x", optimizer=object(), target_batch_size=8)
            with self.assertRaises(ValueError):
                starling.Optimizer(dht=a, run_id="x", optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                   target_batch_size=8, compression="zip")
            with self.assertRaises(ValueError):
                starling.Optimizer(dht=a, run_id="", optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                   target_batch_size=8)
            opt = starling.Optimizer(dht=a, run_id="x", optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                     target_batch_size=8, batch_size_per_step=4)
            opt.shutdown()
            with self.assertRaises(starling.StarlingError):
                opt.step()

    def test_private_run_options(self):
        # A private run needs both options; the certificate must exist and be one that admits
        # this peer (docs/security.md, "Private runs"; the C++ tests cover the protocol).
        import tempfile
        with starling.DHT(listen=LISTEN) as a, tempfile.TemporaryDirectory() as d:
            model = make_model()
            sgd = torch.optim.SGD(model.parameters(), lr=0.1)
            run_key = a.peer_id  # any Ed25519 key in its text form
            with self.assertRaises(ValueError):
                starling.Optimizer(dht=a, run_id="x", optimizer=sgd, target_batch_size=8,
                                   run_key=run_key)
            with self.assertRaises(starling.StarlingError):
                starling.Optimizer(dht=a, run_id="x", optimizer=sgd, target_batch_size=8,
                                   run_key=run_key, membership=d + "/missing.cert")
            garbage = d + "/garbage.cert"
            with open(garbage, "wb") as f:
                f.write(b"not a certificate")
            with self.assertRaisesRegex(ValueError, "membership certificate"):
                starling.Optimizer(dht=a, run_id="x", optimizer=sgd, target_batch_size=8,
                                   run_key=run_key, membership=garbage)


if __name__ == "__main__":
    unittest.main(verbosity=2)
