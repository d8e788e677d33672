#!/usr/bin/env python3
"""Samples/s of PyTorch training through psrt against DistributedDataParallel.

Two models, two workers each, the same batch size, optimizer (SGD with
momentum) and machine:

  digits   the demo's network (64-128-128-10, 26k parameters) on random
           inputs shaped like scikit-learn's digits
  large    a 25.2M-parameter MLP (1024-4096-4096-1024): communication bound

For each: psrt fp32 (psrt-run --local=2: 2 servers, 2 workers), psrt fp16
(gradients and weights as fp16 on the wire), and torch
DistributedDataParallel with the gloo backend (2 processes on loopback).
Rank 0 times the steps after a warm-up. Writes OUT/torch.json and prints the
ratios against DDP-gloo measured in the same run.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

MODELS = {"digits": [64, 128, 128, 10], "large": [1024, 4096, 4096, 1024]}


def build_model(torch, widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def train(torch, model, opt, step_fn, args, rank):
    widths = MODELS[args.model]
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, widths[0], generator=g)
    y = torch.randint(0, widths[-1], (args.batch,), generator=g)
    loss_fn = torch.nn.CrossEntropyLoss()
    start = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            start = time.monotonic()
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        step_fn()
    return time.monotonic() - start


def psrt_worker(args):
    import torch
    import psrt.torch as psrt
    torch.set_num_threads(1)
    psrt.init()
    model = build_model(torch, MODELS[args.model])
    opt = psrt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                    named_parameters=model.named_parameters())
    seconds = train(torch, model, opt, opt.step, args, psrt.rank())
    if psrt.rank() == 0:
        print("RESULT %f" % (args.steps * args.batch * psrt.size() / seconds), flush=True)


def ddp_worker(rank, args, port):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(build_model(torch, MODELS[args.model]))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    seconds = train(torch, model, opt, opt.step, args, rank)
    if rank == 0:
        print("RESULT %f" % (args.steps * args.batch * 2 / seconds), flush=True)
    dist.destroy_process_group()


def run(cmd, env=None):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    m = re.search(r"RESULT ([0-9.]+)", p.stdout)
    if p.returncode != 0 or not m:
        sys.exit("torch_bench: %s failed:\n%s" % (" ".join(cmd[:3]), p.stdout[-4000:]))
    return float(m.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--out", default=None)
    p.add_argument("--role", default="driver", choices=["driver", "psrt", "ddp"])
    p.add_argument("--model", default="digits", choices=sorted(MODELS))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=0, help="timed steps; 0: per model default")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--port", type=int, default=29517)
    args = p.parse_args()
    if args.role == "psrt":
        return psrt_worker(args)
    if args.role == "ddp":
        import torch.multiprocessing as mp
        mp.spawn(ddp_worker, args=(args, args.port), nprocs=2)
        return

    build = os.path.abspath(args.build)
    out = args.out or os.path.join(build, "bench")
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"))
    me = [sys.executable, os.path.abspath(__file__)]
    results = {}
    for model, steps in (("digits", 300), ("large", 15)):
        steps = args.steps or steps
        common = ["--model", model, "--batch", str(args.batch), "--steps", str(steps), "--warmup", str(args.warmup)]
        r = {"steps": steps, "batch": args.batch}
        r["ddp_gloo"] = run(me + ["--role", "ddp"] + common)
        for name, compression in (("psrt_fp32", "none"), ("psrt_fp16", "fp16")):
            dist = {"parameter_server": {"enabled": True, "compression": compression,
                                         "pull_compression": compression}}
            r[name] = run([os.path.join(build, "bin", "psrt-run"), "--local=2",
                           "--distribution=" + json.dumps(dist), "--"] + me + ["--role", "psrt"] + common, env)
            r[name + "_vs_ddp"] = r[name] / r["ddp_gloo"]
        results[model] = r
    print("%-8s %14s %14s %14s %10s %10s" % ("model", "DDP-gloo s/s", "psrt fp32 s/s", "psrt fp16 s/s",
                                             "fp32/DDP", "fp16/DDP"))
    for model, r in results.items():
        print("%-8s %14.0f %14.0f %14.0f %9.2fx %9.2fx" % (model, r["ddp_gloo"], r["psrt_fp32"], r["psrt_fp16"],
                                                        r["psrt_fp32_vs_ddp"], r["psrt_fp16_vs_ddp"]))
    with open(os.path.join(out, "torch.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("torch_bench: wrote", os.path.join(out, "torch.json"))


if __name__ == "__main__":
    main()
