"""One peer of test_collab.py: trains a small MLP with starling.Optimizer until local_epoch >=
--epochs, prints one JSON line with its results, then serves state requests until the parent
writes a line to stdin (every peer is done) or stdin closes."""
import argparse
import hashlib
import json
import select
import sys
import time

import torch
import starling


class PyMomentumSGD(torch.optim.Optimizer):
    """SGD with momentum written in Python (its state lives in self.state, as torch's)."""

    def __init__(self, params, lr=0.05, momentum=0.9):
        super().__init__(params, dict(lr=lr, momentum=momentum))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.mul_(group["momentum"]).add_(p.grad)
                p.add_(buf, alpha=-group["lr"])


def data(seed, batch):
    g = torch.Generator().manual_seed(seed)
    w = torch.linspace(-1, 1, 40, dtype=torch.float32).view(4, 10)
    while True:
        x = torch.randn(batch, 10, generator=g)
        yield x, (x @ w.t()).argmax(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--initial-peers", nargs="*", default=[])
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--optimizer", choices=["adam", "python"], default="adam")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--deadline", type=float, default=150)
    ap.add_argument("--peers", type=int, default=1, help="wait for this many peers to start")
    ap.add_argument("--step-delay", type=float, default=0, help="emulated compute per step (s)")
    a = ap.parse_args()
    deadline = time.monotonic() + a.deadline
    torch.manual_seed(0)  # the same initial parameters on every peer
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    if a.optimizer == "adam":
        inner = torch.optim.Adam(model.parameters(), lr=1e-2)
    else:
        inner = PyMomentumSGD(model.parameters())
    x_eval, y_eval = next(data(12345, 512))

    def eval_loss():
        with torch.no_grad():
            return torch.nn.functional.cross_entropy(model(x_eval), y_eval).item()

    loss0 = eval_loss()
    dht = starling.DHT(initial_peers=a.initial_peers, listen=["/ip4/127.0.0.1/tcp/0"])
    print(json.dumps({"maddrs": dht.visible_maddrs}), flush=True)
    # Start together (unless this peer is meant to join late and download the state).
    key = a.run_id + "/ready"
    dht.store(key, b"1", starling.get_dht_time() + 120, subkey=dht.peer_id)
    while time.monotonic() < deadline:
        found = dht.get(key, latest=True)
        if found is not None and len(found.value) >= a.peers:
            break
        time.sleep(0.05)
    # Created once all are there: a new optimizer holds its first round until a fetch begun
    # matchmaking_time after its start saw the peers started with it (no partial-view rounds).
    opt = starling.Optimizer(dht=dht, run_id=a.run_id, optimizer=inner,
                             target_batch_size=128, batch_size_per_step=16,
                             matchmaking_time=1.0, averaging_timeout=20.0)
    steps = 0
    epoch = 0
    for x, y in data(a.seed, 16):
        if a.step_delay:
            time.sleep(a.step_delay)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        steps += 1
        if opt.local_epoch != epoch:
            epoch = opt.local_epoch
            print(json.dumps({"epoch_reached": epoch}), flush=True)
        if opt.local_epoch >= a.epochs or time.monotonic() > deadline:
            break
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
    st = opt.status()
    opt_digest = hashlib.sha256()
    for p in model.parameters():  # the Python optimizer's state, in parameter order
        for k, v in sorted(inner.state.get(p, {}).items()):
            opt_digest.update(k.encode() + v.detach().numpy().tobytes())
    print(json.dumps({"epoch": opt.local_epoch, "hash": digest.hexdigest(),
                      "opt_hash": opt_digest.hexdigest(), "steps": steps,
                      "loss0": loss0, "loss": eval_loss(), "rounds_ok": st["rounds_ok"],
                      "state_downloads": st["state_downloads"]}), flush=True)
    while time.monotonic() < deadline:
        opt.serve_state_requests()
        ready, _, _ = select.select([sys.stdin], [], [], 0.02)
        if ready:
            break
    opt.shutdown()
    dht.shutdown()


if __name__ == "__main__":
    main()
