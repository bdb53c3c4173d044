"""One Python peer of test_mixed.py: examples/python/fashion_mnist.py's model, initial
parameters and recipe (those of `starling train`'s defaults) with starling.Optimizer(model=...).
Prints JSON lines: its addresses, every local epoch it reaches, then its result (epoch,
param_hash as `starling train` computes it, state downloads, rounds); then serves state
requests until the parent writes a line to stdin or closes it.

--wait-go: once its DHT node runs and the data is loaded, prints {"ready": ...} and builds
the optimizer only when the parent writes "go" (the C++ trainers of the test are fast: a peer
that joins on cue then joins at the epoch the parent saw).
--plain-steps N: no Starling at all: N steps of torch.optim.Adam on the mean gradient of 1,024
samples (16 batches of 64), the collaboration's recipe for one process alone.
--aggregation / --verify / --worker-momentum: starling.Optimizer's options against hostile
peers (the result then lists the peers this one banned).
--load-only: builds the optimizer, calls load_state_from_peers() once and prints what
happened (the parameter hash, or the error's type and message) instead of training."""
import argparse
import json
import os
import select
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "python"))
import torch  # noqa: E402
import starling  # noqa: E402
import fashion_mnist as fm  # noqa: E402


def say(**kw):
    print(json.dumps(kw), flush=True)


def accuracy_of(model):
    xt, yt = fm.load("t10k")
    with torch.no_grad():
        return (model(xt).argmax(1) == yt).float().mean().item()


def plain(a, model, adam, x, y):
    gen = torch.Generator().manual_seed(a.seed)
    for _ in range(a.plain_steps):
        adam.zero_grad()
        for _ in range(16):
            idx = torch.randint(0, len(x), (64,), generator=gen)
            (torch.nn.functional.cross_entropy(model(x[idx]), y[idx]) / 16).backward()
        adam.step()
    say(epoch=a.plain_steps, hash=fm.parameter_hash(model), accuracy=accuracy_of(model),
        samples=a.plain_steps * 1024)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--initial-peers", nargs="*", default=[])
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1, help="data order")
    ap.add_argument("--deadline", type=float, default=240)
    ap.add_argument("--hidden", type=int, default=256, help="another width: another architecture")
    ap.add_argument("--load-only", action="store_true")
    ap.add_argument("--wait-go", action="store_true")
    ap.add_argument("--plain-steps", type=int, default=0)
    ap.add_argument("--aggregation", default="mean")
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--worker-momentum", type=float, default=0.0)
    a = ap.parse_args()
    deadline = time.monotonic() + a.deadline
    torch.set_num_threads(1)
    if a.hidden == 256:
        model = fm.make_model(0)
    else:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, a.hidden),
                                    torch.nn.ReLU(), torch.nn.Linear(a.hidden, 10))
    # Worker momentum replaces Adam's first moment (`starling train --worker-momentum` too).
    adam = torch.optim.Adam(model.parameters(), lr=1e-3,
                            betas=(0.0 if a.worker_momentum > 0 else 0.9, 0.999))
    x, y = (None, None) if a.load_only else fm.load("train")
    if a.plain_steps:
        return plain(a, model, adam, x, y)
    dht = starling.DHT(initial_peers=a.initial_peers, listen=["/ip4/127.0.0.1/tcp/0"])
    say(maddrs=dht.visible_maddrs, initial_hash=fm.parameter_hash(model))
    if a.wait_go:
        say(ready=True)
        if not select.select([sys.stdin], [], [], a.deadline)[0]:
            sys.exit("no go")
        sys.stdin.readline()
    opt = starling.Optimizer(dht=dht, run_id=a.run_id, optimizer=adam, model=model,
                             target_batch_size=1024, batch_size_per_step=64,
                             matchmaking_time=2.0, averaging_timeout=30.0,
                             load_state_timeout=30.0, aggregation=a.aggregation,
                             verify=a.verify, worker_momentum=a.worker_momentum)
    if a.load_only:
        try:
            opt.load_state_from_peers()
            say(loaded=opt.local_epoch, hash=fm.parameter_hash(model))
        except Exception as e:  # noqa: BLE001 (reported to the test)
            say(load_error=type(e).__name__, message=str(e))
        opt.shutdown()
        dht.shutdown()
        return
    gen = torch.Generator().manual_seed(a.seed)
    epoch = -1
    while opt.local_epoch < a.epochs and time.monotonic() < deadline:
        idx = torch.randint(0, len(x), (64,), generator=gen)
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
        opt.zero_grad()
        if opt.local_epoch != epoch:
            epoch = opt.local_epoch
            say(epoch_reached=epoch)
    st = opt.status()
    accuracy = accuracy_of(model)
    say(epoch=opt.local_epoch, hash=fm.parameter_hash(model), sharing=opt.state_sharing,
        accuracy=accuracy, samples=st["samples_total"],
        state_downloads=st["state_downloads"], rounds_ok=st["rounds_ok"],
        adam_steps=sorted({int(s["step"]) for s in adam.state.values()}),
        banned=sorted(b["peer"] for b in opt.banned_peers()))
    while time.monotonic() < deadline:
        opt.serve_state_requests()
        if select.select([sys.stdin], [], [], 0.02)[0]:
            break
    opt.shutdown()
    dht.shutdown()


if __name__ == "__main__":
    main()
