#!/usr/bin/python3
"""Delayed-update corrections in plain PyTorch (no Starling): the recipe of
bench/time_to_accuracy.sh (MLP 784-256-10, Adam lr 0.003, global batch 1024 split over
PEERS peers) stepped with one-step-delayed averages, to compare corrections at equal steps.

Modes (g_i: peer i's mean gradient over its share of the batch; M_t: the collaboration's
parameters after t steps, identical on every peer; step(M, g): an Adam step from M with the
shared optimizer state):
  fresh    synchronous: the average of gradients taken at M_t is applied to M_t.
  stale    delayed, no correction: gradients taken at M_{t-1} are applied to M_t.
  predict  weight prediction: gradients taken at M_t + (M_t - M_{t-1}) (the default of
           OptimizerOptions::delay_correction).
  local    each peer takes its next gradients at step(M_t, own g_i) (its own fresh gradient
           applied at once, without committing the optimizer state), and the average replaces
           that local step one round later: the average applied to M_t is of gradients taken at
           the peers' step(M_{t-1}, g_i), not at M_{t-1}.
Prints test accuracy at the chosen steps per mode and seed, and the means.
Usage: bench/delay_correction.py [--steps 70,124,180] [--seeds 2] [--peers 4] [--modes ...]
"""
import argparse
import gzip
import os
import struct

import torch

DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530


def load(kind):
    with gzip.open(os.path.join(DATA, f"{kind}-images-idx3-ubyte.gz")) as f:
        _, n, r, c = struct.unpack(">IIII", f.read(16))
        x = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).reshape(n, r * c)
    with gzip.open(os.path.join(DATA, f"{kind}-labels-idx1-ubyte.gz")) as f:
        f.read(8)
        y = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    return (x.float() / 255 - MEAN) / STD, y


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


class Adam:
    """Adam on a list of tensors with an explicit state, so a step can be previewed."""

    def __init__(self, params, lr=0.003, b1=0.9, b2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps = lr, b1, b2, eps
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = 0

    def delta(self, grads, commit):
        t = self.t + 1
        out = []
        for i, g in enumerate(grads):
            m = self.b1 * self.m[i] + (1 - self.b1) * g
            v = self.b2 * self.v[i] + (1 - self.b2) * g * g
            if commit:
                self.m[i], self.v[i] = m, v
            mh = m / (1 - self.b1**t)
            vh = v / (1 - self.b2**t)
            out.append(-self.lr * mh / (vh.sqrt() + self.eps))
        if commit:
            self.t = t
        return out


def grads_at(net, params, x, y):
    with torch.no_grad():
        for p, q in zip(net.parameters(), params):
            p.copy_(q)
    net.zero_grad()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    return [p.grad.detach().clone() for p in net.parameters()]


def accuracy(net, params, x, y):
    with torch.no_grad():
        for p, q in zip(net.parameters(), params):
            p.copy_(q)
        return (net(x).argmax(1) == y).float().mean().item()


def add(a, b):
    return [p + q for p, q in zip(a, b)]


def run(mode, seed, steps, peers, xtr, ytr, xte, yte, batch=1024):
    net = model(seed)
    master = [p.detach().clone() for p in net.parameters()]
    prev = [p.clone() for p in master]
    opt = Adam(master)
    g = torch.Generator().manual_seed(1000 + seed)
    share = batch // peers
    pending = None  # the average of the round in flight (delayed modes)
    # Where each peer takes its next gradients.
    at = [[p.clone() for p in master] for _ in range(peers)]
    acc = {}
    applied = 0  # steps applied to master
    while applied < max(steps):
        idx = torch.randint(0, xtr.shape[0], (batch,), generator=g)
        own = [grads_at(net, at[i], xtr[idx[i * share:(i + 1) * share]],
                        ytr[idx[i * share:(i + 1) * share]]) for i in range(peers)]
        avg = [sum(gs) / peers for gs in zip(*own)]
        if mode == "fresh":
            master = add(master, opt.delta(avg, True))
            applied += 1
            at = [master] * peers
        else:
            # The round of the previous epoch lands now; this epoch's round is in flight.
            if pending is not None:
                prev = master
                master = add(master, opt.delta(pending, True))
                applied += 1
            pending = avg
            if mode == "stale":
                at = [master] * peers
            elif mode == "predict":
                at = [add(master, [m - p for m, p in zip(master, prev)])] * peers
            elif mode == "local":
                at = [add(master, opt.delta(own[i], False)) for i in range(peers)]
        if applied in steps and applied not in acc:
            acc[applied] = accuracy(net, master, xte, yte)
    return acc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", default="70,124,180")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--modes", default="fresh,stale,predict,local")
    a = ap.parse_args()
    torch.set_num_threads(1)
    steps = [int(s) for s in a.steps.split(",")]
    xtr, ytr = load("train")
    xte, yte = load("t10k")
    print(f"load {os.getloadavg()[0]:.2f}; peers {a.peers}; test accuracy at steps {steps}")
    for mode in a.modes.split(","):
        res = [run(mode, s, steps, a.peers, xtr, ytr, xte, yte) for s in range(a.seeds)]
        mean = {t: sum(r[t] for r in res) / len(res) for t in steps}
        print(f"{mode:8s} " + "  ".join(f"step {t}: {mean[t]:.4f}" for t in steps) + "   per seed: " +
              "; ".join(" ".join(f"{r[t]:.4f}" for t in steps) for r in res), flush=True)


if __name__ == "__main__":
    main()
