#!/usr/bin/env python3
"""A small deterministic training job, for scripts/device/pytorch-jobs.sh.

    train_job.py --state DIR --tag TAG --steps S [--pause-at N] [--fork early|late]
                 [--linger SECS] [--device cuda|cpu]

A decoder-only transformer built from torch.nn (nn.Embedding, a position parameter,
nn.TransformerEncoder with a causal mask, nn.Linear head; random weights from a fixed
seed) is trained for S
steps with AdamW under bf16 autocast, on token sequences that a DataLoader with two
worker processes (fork), a seeded generator, seeded workers and pinned memory makes.
Everything is deterministic: torch.use_deterministic_algorithms(True),
CUBLAS_WORKSPACE_CONFIG=:4096:8, the math attention kernel, dropout from the seeded
generator. Two processes given the same arguments log the same losses bit for bit.

--fork early starts the DataLoader's workers before CUDA starts in the process (they
hold nothing of the driver); --fork late moves the model to the GPU first, as most
training scripts do, so that the workers inherit the driver's open files.

Files in DIR:
  losses-TAG.txt    one line per step: "STEP LOSS", LOSS the step's loss as float.hex()
  paused            with --pause-at N: written before step N runs (steps 0..N-1 done,
                    the GPU idle); the job then waits (up to --pause-timeout seconds)
                    for the file "go", whose content is the tag its remaining steps
                    log under (losses-<content>.txt)
  done-TAG          at the end: {"pid", "steps", "params", "first_step_ms",
                    "step_ms_median"} (params: a digest of every parameter's bits;
                    first_step_ms: the first step after the pause)
  error-TAG         why the job stopped (TAG: the tag it was started with)

With --linger SECS the job then sleeps up to SECS seconds, to be killed (its workers
are still alive); without, it exits. No regular file stays open between two steps: a
file that grew after a dump could not be restored (CRIU checks the sizes).
"""

import argparse
import hashlib
import json
import os
import random
import statistics
import sys
import time
import traceback

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

# Sizes per device: a transformer of about 17 M parameters on the GPU, a tiny one on
# the CPU (to check this script where there is no GPU). 32 x 128 tokens a batch: above
# 3072 indices the embedding's backward takes its sorted (deterministic) path.
SIZES = {
    "cuda": dict(vocab=4096, dim=512, heads=8, layers=4, seq=128, batch=32),
    "cpu": dict(vocab=256, dim=64, heads=4, layers=2, seq=32, batch=8),
}


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, path)


def append_line(path, line):
    # Opened and closed each time: see the module's doc.
    with open(path, "a") as f:
        f.write(line + "\n")


def wait_for(path, timeout):
    """The content of PATH once it exists (polled every 10 ms), else TimeoutError."""
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise TimeoutError(f"no {path} after {timeout} s")
        time.sleep(0.01)
    with open(path) as f:
        return f.read().strip()


class Tokens(Dataset):
    """Sequences of SEQ+1 tokens: sample I is drawn from a generator seeded with I, every
    odd position is its predecessor + 1 (something to learn), and about 5% of the
    tokens are dropped to 0 with the worker's own generator (seeded by the DataLoader
    from its generator: which worker makes which sample is fixed)."""

    def __init__(self, n, seq, vocab, seed):
        self.n, self.seq, self.vocab, self.seed = n, seq, vocab, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        x = torch.randint(1, self.vocab, (self.seq + 1,), generator=g)
        x[1::2] = (x[0:-1:2] + 1) % self.vocab
        x = x.masked_fill(torch.rand(self.seq + 1) < 0.05, 0)
        return x[:-1], x[1:]


def seed_worker(worker_id):
    # torch seeds each worker from the loader's generator; Python's own generator too.
    random.seed(torch.initial_seed() % 2**32)


class LM(nn.Module):
    def __init__(self, vocab, dim, heads, layers, seq, dropout=0.1):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        # A parameter added as it is (no index): its gradient needs no scatter.
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(seq),
                             persistent=False)

    def forward(self, x):
        h = self.tok(x) + self.pos[: x.shape[1]]
        h = self.blocks(h, mask=self.causal, is_causal=True)
        return self.head(self.norm(h))


