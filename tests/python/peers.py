"""Child processes for the Python tests that run several peers (test_mixed.py,
test_parity.py): each one's output lines are collected by a thread; every wait is bounded."""
import json
import queue
import subprocess
import threading
import time


class Proc:
    """A child process whose output lines a thread collects; waits are bounded."""

    def __init__(self, args, env, stdin=False, stream="stdout"):
        self.p = subprocess.Popen(args, env=env, text=True,
                                  stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                  stdout=subprocess.PIPE if stream == "stdout" else subprocess.DEVNULL,
                                  stderr=subprocess.PIPE if stream == "stderr" else None)
        self.lines = queue.Queue()
        self.log = []
        src = self.p.stdout if stream == "stdout" else self.p.stderr
        if src is not None:
            threading.Thread(target=self._read, args=(src,), daemon=True).start()

    def _read(self, src):
        for line in src:
            self.log.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_line(self, pred, timeout):
        """The first next line (parsed by pred) for which pred returns a value."""
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError("no such line within %.0f s; last: %s" % (timeout, self.log[-5:]))
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError("exited (%s) without it; last: %s" % (self.p.wait(), self.log[-10:]))
            got = pred(line)
            if got is not None:
                return got

    def json(self, key, timeout):
        def pred(line):
            line = line.strip()
            if line.startswith("{"):
                obj = json.loads(line)
                if key in obj:
                    return obj
            return None
        return self.wait_line(pred, timeout)

    def release(self):
        if self.p.stdin:
            try:
                self.p.stdin.write("done\n")
                self.p.stdin.close()
            except (BrokenPipeError, ValueError, OSError):
                pass

    def stop(self, timeout=30):
        self.release()
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
