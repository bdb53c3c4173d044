"""Per-step cost of starling.Optimizer.step() in a training loop (part of make bench-python).

One peer alone, the Fashion-MNIST MLP, batches of 64, a target batch no round reaches in the
window: every opt.step() call is the binding (argument parsing, GIL release and re-take, the
optimizer-state bridge's check) plus the C++ Optimizer's accumulation of the batch's
gradients, which `starling train` pays as well. Prints the time per step() call against the
time per training batch in the same loop (the anchor): the share is an upper bound of the
Python wrapper's per-step overhead. The accumulation alone is estimated in the same loop by
the same tensor operations run from Python on copies of the gradients (acc += 64 x grad,
grad = 0, per parameter); step() minus that estimate is the wrapper's own cost.
Usage: python_step.py MODULE_DIR [BATCHES]"""
import os
import sys
import time

sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                                "python"))
import torch  # noqa: E402
import starling  # noqa: E402
import fashion_mnist as fm  # noqa: E402


def main():
    batches = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    torch.set_num_threads(1)
    x, y = fm.load("train")
    model = fm.make_model(0)
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    with starling.DHT(listen=["/ip4/127.0.0.1/tcp/0"]) as dht, \
            starling.Optimizer(dht=dht, run_id="step-bench", optimizer=adam, model=model,
                               target_batch_size=10**12, batch_size_per_step=64) as opt:
        in_step = 0.0
        in_acc = 0.0
        acc = [torch.zeros_like(p) for p in model.parameters()]
        t0 = time.perf_counter()
        for _ in range(batches):
            idx = torch.randint(0, len(x), (64,), generator=g)
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            grads = [p.grad.clone() for p in model.parameters()]
            s = time.perf_counter()
            with torch.no_grad():
                for a, gr in zip(acc, grads):
                    a.add_(gr, alpha=64.0)
                    gr.zero_()
            in_acc += time.perf_counter() - s
            s = time.perf_counter()
            opt.step()
            in_step += time.perf_counter() - s
            opt.zero_grad()
        total = time.perf_counter() - t0 - in_acc  # the estimate is not part of a batch
    per_batch = total / batches * 1e6
    per_step = in_step / batches * 1e6
    per_acc = in_acc / batches * 1e6
    print(f"{batches} batches: {per_batch:.1f} us per training batch (anchor, copies of the "
          f"gradients included), {per_step:.1f} us of it in opt.step(): share "
          f"{per_step / per_batch:.3f}; the accumulation alone ~{per_acc:.1f} us, so the "
          f"wrapper ~{per_step - per_acc:.1f} us: share {(per_step - per_acc) / per_batch:.3f}")


if __name__ == "__main__":
    main()
