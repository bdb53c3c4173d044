#!/usr/bin/python3
"""Fashion-MNIST in plain PyTorch, trained together with other peers through Starling.

The same model and recipe as `starling train` (MLP 784-256-10, Adam lr 0.003, batches of 64,
a collaborative step every 1,024 samples), so Python and C++ peers of one run id train the
same model. Start a bootstrap node (`build/bin/starling dht --listen /ip4/127.0.0.1/tcp/4001`)
and then, in several terminals:

    /usr/bin/python3 examples/python/fashion_mnist.py --initial-peers /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW...

Data: Debian's dataset-fashion-mnist (scripts/install-deps.sh installs it).
"""
import argparse
import gzip
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--initial-peers", nargs="*", default=[])
    ap.add_argument("--listen", nargs="*", default=["/ip4/127.0.0.1/tcp/0"])
    ap.add_argument("--run-id", default="fashion-py")
    ap.add_argument("--epochs", type=int, default=100, help="stop at this collaboration epoch")
    ap.add_argument("--max-seconds", type=float, default=0)
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
    torch.manual_seed(0)  # every peer starts from the same parameters
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    adam = torch.optim.Adam(model.parameters(), lr=0.003)
    gen = torch.Generator().manual_seed(args.seed or os.getpid())
    t0 = time.time()
    samples = 0
    with starling.DHT(initial_peers=args.initial_peers, listen=args.listen) as dht:
        print("peer", dht.peer_id, *dht.get_visible_maddrs(), flush=True)
        with starling.Optimizer(dht=dht, run_id=args.run_id, optimizer=adam,
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
            except KeyboardInterrupt:
                print("interrupted: leaving the collaboration", flush=True)
            with torch.no_grad():
                acc = (model(xt).argmax(1) == yt).float().mean().item()
            secs = time.time() - t0
            print(f"done: epoch {opt.local_epoch} test_accuracy {acc:.4f} samples {samples} "
                  f"seconds {secs:.1f} samples_per_second {samples / secs:.1f}", flush=True)


if __name__ == "__main__":
    main()
