#!/usr/bin/python3
"""The smallest Starling collaboration: wrap your optimizer, keep your loop.

    /usr/bin/python3 examples/python/wrap_your_loop.py              # first peer: prints its address
    /usr/bin/python3 examples/python/wrap_your_loop.py ADDRESS      # more peers join it
"""
import sys

import torch

import starling

torch.manual_seed(0)  # the same initial parameters on every peer
model = torch.nn.Linear(16, 1)
w_true = torch.randn(16, 1)

with starling.DHT(initial_peers=sys.argv[1:], listen=["/ip4/127.0.0.1/tcp/0"]) as dht:
    print("join with:", dht.get_visible_maddrs()[0], flush=True)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)  # any torch.optim optimizer
    with starling.Optimizer(dht=dht, run_id="wrap-your-loop", optimizer=sgd,
                            target_batch_size=256, batch_size_per_step=32) as opt:
        while opt.local_epoch < 50:
            x = torch.randn(32, 16)
            loss = torch.nn.functional.mse_loss(model(x), x @ w_true)
            loss.backward()
            opt.step()  # instead of sgd.step(): averages with the peers every 256 samples
            opt.zero_grad()
        print(f"epoch {opt.local_epoch}, loss {loss.item():.4f}")
