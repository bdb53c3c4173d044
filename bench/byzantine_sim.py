#!/usr/bin/python3
"""Byzantine aggregation in plain PyTorch (no Starling): the recipe of bench/run-byzantine.sh
(MLP 784-256-10, Adam lr 0.003, global batch 1024 split over PEERS peers, 40 steps) with
ATTACKERS peers sending corrupted gradients, aggregated the way Starling's part owners do, to
compare aggregation rules at equal steps against the clean run (no attacker, plain mean) of
the same seed.

Attacks (as src/collab/net_collaboration_attack.cpp):
  none       attackers send honest gradients (the aggregation's cost without attack)
  sign-flip  -10 x the gradient, claiming 10x the samples (the weight cap brings it to 1x)
  random     noise 100x the RMS of what it would send, claiming 10x the samples
  label-flip its gradient on the labels 9 - y (as `starling train --attack label-flip`)
  alie       gradient - 1 x sd per coordinate, sd from the attacker's own gradients (EMA 0.9)
  alie-paper mean - z sd of the honest gradients, z = Phi^-1((n - s) / n), s = n/2 + 1 - m
  reverse-mean  -10 x the honest peers' mean, claiming 10x the samples (a sign flip that
             knows the honest average)
Aggregations (name: rule; "cc" = CenteredClip from the coordinate-wise median, iterated to a
fixed point, weights capped at the median; tau = scale x median distance to the median):
  mean, oracle (the honest peers' mean), cc<scale>[-whole][-it<k>][-b<size>]: per part (7
  contiguous parts, or each cut into parts of at most <size> elements) unless -whole;
  -taper<c>: a member's factor min(1, tau/d) falls linearly to 0 from c/2 x tau to c x tau
  (Starling's AggregationConfig::cut); -drop<c>: after the fixed point, members farther than
  c x tau get weight 0 and the clip runs again, until the dropped set is stable; any of
  them with -mom[b]: worker momentum b (0.9): peers send the moving average of their
  gradients, Adam beta1 0 (starling train --worker-momentum).
Prints per attack and aggregation the mean test accuracy over seeds and the ratio to clean;
with -taper, how many honest members per part and step the taper reached (beyond cut/2 x tau)
or left out, and how many attackers it left out.
Results of 2026-11-29 (4 seeds, ratio to clean): docs/benchmarks.md, hostile peers.
Usage: bench/byzantine_sim.py [--seeds 3] [--steps 40] [--attacks ...] [--aggs ...]
"""
import argparse
import sys

import torch

from delay_correction import load  # Fashion-MNIST, normalised


def flat_grad(net, x, y):
    net.zero_grad()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in net.parameters()]).double()


def coef(d, tau, cut):
    """CenteredClip's weight factor min(1, tau/d); with cut > 0 (-taper) it falls linearly
    from 1 x that at cut/2 x tau to 0 at cut x tau (robust.hpp, clip_coef)."""
    c = torch.where(d > tau, tau / d.clamp_min(1e-30), torch.ones_like(d))
    if cut > 0:
        c = c * ((cut * tau - d) / (0.5 * cut * tau)).clamp(0, 1)
    return c


