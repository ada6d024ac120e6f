#!/usr/bin/env python3
"""A PyTorch process holding GPU tensors, for the GPU validation (cuda-validate.sh).

    torch_tensors.py --state DIR [--gib N] [--procs P] [--device cuda]

Allocates N GiB of int32 tensors (1 GiB each, the last one smaller) on the GPU, filled
from a seeded generator, and a small "work" tensor that a loop updates every 100 ms, so
the process keeps launching GPU kernels. With --procs P it first starts P-1 children
(the same script, role child1, child2, ...), each holding N GiB too: a process tree.

Files in DIR, per role ("parent", "child1", ...):
  ready-ROLE          written once the tensors are allocated: {"pid", "gib", "checksums"}
  checksums-ROLE-K    written on the K-th SIGUSR1: the tensors' checksums then, and the
                      work counter (which must have moved on after a restore)
  error-ROLE          why the process stopped

A tensor's checksum is two 64-bit sums over its int32 elements, computed on the GPU in
chunks: the plain sum and the sum weighted by (position mod 1000003) + 1, so a changed,
lost or moved element changes it.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

CHUNK = 1 << 24  # elements per checksum step (64 MiB of int32)
GIB_ELEMENTS = (1 << 30) // 4


def checksum(torch, t):
    plain = 0
    weighted = 0
    n = t.numel()
    for start in range(0, n, CHUNK):
        chunk = t[start:start + CHUNK].to(torch.int64)
        idx = torch.arange(start, start + chunk.numel(), device=t.device, dtype=torch.int64)
        plain += int(chunk.sum().item())
        weighted += int((chunk * (idx % 1000003 + 1)).sum().item())
    return [plain & (2**64 - 1), weighted & (2**64 - 1)]


def write_json(path, value):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.rename(tmp, path)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--state", required=True)
    p.add_argument("--gib", type=float, default=8.0)
    p.add_argument("--procs", type=int, default=1)
    p.add_argument("--role", default="parent")
    p.add_argument("--device", default="cuda")
    a = p.parse_args()

    children = []
    if a.role == "parent":
        for k in range(1, a.procs):
            children.append(subprocess.Popen(
                [sys.executable, __file__, "--state", a.state, "--gib", str(a.gib),
                 "--role", f"child{k}", "--device", a.device],
                stdin=subprocess.DEVNULL))

    requests = []
    signal.signal(signal.SIGUSR1, lambda *_: requests.append(1))

    import torch  # after the children are started: nothing of CUDA is forked

    dev = torch.device(a.device)
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234 + sum(map(ord, a.role)))
    elements = int(a.gib * GIB_ELEMENTS)
    tensors = []
    while elements > 0:
        n = min(elements, GIB_ELEMENTS)
        t = torch.empty(n, dtype=torch.int32, device=dev)
        t.random_(-2**31, 2**31 - 1, generator=gen)
        tensors.append(t)
        elements -= n
    work = torch.zeros(1 << 20, dtype=torch.int64, device=dev)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    sums = [checksum(torch, t) for t in tensors]
    write_json(os.path.join(a.state, f"ready-{a.role}"),
               {"pid": os.getpid(), "gib": a.gib, "checksums": sums})

    answered = 0
    steps = 0
    while True:
        work.add_(1)
        steps += 1
        if dev.type == "cuda":
            torch.cuda.synchronize()
        while answered < len(requests):
            answered += 1
            write_json(os.path.join(a.state, f"checksums-{a.role}-{answered}"),
                       {"pid": os.getpid(), "checksums": [checksum(torch, t) for t in tensors],
                        "steps": steps, "work": int(work[0].item())})
        time.sleep(0.1)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # recorded for the validation log, then re-raised
        state = sys.argv[sys.argv.index("--state") + 1] if "--state" in sys.argv else "."
        role = sys.argv[sys.argv.index("--role") + 1] if "--role" in sys.argv else "parent"
        with open(os.path.join(state, f"error-{role}"), "w") as f:
            f.write(repr(e))
        raise
