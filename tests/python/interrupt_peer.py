"""Ctrl-C during a blocking wait (test_api.py's interrupt test): the main thread trains with a
partner (a thread with its own DHT node) that stops stepping after a few batches, so the main
thread's step() waits for a round the partner never joins. A watchdog thread prints
"blocked" once step() has been waiting for 1 s; the test then sends SIGINT. The loop must get
KeyboardInterrupt promptly (not at the end of the round), leave the collaboration and exit 0.
Argument: the module directory."""
import json
import signal
import sys
import threading
import time

sys.path.insert(0, sys.argv[1])
import torch  # noqa: E402
import starling  # noqa: E402

LISTEN = ["/ip4/127.0.0.1/tcp/0"]


def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def batch(g):
    x = torch.randn(16, 8, generator=g)
    return x, (x.sum(1) > 0).long()


def main():
    # As in a terminal (a shell starts background jobs with SIGINT ignored, and Python then
    # keeps it ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stop = threading.Event()
    with starling.DHT(listen=LISTEN) as a, \
            starling.DHT(initial_peers=a.get_visible_maddrs(), listen=LISTEN) as b:
        started = threading.Event()

        def partner():
            model = make()
            g = torch.Generator().manual_seed(2)
            with starling.Optimizer(dht=b, run_id="intr", target_batch_size=64,
                                    optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                    batch_size_per_step=16, matchmaking_time=30.0,
                                    averaging_timeout=60.0) as opt:
                for _ in range(3):
                    x, y = batch(g)
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
                    opt.zero_grad()
                started.set()
                stop.wait(120)

        t = threading.Thread(target=partner)
        t.start()
        started.wait(60)
        model = make()
        g = torch.Generator().manual_seed(1)
        in_step = [None]

        def watchdog():
            while not stop.is_set():
                since = in_step[0]
                if since is not None and time.monotonic() - since > 1.0:
                    print(json.dumps({"blocked": True}), flush=True)
                    return
                time.sleep(0.02)

        threading.Thread(target=watchdog, daemon=True).start()
        with starling.Optimizer(dht=a, run_id="intr", target_batch_size=64,
                                optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                batch_size_per_step=16, matchmaking_time=30.0,
                                averaging_timeout=60.0) as opt:
            deadline = time.monotonic() + 120
            try:
                while time.monotonic() < deadline:
                    x, y = batch(g)
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    in_step[0] = time.monotonic()
                    opt.step()
                    in_step[0] = None
                    opt.zero_grad()
                print(json.dumps({"never_blocked": True}), flush=True)
            except KeyboardInterrupt:
                print(json.dumps({"interrupted_after": time.monotonic() - in_step[0]}),
                      flush=True)
            t0 = time.monotonic()
        print(json.dumps({"left_in": time.monotonic() - t0}), flush=True)
        stop.set()
        t.join(60)


if __name__ == "__main__":
    main()
