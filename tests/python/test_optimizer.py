"""starling.Optimizer: two peers (threads, each with its own DHT) average and step together;
tensors are shared, the Python step runs on the caller's thread, errors are exceptions."""
import threading
import time
import unittest

import torch
import starling

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def batches(seed, n=None, batch=16):
    g = torch.Generator().manual_seed(seed)
    w = torch.arange(16, dtype=torch.float32).view(2, 8) / 16
    while n is None or n > 0:
        n = None if n is None else n - 1
        x = torch.randn(batch, 8, generator=g)
        yield x, (x @ w.t()).argmax(1)


class RecordingSGD(torch.optim.Optimizer):
    """A Python-written optimizer: plain SGD that records the thread its step ran on."""

    def __init__(self, params, lr):
        super().__init__(params, dict(lr=lr))
        self.threads = set()

    @torch.no_grad()
    def step(self, closure=None):
        self.threads.add(threading.get_ident())
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])


def train(dht, run_id, model, inner, seed, epochs, out, start, done, **kw):
    """Trains until local_epoch >= epochs (or a 120 s deadline), then serves state requests
    until every peer of `done` (threading.Events) is done."""
    opt = starling.Optimizer(dht=dht, run_id=run_id, optimizer=inner, model=model,
                             target_batch_size=64, batch_size_per_step=16,
                             matchmaking_time=1.0, averaging_timeout=20.0, **kw)
    out["ptrs"] = [p.data_ptr() for p in model.parameters()]
    out["thread"] = threading.get_ident()
    losses = []
    deadline = time.monotonic() + 120
    start.wait(timeout=60)
    with opt:
        for x, y in batches(seed):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            if opt.local_epoch >= epochs or time.monotonic() > deadline:
                break
        done[out["index"]].set()
        while not all(d.is_set() for d in done) and time.monotonic() < deadline:
            opt.serve_state_requests()
            done[1 - out["index"]].wait(0.02)
        out["epoch"] = opt.local_epoch
        out["status"] = opt.status()
        out["sync"] = opt.is_synchronized_with_peers()
        out["state"] = opt.state_dict()
    out["losses"] = losses
    out["ptrs_after"] = [p.data_ptr() for p in model.parameters()]
    out["params"] = [p.detach().clone() for p in model.parameters()]


class OptimizerTest(unittest.TestCase):
    def run_pair(self, make_inner, run_id, epochs=3):
        with starling.DHT(listen=LOOPBACK) as a:
            with starling.DHT(initial_peers=a.visible_maddrs, listen=LOOPBACK) as b:
                models = [make_model(), make_model()]
                inners = [make_inner(m) for m in models]
                outs = [{"index": 0}, {"index": 1}]
                start = threading.Barrier(2)
                done = [threading.Event(), threading.Event()]
                errors = []

                def run(i, dht):
                    try:
                        train(dht, run_id, models[i], inners[i], 100 + i, epochs, outs[i], start, done)
                    except BaseException as e:  # reported by the main thread
                        errors.append(e)

                ts = [threading.Thread(target=run, args=(i, d)) for i, d in enumerate((a, b))]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join(timeout=240)
                self.assertFalse(any(t.is_alive() for t in ts), "training threads hung")
                self.assertEqual(errors, [])
        for o in outs:
            self.assertGreaterEqual(o["epoch"], epochs)
            self.assertEqual(o["ptrs"], o["ptrs_after"])  # stepped in place, never replaced
            self.assertGreaterEqual(o["status"]["rounds_ok"], 1)
            self.assertTrue(o["sync"])
            self.assertEqual(o["state"]["local_epoch"], o["epoch"])
        self.assertEqual(outs[0]["epoch"], outs[1]["epoch"])
        for p, q in zip(outs[0]["params"], outs[1]["params"]):
            self.assertTrue(torch.equal(p, q), "peers' parameters differ")
        # Params moved away from the common start.
        start = [p.detach() for p in make_model().parameters()]
        self.assertFalse(all(torch.equal(p, s) for p, s in zip(outs[0]["params"], start)))
        return outs, inners

    def test_two_peers_adam(self):
        self.run_pair(lambda m: torch.optim.Adam(m.parameters(), lr=1e-2), "py-adam")

    def test_two_peers_python_optimizer_on_caller_thread(self):
        outs, inners = self.run_pair(lambda m: RecordingSGD(m.parameters(), lr=0.1), "py-sgd")
        for o, inner in zip(outs, inners):
            self.assertEqual(inner.threads, {o["thread"]})

    def test_bad_input(self):
        model = make_model()
        adam = torch.optim.Adam(model.parameters())
        with self.assertRaises(TypeError):
            starling.Optimizer(dht=None, run_id="r", optimizer=42)
        with self.assertRaises(TypeError):
            starling.Optimizer(dht="not a dht", run_id="r", optimizer=adam)
        with self.assertRaises(ValueError) as ctx:
            starling.Optimizer(dht=None, run_id="r", optimizer=adam, model=make_model(1))
        self.assertIn("not a model parameter", str(ctx.exception))
        with self.assertRaises(ValueError):
            starling.Optimizer(dht=None, run_id="", optimizer=adam)
        with self.assertRaises(ValueError):
            starling.Optimizer(dht=None, run_id="r", optimizer=adam, delay_optimizer_step=True)
        with self.assertRaises(ValueError):
            starling.Optimizer(dht=None, run_id="r", optimizer=adam, compression="zip")
        dht = starling.DHT(listen=LOOPBACK)
        dht.shutdown()
        with self.assertRaises(starling.StarlingError):
            starling.Optimizer(dht=dht, run_id="r", optimizer=adam)
        # A Python exception in the optimizer's step surfaces from step().
        class Broken(torch.optim.SGD):
            def step(self, closure=None):
                raise ArithmeticError("broken step")
        opt = starling.Optimizer(dht=None, run_id="r", model=model,
                                 optimizer=lambda ps: Broken(ps, lr=0.1), target_batch_size=4)
        model(torch.randn(4, 8)).sum().backward()
        with self.assertRaises(ArithmeticError):
            opt.step(batch_size=4)
        opt.shutdown()
        with self.assertRaises(starling.StarlingError):
            opt.step(batch_size=4)

    def test_alone_factory_and_status(self):
        model = make_model()
        before = [p.detach().clone() for p in model.parameters()]
        with starling.Optimizer(dht=None, run_id="alone", model=model, target_batch_size=32,
                                optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1)) as opt:
            grad_ptrs = None
            for x, y in batches(1, 4):
                torch.nn.functional.cross_entropy(model(x), y).backward()
                if grad_ptrs is None:
                    grad_ptrs = [p.grad.data_ptr() for p in model.parameters()]
                rep = opt.step_report(batch_size=16)
                # The C++ side zeroed the very .grad tensors of the model.
                self.assertEqual([p.grad.data_ptr() for p in model.parameters()], grad_ptrs)
                self.assertTrue(all(float(p.grad.abs().sum()) == 0 for p in model.parameters()))
            self.assertEqual(opt.local_epoch, 2)
            self.assertTrue(rep["stepped"])
            st = opt.status()
            self.assertEqual(st["samples_total"], 64)
        self.assertFalse(all(torch.equal(p, b) for p, b in zip(model.parameters(), before)))


if __name__ == "__main__":
    unittest.main(verbosity=2)