def cclip(G, w, scale, iters, start=None, tau=None, cut=0.0):
    """CenteredClip of rows G (k x d) with weights w, from the coordinate median (or start)."""
    v = G.median(dim=0).values if G.shape[0] % 2 else G.sort(dim=0).values[
        G.shape[0] // 2 - 1: G.shape[0] // 2 + 1].mean(dim=0)
    if start is not None:
        v = start.clone()
    d = (G - v).norm(dim=1)
    if tau is None:
        tau = scale * d.median().item() if G.shape[0] % 2 else scale * d.sort().values[
            G.shape[0] // 2 - 1: G.shape[0] // 2 + 1].mean().item()
    W = w.sum()
    for _ in range(iters):
        d = (G - v).norm(dim=1)
        c = coef(d, tau, cut)
        step = ((w * c / W)[:, None] * (G - v)).sum(dim=0)
        v = v + step
        if step.norm() <= 1e-5 * max(v.norm().item(), 1e-30):
            break
    return v, tau


def cclip_drop(G, w, scale, iters, cut, rounds=10):
    """-drop<c>: CenteredClip, then weight 0 for members farther than c x tau from the result,
    clipped again from the coordinate median with the same tau, until the dropped set is
    stable (at most `rounds` times)."""
    v, tau = cclip(G, w, scale, iters)
    drop = torch.zeros(G.shape[0], dtype=torch.bool)
    for _ in range(rounds):
        new = (G - v).norm(dim=1) > cut * tau
        if new.sum() * 2 >= G.shape[0]:  # never a majority
            break
        if torch.equal(new, drop):
            break
        drop = new
        v, _ = cclip(G, torch.where(drop, torch.zeros_like(w), w), scale, iters, tau=tau)
    return v


def aggregate(G, w, agg, parts, state):
    agg = "-".join(o for o in agg.split("-") if not o.startswith("mom"))
    if agg == "mean":
        return (w[:, None] * G).sum(0) / w.sum()
    if agg == "oracle":  # the honest peers' mean: what a perfect filter would give
        m = state["attackers"]
        return (w[m:, None] * G[m:]).sum(0) / w[m:].sum()
    med = w.median()
    w = torch.minimum(w, med)
    opts = agg.split("-")
    scale = float(opts[0][2:] or 1)
    iters = 1000
    whole = "whole" in opts
    block = 0
    for o in opts:
        if o.startswith("it"):
            iters = int(o[2:])
        if o.startswith("b"):
            block = int(o[1:])
    if block:  # each owner's share cut into parts of at most `block` elements
        parts = [(a, min(a + block, b)) for a0, b in parts for a in range(a0, b, block)]
    cut = next((float(o[5:]) for o in opts if o.startswith("taper")), 0.0)
    drop = next((float(o[4:]) for o in opts if o.startswith("drop")), 0.0)

    def one(Gp, start):
        if drop:
            return cclip_drop(Gp, w, scale, iters, drop)
        v, tau = cclip(Gp, w, scale, iters, start, cut=cut)
        if cut > 0:  # who the taper reached at the result: honest rows tapered or out, attackers out
            d = (Gp - v).norm(dim=1)
            m = state["attackers"]
            st = state.setdefault("taper", [0, 0, 0, 0])
            st[0] += int((d[m:] > 0.5 * cut * tau).sum())
            st[1] += int((d[m:] >= cut * tau).sum())
            st[2] += int((d[:m] >= cut * tau).sum())
            st[3] += 1
        return v

    prev = state.get("prev") if "hist" in opts else None
    if whole:
        out = one(G, prev)
    else:
        out = torch.empty(G.shape[1], dtype=G.dtype)
        for a, b in parts:
            out[a:b] = one(G[:, a:b], None if prev is None else prev[a:b])
    state["prev"] = out
    return out


def run(attack, agg, seed, args, data):
    xtr, ytr, xte, yte = data
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    params = list(net.parameters())
    # -mom[b]: worker momentum (Karimireddy et al. 2021): each peer sends the EMA (b, 0.9) of its
    # gradients and Adam runs without its own first moment (b1 = 0): with the mean this is
    # Adam on the mean gradient exactly; the attacks corrupt the vector sent.
    mom = next((float(o[3:] or 0.9) for o in agg.split("-") if o.startswith("mom")), 0)
    opt = torch.optim.Adam(params, lr=args.lr, betas=(0.0, 0.999) if mom else (0.9, 0.999))
    wm = [None] * args.peers
    n, m = args.peers, args.attackers
    per = args.batch // n
    d = sum(p.numel() for p in params)
    share = [d // n + (1 if i < d % n else 0) for i in range(n)]
    bounds, a = [], 0
    for s in share:
        bounds.append((a, a + s))
        a += s
    g = torch.Generator().manual_seed(1000 + seed)
    perm = torch.randperm(xtr.shape[0], generator=g)
    pos = 0
    ema_m = [None] * n
    ema_s = [None] * n
    state = {"attackers": m}
    s_alie = n // 2 + 1 - m
    z_paper = torch.distributions.Normal(0, 1).icdf(torch.tensor((n - s_alie) / n)).item()
    for step in range(args.steps):
        G = []
        for i in range(n):
            idx = perm[pos:pos + per]
            pos += per
            y = 9 - ytr[idx] if attack == "label-flip" and i < m else ytr[idx]
            G.append(flat_grad(net, xtr[idx], y))
        G = torch.stack(G)
        if mom:
            for i in range(n):
                wm[i] = (1 - mom) * G[i] if wm[i] is None else mom * wm[i] + (1 - mom) * G[i]
                G[i] = wm[i] / (1 - mom ** (step + 1))
        w = torch.full((n,), float(per), dtype=torch.float64)
        honest = G[m:]
        for i in range(m):
            if attack == "sign-flip":
                G[i] = -10 * G[i]
                w[i] *= 10
            elif attack == "alie":
                if ema_m[i] is None:
                    ema_m[i], ema_s[i] = G[i].clone(), G[i] ** 2
                ema_m[i] = 0.9 * ema_m[i] + 0.1 * G[i]
                ema_s[i] = 0.9 * ema_s[i] + 0.1 * G[i] ** 2
                G[i] = G[i] - (ema_s[i] - ema_m[i] ** 2).clamp_min(0).sqrt()
            elif attack == "random":  # noise 100x the RMS of what it would send
                rms = G[i].pow(2).mean().sqrt()
                G[i] = torch.randn(G.shape[1], generator=g, dtype=G.dtype) * 100 * rms
                w[i] *= 10
            elif attack == "reverse-mean":  # omniscient sign flip: -10 x the honest mean
                G[i] = -10 * honest.mean(0)
                w[i] *= 10
            elif attack == "alie-paper":
                G[i] = honest.mean(0) - z_paper * honest.std(0)
        v = aggregate(G, w, "mean" if attack == "clean" else agg, bounds, state)
        a = 0
        for p in params:
            p.grad = v[a:a + p.numel()].reshape(p.shape).float()
            a += p.numel()
        opt.step()
    run.taper = state.get("taper")
    with torch.no_grad():
        return (net(xte).argmax(1) == yte).float().mean().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--peers", type=int, default=7)
    ap.add_argument("--attackers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--attacks", default="sign-flip,alie,alie-paper")
    ap.add_argument("--aggs", default="mean,cc1,cc1-it20,cc0.5,cc0.25,cc1-whole")
    args = ap.parse_args()
    torch.set_num_threads(1)
    xtr, ytr = load("train")
    xte, yte = load("t10k")
    data = (xtr, ytr, xte, yte)
    clean = [run("clean", "mean", s, args, data) for s in range(args.seeds)]
    c = sum(clean) / len(clean)
    print(f"clean (mean, no attacker): {c:.4f} {['%.4f' % x for x in clean]}", flush=True)
    for attack in args.attacks.split(","):
        for agg in args.aggs.split(","):
            accs, taper = [], [0, 0, 0, 0]
            for s in range(args.seeds):
                accs.append(run(attack, agg, s, args, data))
                taper = [a + b for a, b in zip(taper, run.taper or [0] * 4)]
            r = [x / y for x, y in zip(accs, clean)]
            extra = ""
            if taper[3]:  # per part and step, over the seeds
                extra = (f" | per part-step: honest tapered {taper[0] / taper[3]:.4f}, honest out "
                         f"{taper[1] / taper[3]:.4f}, attackers out {taper[2] / taper[3]:.3f}")
            print(f"{attack:10s} {agg:16s} acc {sum(accs)/len(accs):.4f} ratio "
                  f"{sum(r)/len(r):.3f} min {min(r):.3f} {['%.3f' % x for x in r]}{extra}",
                  flush=True)


if __name__ == "__main__":
    sys.exit(main())
