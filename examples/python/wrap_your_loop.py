#!/usr/bin/python3
"""The smallest collaborative loop: your model, your torch.optim optimizer, your data; swap
`optimizer.step()` for starling.Optimizer's. Run it twice: the second with the address the
first prints (PYTHONPATH=build/python unless `make python-install` was run)."""
import sys

import torch
import starling

torch.manual_seed(0)  # every peer starts from the same parameters
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

with starling.DHT(initial_peers=sys.argv[1:], listen=["/ip4/127.0.0.1/tcp/0"]) as dht:
    print("join with:", *dht.visible_maddrs, flush=True)
    with starling.Optimizer(dht=dht, run_id="wrap-your-loop", model=model,
                            optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                            target_batch_size=256, batch_size_per_step=32) as opt:
        while opt.local_epoch < 50:
            x = torch.randn(32, 16)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            loss.backward()
            opt.step()       # accumulates; every 256 samples of the collaboration, all peers
            opt.zero_grad()  # average their gradients and Adam steps on each of them
            if opt.local_epoch % 10 == 0 and opt.status()["local_samples"] == 0:
                print(f"epoch {opt.local_epoch} loss {loss.item():.4f}", flush=True)