def params_digest(model):
    """SHA-256 over every parameter's two 64-bit integer sums (plain, and weighted by
    position mod 1000003 + 1) of its float32 bit patterns, computed on its device."""
    h = hashlib.sha256()
    with torch.no_grad():
        for name, p in model.named_parameters():
            bits = p.detach().float().contiguous().view(-1).view(torch.int32).to(torch.int64)
            idx = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64)
            plain = int(bits.sum().item())
            weighted = int((bits * (idx % 1000003 + 1)).sum().item())
            h.update(f"{name} {plain} {weighted};".encode())
    return h.hexdigest()


def deterministic(dev):
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # The math attention kernel: the fused ones' backward passes may be nondeterministic.
    for name in ("enable_flash_sdp", "enable_mem_efficient_sdp", "enable_cudnn_sdp"):
        switch = getattr(torch.backends.cuda, name, None)
        if switch is not None:
            switch(False)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--state", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--pause-at", type=int, default=-1)
    p.add_argument("--pause-timeout", type=float, default=600)
    p.add_argument("--fork", choices=["early", "late"], default="early")
    p.add_argument("--linger", type=float, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args()

    dev = torch.device(a.device)
    cfg = SIZES["cuda" if dev.type == "cuda" else "cpu"]
    deterministic(dev)
    torch.manual_seed(a.seed)  # the CPU generator and every GPU's
    model = LM(cfg["vocab"], cfg["dim"], cfg["heads"], cfg["layers"], cfg["seq"])

    data = Tokens(a.steps * cfg["batch"], cfg["seq"], cfg["vocab"], a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    extra = {}
    if a.workers > 0:
        extra = dict(multiprocessing_context="fork", prefetch_factor=2)
    loader = DataLoader(data, batch_size=cfg["batch"], shuffle=True, drop_last=True,
                        num_workers=a.workers, pin_memory=dev.type == "cuda",
                        worker_init_fn=seed_worker, generator=gen, **extra)

    if a.fork == "early":
        batches = iter(loader)  # the workers fork here, before CUDA starts
        model.to(dev)
    else:
        model.to(dev)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        batches = iter(loader)  # the workers inherit the driver's files
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    tag = a.tag
    losses = os.path.join(a.state, f"losses-{tag}.txt")
    times = []
    for step in range(a.steps):
        if step == a.pause_at:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            write_atomic(os.path.join(a.state, "paused"),
                         json.dumps({"pid": os.getpid(), "step": step}))
            tag = wait_for(os.path.join(a.state, "go"), a.pause_timeout)
            losses = os.path.join(a.state, f"losses-{tag}.txt")
            times = []
        t = time.perf_counter()
        x, y = next(batches)
        x = x.to(dev, non_blocking=True)
        y = y.to(dev, non_blocking=True)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, cfg["vocab"]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = loss.item()  # waits for the step
        times.append((time.perf_counter() - t) * 1000)
        append_line(losses, f"{step} {value.hex()}")

    done = {"pid": os.getpid(), "steps": a.steps, "params": params_digest(model),
            "first_step_ms": round(times[0], 2) if times else None,
            "step_ms_median": round(statistics.median(times[1:]), 2) if len(times) > 1 else None}
    write_atomic(os.path.join(a.state, f"done-{tag}"), json.dumps(done))
    end = time.monotonic() + a.linger
    while time.monotonic() < end:
        time.sleep(0.2)
    del batches  # the workers stop


if __name__ == "__main__":
    try:
        main()
    except Exception:  # recorded for the script's log, then re-raised
        args = sys.argv
        state = args[args.index("--state") + 1] if "--state" in args else "."
        tag = args[args.index("--tag") + 1] if "--tag" in args else "job"
        with open(os.path.join(state, f"error-{tag}"), "w") as f:
            f.write(traceback.format_exc())
        raise
