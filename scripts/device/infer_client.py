#!/usr/bin/env python3
"""The client of infer_server.py, for scripts/device/pytorch-jobs.sh (standard library only).

    infer_client.py --port PORT [--seed S] [--batch B] [--count K] [--timeout SECS]
                    [--pid PID]

Sends POST /infer until the server answers (a refused or reset connection is tried
again every 10 ms, for up to --timeout seconds; with --pid, the wait ends early when
that process is gone), then K-1 more of the same request. Prints one JSON line:
{"digest", "pid", "served", "first_wait_ms", "latencies_ms", "same"}: the first
answer's digest, pid and count, how long the first answer took from this client's
start, each answer's round trip, and whether every answer had the same digest.
Exit status 1 when no answer came.
"""

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

# Loopback only: no proxy from the environment.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def ask(port, seed, batch, timeout):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/infer", method="POST",
        data=json.dumps({"seed": seed, "batch": batch}).encode(),
        headers={"Content-Type": "application/json"})
    with OPENER.open(req, timeout=timeout) as r:
        return json.loads(r.read())


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--pid", type=int)
    a = p.parse_args()

    start = time.monotonic()
    deadline = start + a.timeout
    first = None
    last_error = "no try"
    while first is None:
        t = time.monotonic()
        try:
            first = ask(a.port, a.seed, a.batch, max(1.0, deadline - t))
        except urllib.error.HTTPError as e:  # the server answered, with an error
            print(json.dumps({"error": f"HTTP {e.code}: {e.read()[:400]!r}"}))
            return 1
        except (urllib.error.URLError, ConnectionError, OSError) as e:
            last_error = repr(e)
            if time.monotonic() > deadline or (a.pid and not alive(a.pid)):
                print(json.dumps({"error": last_error,
                                  "waited_ms": round((time.monotonic() - start) * 1000)}))
                return 1
            time.sleep(0.01)
    latencies = [(time.monotonic() - t) * 1000]
    first_wait = (time.monotonic() - start) * 1000
    digests = {first["digest"]}
    for _ in range(a.count - 1):
        t = time.monotonic()
        digests.add(ask(a.port, a.seed, a.batch, a.timeout)["digest"])
        latencies.append((time.monotonic() - t) * 1000)
    print(json.dumps({"digest": first["digest"], "pid": first["pid"], "served": first["served"],
                      "first_wait_ms": round(first_wait, 1),
                      "latencies_ms": [round(v, 2) for v in latencies],
                      "same": len(digests) == 1}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
