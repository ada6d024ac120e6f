#!/usr/bin/env python3
"""An inference server holding a large model on the GPU, for scripts/device/pytorch-jobs.sh.

    infer_server.py --state DIR --port PORT [--gib 8] [--init device|file --weights PATH]
                    [--device cuda|cpu]
    infer_server.py --save-weights PATH [--gib 8] [--device cuda|cpu]

The model is a stack of bias-free nn.Linear layers of DIM x DIM in bfloat16 (DIM 8192:
128 MiB a layer, 64 layers for 8 GiB), each followed by GELU and an RMS normalisation;
its weights are drawn uniformly from a generator on the device, seeded per layer, so
every process (and every file --save-weights writes) has the same weights.

--init device draws the weights on the GPU at start (no weight I/O: the fastest
possible cold start); --init file reads them from the file --save-weights wrote
(torch.load with mmap, then copied to the GPU, as a server loads a checkpoint).
Then 3 warm-up passes, and an HTTP server (http.server, HTTP/1.0: no connection
outlives its request) on 127.0.0.1:PORT:

  POST /infer  {"seed": S, "batch": B}  ->  {"digest", "pid", "ms", "served"}
               the input is B x DIM normal values from a generator on the device seeded
               with S; digest: SHA-256 of the output's bytes
  GET /health  ->  {"pid", "served"}

Once listening it writes DIR/ready: {"pid", "port", "layers", "dim", "gib", "init",
"phases"} with the seconds each phase took since the interpreter started (import,
cuda, weights, warmup). Failures go to DIR/error. Nothing is written to stdout/stderr
and no regular file stays open (a dump of the server restores only if its files are
as they were).
"""

import time

T0 = time.time()

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
import socketserver  # noqa: E402
from http.server import BaseHTTPRequestHandler, HTTPServer  # noqa: E402

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


class LoopbackServer(HTTPServer):
    def server_bind(self):
        # HTTPServer's own asks the resolver for the host's name (getfqdn): not needed.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, path)


class Model:
    def __init__(self, torch, dev, gib, dim, seed):
        self.torch, self.dev, self.dim = torch, dev, dim
        self.n = max(1, round(gib * 2**30 / (dim * dim * 2)))
        self.seed = seed
        nn = torch.nn
        # No initialisation on construction: the weights are drawn (or loaded) below.
        self.layers = nn.Sequential(*[
            nn.Linear(dim, dim, bias=False, device="meta", dtype=torch.bfloat16)
            for _ in range(self.n)]).to_empty(device=dev)
        self.layers.requires_grad_(False)

    def draw(self):
        torch = self.torch
        bound = 1.0 / self.dim ** 0.5
        g = torch.Generator(device=self.dev)
        for i, lin in enumerate(self.layers):
            g.manual_seed(self.seed * 1_000_003 + i)
            lin.weight.uniform_(-bound, bound, generator=g)

    def load(self, path):
        state = self.torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        self.layers.load_state_dict(state)
        del state  # the mapping of the file goes with it

    def forward(self, seed, batch):
        torch = self.torch
        g = torch.Generator(device=self.dev).manual_seed(seed)
        x = torch.randn(batch, self.dim, generator=g, device=self.dev, dtype=torch.bfloat16)
        for lin in self.layers:
            x = torch.nn.functional.gelu(lin(x))
            x = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)
        return x

    def digest(self, seed, batch):
        with self.torch.inference_mode():
            out = self.forward(seed, batch)
            raw = out.contiguous().view(-1).view(self.torch.uint8).cpu()
        return hashlib.sha256(bytes(raw.tolist())).hexdigest()


def sync(torch, dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--state")
    p.add_argument("--port", type=int)
    p.add_argument("--gib", type=float, default=8.0)
    p.add_argument("--dim", type=int)
    p.add_argument("--device", default="cuda")
    p.add_argument("--init", choices=["device", "file"], default="device")
    p.add_argument("--weights")
    p.add_argument("--save-weights")
    p.add_argument("--seed", type=int, default=4321)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    if not a.save_weights and (a.state is None or a.port is None):
        p.error("--state and --port are needed to serve")
    if a.init == "file" and not a.weights:
        p.error("--init file needs --weights")

    import torch

    t_import = time.time()
    dev = torch.device(a.device)
    dim = a.dim or (8192 if dev.type == "cuda" else 1024)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    if dev.type == "cuda":
        torch.zeros(1, device=dev)
        sync(torch, dev)
    t_cuda = time.time()

    model = Model(torch, dev, a.gib, dim, a.seed)
    if a.save_weights:
        model.draw()
        torch.save(model.layers.state_dict(), a.save_weights)
        return
    if a.init == "device":
        model.draw()
    else:
        model.load(a.weights)
    sync(torch, dev)
    t_weights = time.time()
    for k in range(a.warmup):
        model.digest(1_000_000 + k, 8)
    sync(torch, dev)
    t_warm = time.time()

    served = [0]

    class Handler(BaseHTTPRequestHandler):
        def answer(self, code, value):
            body = json.dumps(value).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            if self.path != "/infer":
                return self.answer(404, {"error": "POST /infer"})
            try:
                n = int(self.headers.get("Content-Length") or 0)
                req = json.loads(self.rfile.read(n) or b"{}")
                seed, batch = int(req.get("seed", 0)), int(req.get("batch", 8))
                if not 1 <= batch <= 1024:
                    return self.answer(400, {"error": "batch must be 1..1024"})
                t = time.perf_counter()
                digest = model.digest(seed, batch)
                ms = (time.perf_counter() - t) * 1000
            except Exception as e:  # the client is told; the server goes on
                return self.answer(500, {"error": repr(e)})
            served[0] += 1
            self.answer(200, {"digest": digest, "pid": os.getpid(), "ms": round(ms, 3),
                              "served": served[0]})

        def do_GET(self):
            if self.path != "/health":
                return self.answer(404, {"error": "GET /health"})
            self.answer(200, {"pid": os.getpid(), "served": served[0]})

        def log_message(self, *args):
            pass

    server = LoopbackServer(("127.0.0.1", a.port), Handler)
    write_atomic(os.path.join(a.state, "ready"), json.dumps({
        "pid": os.getpid(), "port": a.port, "layers": model.n, "dim": dim,
        "gib": round(model.n * dim * dim * 2 / 2**30, 3), "init": a.init,
        "phases": {"import": round(t_import - T0, 3), "cuda": round(t_cuda - t_import, 3),
                   "weights": round(t_weights - t_cuda, 3),
                   "warmup": round(t_warm - t_weights, 3)}}))
    server.serve_forever()


if __name__ == "__main__":
    try:
        main()
    except Exception:  # recorded for the script's log, then re-raised
        args = sys.argv
        state = args[args.index("--state") + 1] if "--state" in args else "."
        with open(os.path.join(state, "error"), "w") as f:
            f.write(traceback.format_exc())
        raise
