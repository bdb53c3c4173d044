#!/usr/bin/python3
"""Fashion-MNIST in plain PyTorch, trained together with other peers through Starling.

The same model, initial parameters and recipe as `starling train`'s defaults (MLP 784-256-10
from model seed 0, Adam lr 0.001, batches of 64, a collaborative step every 1,024 samples,
run id fashion-mnist), so this script's peers and `starling train` peers train together in
one run: they average the same gradients and download each other's state (parameters and
Adam's moments). Start a bootstrap node (`build/bin/starling dht --listen
/ip4/127.0.0.1/tcp/4001`) and then, in several terminals, this script or `starling train`:

    /usr/bin/python3 examples/python/fashion_mnist.py --initial-peers /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW...
    build/bin/starling train --initial-peers /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW...

The last line it prints ends with param_hash, the same hash of the parameters `starling
train` prints: peers that hold identical parameters print the same value.

Data: Debian's dataset-fashion-mnist (scripts/install-deps.sh installs it).
"""
import argparse
import gzip
import hashlib
import os
import sys
import time

import numpy as np
import torch

import starling

DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530  # the built-in task's normalisation


def load(kind):
    with gzip.open(os.path.join(DATA, f"{kind}-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(DATA, f"{kind}-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    x = (torch.from_numpy(x.copy()).float() / 255 - MEAN) / STD
    return x, torch.from_numpy(y.copy()).long()


def make_model(seed=0):
    """`starling train --model mlp --model-seed SEED`'s model with its initial parameters. The
    C++ model is built as Sequential(Flatten(), Linear(784, 256), ReLU(), Linear(256, 10)), and
    GCC evaluates those constructor arguments from the last to the first: the second Linear
    draws its initial values from the seeded generator before the first one does."""
    torch.manual_seed(seed)
    out = torch.nn.Linear(256, 10)
    hidden = torch.nn.Linear(28 * 28, 256)
    return torch.nn.Sequential(torch.nn.Flatten(), hidden, torch.nn.ReLU(), out)


def parameter_hash(model):
    """`starling train`'s param_hash: SHA-256 of the float32 parameters in order, 8 bytes."""
    data = b"".join(p.detach().float().contiguous().numpy().tobytes() for p in model.parameters())
    return hashlib.sha256(data).hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--initial-peers", nargs="*", default=[])
    ap.add_argument("--listen", nargs="*", default=["/ip4/127.0.0.1/tcp/0"])
    ap.add_argument("--run-id", default="fashion-mnist")
    ap.add_argument("--epochs", type=int, default=100, help="stop at this collaboration epoch")
    ap.add_argument("--max-seconds", type=float, default=0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--model-seed", type=int, default=0, help="initial parameters (all peers)")
    ap.add_argument("--linger", type=float, default=30,
                    help="after the last step, serve the state to peers still behind for up to "
                         "this many seconds (as starling train --linger)")
    ap.add_argument("--target-batch-size", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--compression", default="none")
    ap.add_argument("--seed", type=int, default=0, help="data order (the model's seed is fixed)")
    args = ap.parse_args()
    if not os.path.exists(DATA):
        sys.exit(f"{DATA} is missing: run scripts/install-deps.sh (dataset-fashion-mnist)")
    torch.set_num_threads(1)
    x, y = load("train")
    xt, yt = load("t10k")
    model = make_model(args.model_seed)  # every peer starts from the same parameters
    adam = torch.optim.Adam(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed or os.getpid())
    t0 = time.time()
    samples = 0
    with starling.DHT(initial_peers=args.initial_peers, listen=args.listen) as dht:
        print("peer", dht.peer_id, *dht.get_visible_maddrs(), flush=True)
        # model=: the parameters carry the model's names (1.weight, ...), as in C++ peers.
        with starling.Optimizer(dht=dht, run_id=args.run_id, optimizer=adam, model=model,
                                target_batch_size=args.target_batch_size,
                                batch_size_per_step=args.batch_size,
                                compression=args.compression) as opt:
            try:
                while opt.local_epoch < args.epochs:
                    if args.max_seconds and time.time() - t0 > args.max_seconds:
                        break
                    idx = torch.randint(0, len(x), (args.batch_size,), generator=gen)
                    loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
                    loss.backward()
                    samples += args.batch_size
                    if opt.step():
                        s = opt.status()
                        print(f"epoch {opt.local_epoch}: loss {loss.item():.3f}, "
                              f"{s['num_peers']} peers", flush=True)
                    opt.zero_grad()
                secs = time.time() - t0
                linger(opt, args.linger)
            except KeyboardInterrupt:
                secs = time.time() - t0
                print("interrupted: leaving the collaboration", flush=True)
            with torch.no_grad():
                acc = (model(xt).argmax(1) == yt).float().mean().item()
            s = opt.status()
            print(f"done: epoch {opt.local_epoch} test_accuracy {acc:.4f} samples {samples} "
                  f"seconds {secs:.1f} samples_per_second {samples / secs:.1f} "
                  f"rounds {s['rounds_ok']}/{s['rounds_ok'] + s['rounds_failed']} "
                  f"state_downloads {s['state_downloads']} param_hash {parameter_hash(model)}",
                  flush=True)


def linger(opt, seconds):
    """Serves the state to peers still behind until every live peer is at this epoch."""
    t0 = time.time()
    while time.time() - t0 < seconds:
        opt.serve_state_requests()
        s = opt.status()
        if time.time() - t0 > 3 and s["peers_at_global_epoch"] >= s["num_peers"]:
            break
        time.sleep(0.05)


if __name__ == "__main__":
    main()
