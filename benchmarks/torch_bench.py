#!/usr/bin/env python3
"""Samples/s of PyTorch training through psrt against DistributedDataParallel.

Two models, two workers each, the same batch size, optimizer (SGD with
momentum) and machine:

  digits   the demo's network (64-128-128-10, 26k parameters) on random
           inputs shaped like scikit-learn's digits
  large    a 25.2M-parameter MLP (1024-4096-4096-1024): communication bound

For each: psrt fp32 (psrt-run --local=2: 2 servers, 2 workers), psrt fp16
(gradients and weights as fp16 on the wire), and torch
DistributedDataParallel with the gloo backend (2 processes on loopback), in
fp32 and with its fp16_compress_hook (gradients as fp16 on the wire: the
fair pairing for psrt fp16). Rank 0 times the steps after a warm-up, and
each phase of a step: forward (with psrt, also the wait for the new weights
a module needs), backward (gradients handed to the network as they appear),
and the optimizer step. Writes OUT/torch.json and prints the ratios
against DDP-gloo measured in the same run.
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


def timed_steps(args, rank, forward, step):
    """Runs args.warmup + args.steps steps: forward() (returns the loss), its
    backward, step(). Rank 0 prints each phase's mean (ms) on a PHASES line;
    returns the seconds of the timed steps."""
    start = None
    phases = [0.0, 0.0, 0.0]  # forward, backward, step
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            start, phases = time.monotonic(), [0.0, 0.0, 0.0]
        t0 = time.monotonic()
        loss = forward()
        t1 = time.monotonic()
        loss.backward()
        t2 = time.monotonic()
        step()
        t3 = time.monotonic()
        phases = [phases[0] + t1 - t0, phases[1] + t2 - t1, phases[2] + t3 - t2]
    seconds = time.monotonic() - start
    if rank == 0:
        print("PHASES " + json.dumps({k: 1e3 * v / args.steps for k, v in
                                      zip(("forward_ms", "backward_ms", "step_ms"), phases)}), flush=True)
    return seconds


def train(torch, model, opt, step_fn, args, rank):
    widths = MODELS[args.model]
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, widths[0], generator=g)
    y = torch.randint(0, widths[-1], (args.batch,), generator=g)
    loss_fn = torch.nn.CrossEntropyLoss()

    def forward():
        opt.zero_grad()
        return loss_fn(model(x), y)

    return timed_steps(args, rank, forward, step_fn)


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


def ddp_worker(rank, args, master):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://" + master, rank=rank, world_size=args.world)
    model = torch.nn.parallel.DistributedDataParallel(build_model(torch, MODELS[args.model]))
    if args.fp16_hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    seconds = train(torch, model, opt, opt.step, args, rank)
    if rank == 0:
        print("RESULT %f" % (args.steps * args.batch * args.world / seconds), flush=True)
    # Both ranks are done; leaving without gloo's teardown, which aborts
    # now and then ("terminate called without an active exception").
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def run(cmd, env=None):
    """Samples/s and the per-step phases (ms) rank 0 printed."""
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    m = re.search(r"RESULT ([0-9.]+)", p.stdout)
    ph = re.search(r"PHASES (\{.*\})", p.stdout)
    if p.returncode != 0 or not m or not ph:
        sys.exit("torch_bench: %s failed:\n%s" % (" ".join(cmd[:3]), p.stdout[-4000:]))
    return float(m.group(1)), json.loads(ph.group(1))


def run_role(args, psrt_worker, ddp_worker):
    """Runs this process's worker role (--role psrt or ddp); False for the
    driver."""
    if args.role == "psrt":
        psrt_worker(args)
        return True
    if args.role == "ddp":
        import torch.multiprocessing as mp
        mp.spawn(ddp_worker, args=(args, "127.0.0.1:%d" % args.port), nprocs=2)
        return True
    if args.role == "ddp-rank":  # one rank per host (multihost_bench)
        ddp_worker(args.rank, args, args.master)
        return True
    return False


def driver_setup(args, script):
    """The build folder, the report folder (made), the workers' environment
    and the command that starts `script` again in a role."""
    build = os.path.abspath(args.build)
    out = args.out or os.path.join(build, "bench")
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"))
    return build, out, env, [sys.executable, os.path.abspath(script)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--out", default=None)
    p.add_argument("--role", default="driver", choices=["driver", "psrt", "ddp", "ddp-rank"])
    p.add_argument("--rank", type=int, default=0, help="ddp-rank: this process's rank of --world")
    p.add_argument("--world", type=int, default=2, help="ddp, ddp-rank: the processes of the job")
    p.add_argument("--master", default="127.0.0.1:29517", help="ddp-rank: rank 0's ADDRESS:PORT")
    p.add_argument("--model", default="digits", choices=sorted(MODELS))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=0, help="timed steps; 0: per model default")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--fp16-hook", action="store_true", help="ddp: with fp16_compress_hook")
    args = p.parse_args()
    if run_role(args, psrt_worker, ddp_worker):
        return
    build, out, env, me = driver_setup(args, __file__)
    results = {}
    for model, steps in (("digits", 300), ("large", 15)):
        steps = args.steps or steps
        common = ["--model", model, "--batch", str(args.batch), "--steps", str(steps), "--warmup", str(args.warmup)]
        r = {"steps": steps, "batch": args.batch, "phases_ms": {}}
        r["ddp_gloo"], r["phases_ms"]["ddp_gloo"] = run(me + ["--role", "ddp"] + common)
        r["ddp_gloo_fp16"], r["phases_ms"]["ddp_gloo_fp16"] = run(me + ["--role", "ddp", "--fp16-hook"] + common)
        for name, compression, baseline in (("psrt_fp32", "none", "ddp_gloo"),
                                            ("psrt_fp16", "fp16", "ddp_gloo_fp16")):
            dist = {"parameter_server": {"enabled": True, "compression": compression,
                                         "pull_compression": compression}}
            r[name], r["phases_ms"][name] = run(
                [os.path.join(build, "bin", "psrt-run"), "--local=2", "--distribution=" + json.dumps(dist),
                 "--"] + me + ["--role", "psrt"] + common, env)
            r[name + "_vs_" + baseline] = r[name] / r[baseline]
        results[model] = r
    print("%-8s %12s %12s %12s %12s %14s %14s" % ("model", "DDP s/s", "DDP-fp16 s/s", "psrt s/s", "psrt-fp16 s/s",
                                                  "psrt/DDP", "fp16/DDP-fp16"))
    for model, r in results.items():
        print("%-8s %12.0f %12.0f %12.0f %12.0f %13.2fx %13.2fx" % (
            model, r["ddp_gloo"], r["ddp_gloo_fp16"], r["psrt_fp32"], r["psrt_fp16"],
            r["psrt_fp32_vs_ddp_gloo"], r["psrt_fp16_vs_ddp_gloo_fp16"]))
    print("per step (ms): forward / backward / step")
    for model, r in results.items():
        for name, ph in r["phases_ms"].items():
            print("  %-8s %-14s %8.2f %8.2f %8.2f" % (model, name, ph["forward_ms"], ph["backward_ms"],
                                                     ph["step_ms"]))
    with open(os.path.join(out, "torch.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("torch_bench: wrote", os.path.join(out, "torch.json"))


if __name__ == "__main__":
    main()
