#!/usr/bin/python3
"""Fashion-MNIST in plain PyTorch, trained collaboratively with starling.Optimizer.

The model is the built-in task's MLP (784-256-10, ReLU: `starling train --task fashion`), the
data the same IDX files (/usr/share/datasets/fashion-mnist, Debian's dataset-fashion-mnist),
normalised the same way. Start a bootstrap node, then any number of peers:

  build/bin/starling dht --listen /ip4/127.0.0.1/tcp/0        # prints its address
  PYTHONPATH=build/python python3 examples/python/fashion_mnist.py --initial-peers ADDR
  PYTHONPATH=build/python python3 examples/python/fashion_mnist.py --initial-peers ADDR

(after `make python-install`, PYTHONPATH is not needed). Ctrl-C leaves the collaboration.
"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import starling

MEAN, STD = 0.2860, 0.3530  # the C++ task's normalisation


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndims))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndims).reshape(shape)


def load_split(data_dir, prefix):
    images = load_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz"))
    labels = load_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz"))
    x = (torch.from_numpy(images.copy()).float().div_(255) - MEAN) / STD
    return x.unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


def make_model(seed):
    torch.manual_seed(seed)  # every peer starts from the same parameters
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 256),
                               torch.nn.ReLU(), torch.nn.Linear(256, 10))


def evaluate(model, x, y):
    with torch.no_grad():
        logits = model(x)
        return (logits.argmax(1) == y).float().mean().item(), \
            torch.nn.functional.cross_entropy(logits, y).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--initial-peers", nargs="*", default=[])
    ap.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0")
    ap.add_argument("--run-id", default="fashion-py")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--target-batch-size", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model-seed", type=int, default=0)
    ap.add_argument("--data-seed", type=int, default=None, help="default: from the peer id")
    ap.add_argument("--max-epochs", type=int, default=0, help="0: no limit")
    ap.add_argument("--max-seconds", type=float, default=0, help="0: no limit")
    ap.add_argument("--report", help="write a JSON summary here (as starling train --report)")
    ap.add_argument("--progress-every", type=float, default=5.0, help="seconds")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    x_train, y_train = load_split(a.data_dir, "train")
    x_test, y_test = load_split(a.data_dir, "t10k")
    model = make_model(a.model_seed)
    dht = starling.DHT(initial_peers=a.initial_peers, listen=[a.listen])
    print("peer", dht.peer_id, "listening on", " ".join(dht.visible_maddrs), flush=True)
    opt = starling.Optimizer(dht=dht, run_id=a.run_id, model=model,
                             optimizer=torch.optim.Adam(model.parameters(), lr=a.lr),
                             target_batch_size=a.target_batch_size,
                             batch_size_per_step=a.batch_size)
    seed = a.data_seed if a.data_seed is not None else hash(dht.peer_id) & 0xFFFFFFFF
    gen = torch.Generator().manual_seed(seed)
    t0 = last = time.monotonic()
    samples = 0
    try:
        while True:
            for idx in torch.randperm(len(y_train), generator=gen).split(a.batch_size):
                if len(idx) < a.batch_size:
                    continue
                loss = torch.nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
                loss.backward()
                opt.step()
                opt.zero_grad()
                samples += a.batch_size
                now = time.monotonic()
                if now - last >= a.progress_every:
                    last = now
                    st = opt.status()
                    print(f"epoch {opt.local_epoch} loss {loss.item():.4f} "
                          f"{samples / (now - t0):.0f} samples/s, {st['num_peers']} peers, "
                          f"collaboration {st['samples_per_second']:.0f} samples/s", flush=True)
                if (a.max_epochs and opt.local_epoch >= a.max_epochs) or \
                        (a.max_seconds and now - t0 >= a.max_seconds):
                    raise StopIteration
    except (StopIteration, KeyboardInterrupt) as e:
        elapsed = time.monotonic() - t0
        status = opt.status()
        print(("interrupted: " if isinstance(e, KeyboardInterrupt) else "") +
              f"{samples} samples in {elapsed:.1f} s: {samples / elapsed:.1f} samples/s, "
              f"epoch {opt.local_epoch}", flush=True)
    finally:
        opt.shutdown()  # bounded: leaves the round in flight and the collaboration
        dht.shutdown()
    acc, loss = evaluate(model, x_test, y_test)
    print(f"test accuracy {acc:.4f} loss {loss:.4f}", flush=True)
    if a.report:
        with open(a.report, "w") as f:
            json.dump({"peer": dht.peer_id, "epoch": status["local_epoch"], "samples": samples,
                       "seconds": elapsed, "step_seconds": status["step_time"],
                       "rounds_ok": status["rounds_ok"], "test_accuracy": acc,
                       "test_loss": loss}, f)


if __name__ == "__main__":
    main()
