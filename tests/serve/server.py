"""Starts `kvslice serve` on a free port of 127.0.0.1 and stops it again."""

import os
import re
import subprocess
import sys
import threading
import time


class Server:
    def __init__(self, kvslice, *args):
        self.proc = subprocess.Popen(
            [kvslice, "serve", "--port", "0", *args],
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url = None
        deadline = time.time() + 300
        for line in self.proc.stderr:
            sys.stderr.write(line)
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.url = m.group(1)
                break
            if time.time() > deadline:
                break
        if self.url is None:
            self.proc.kill()
            raise RuntimeError("the server did not start")
        # keep draining stderr so the server never blocks on a full pipe
        threading.Thread(target=lambda: [sys.stderr.write(l) for l in self.proc.stderr], daemon=True).start()

    def rss_mib(self):
        """The server's resident memory (VmRSS), in MiB."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def metrics(url):
    """`/metrics` as {name: value}."""
    import urllib.request

    text = urllib.request.urlopen(url + "/metrics").read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.removeprefix("kvslice_")] = float(value)
    return out
