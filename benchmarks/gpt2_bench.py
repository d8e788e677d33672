#!/usr/bin/env python3
"""Tokens/s of a GPT-2-small-shaped Transformer through psrt against DDP-gloo.

The model is Hugging Face's GPT2LMHeadModel with GPT-2 small's shape (12
layers, width 768, 12 heads, a 50257-token vocabulary, the head tied to the
token embedding: 124M parameters, 0.5 GB of float32 gradients a step), with
Adam, 2 workers on this machine and the same batch for every contender:

  ddp_gloo       torch DistributedDataParallel, gloo, float32 gradients
  ddp_gloo_fp16  the same with fp16_compress_hook
  psrt_fp32      psrt-run --local=2 (2 servers, 2 workers), float32 on the wire
  psrt_fp16      the same with fp16 gradients and weights on the wire

each without and with clip_grad_norm_(1.0) (psrt then averages the
gradients into .grad before step(): one more round trip). Rank 0 times each
phase of a step after a warm-up: forward (with psrt, also the wait for the
new weights a module needs), backward (gradients go out as they appear) and
step (clip included). The driver samples the resident memory of every
psrt-server process during the run. Writes OUT/gpt2.json and prints the
ratios against the DDP run of the same kind measured in the same run.
"""

import argparse
import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_bench import driver_setup, run, run_role, timed_steps  # noqa: E402  (same directory)

SEQ = 32
VOCAB = 50257  # GPT-2's


def build_model(torch):
    import transformers
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_positions=SEQ, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def train(torch, model, opt, args, rank, step):
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, VOCAB, (args.batch, SEQ), generator=g)

    def forward():
        opt.zero_grad()
        return model(input_ids=ids, labels=ids).loss

    def clip_and_step():
        if args.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        step()

    seconds = timed_steps(args, rank, forward, clip_and_step)
    if rank == 0:
        print("RESULT %f" % (args.steps * args.batch * SEQ * 2 / seconds), flush=True)


def psrt_worker(args):
    import torch
    import psrt.torch as psrt
    torch.set_num_threads(1)
    psrt.init()
    model = build_model(torch)
    opt = psrt.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4),
                                    named_parameters=model.named_parameters(),
                                    mean_grads=False if args.mean_grads_off else None,
                                    optimizer_on=args.optimizer_on)
    train(torch, model, opt, args, psrt.rank(), opt.step)


def ddp_worker(rank, args, master):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://" + master, rank=rank, world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(build_model(torch))
    if args.fp16_hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    train(torch, model, opt, args, rank, opt.step)
    # Both ranks are done; leaving without gloo's teardown, which aborts
    # now and then ("terminate called without an active exception").
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


class ServerMemory:
    """Samples the summed resident memory of the psrt-server processes."""

    def __init__(self):
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self):
        while not self._stop.wait(0.2):
            total = 0
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open("/proc/%s/status" % pid) as f:
                        status = f.read()
                except OSError:
                    continue
                if "\nName:\tpsrt-server\n" in "\n" + status and "VmRSS:" in status:  # not a zombie
                    total += int(status.split("VmRSS:")[1].split()[0])
            self.peak_mb = max(self.peak_mb, total / 1024.0)

    def stop(self):
        self._stop.set()
        self._thread.join()
        return self.peak_mb


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--out", default=None)
    p.add_argument("--role", default="driver", choices=["driver", "psrt", "ddp"])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--port", type=int, default=29519)
    p.add_argument("--clip", action="store_true")
    p.add_argument("--fp16-hook", action="store_true", help="ddp: with fp16_compress_hook")
    p.add_argument("--mean-grads-off", action="store_true",
                   help="psrt: mean_grads=False, so the first step checks no gradient for edits")
    p.add_argument("--optimizer-on", default="servers", choices=["servers", "workers"],
                   help="psrt: where Adam runs (workers: the servers only sum)")
    p.add_argument("--trade", action="store_true",
                   help="only Adam on the servers against Adam on the workers (psrt, float32), alternated")
    args = p.parse_args()
    if run_role(args, psrt_worker, ddp_worker):
        return
    build, out, env, me = driver_setup(args, __file__)
    if args.trade:
        optimizer_trade(args, build, out, env, me)
        return
    results = {"tokens_per_step": args.batch * SEQ * 2, "steps": args.steps, "phases_ms": {},
               "server_rss_mb": {}}
    for clip in (False, True):
        suffix = "_clip" if clip else ""
        common = ["--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup)]
        common += ["--clip"] if clip else []
        for name, extra in (("ddp_gloo", []), ("ddp_gloo_fp16", ["--fp16-hook"])):
            results[name + suffix], results["phases_ms"][name + suffix] = run(me + ["--role", "ddp"] + extra + common)
        for name, compression, baseline in (("psrt_fp32", "none", "ddp_gloo"), ("psrt_fp16", "fp16", "ddp_gloo_fp16")):
            dist = {"parameter_server": {"enabled": True, "compression": compression,
                                         "pull_compression": compression}}
            memory = ServerMemory()
            results[name + suffix], results["phases_ms"][name + suffix] = run(
                [os.path.join(build, "bin", "psrt-run"), "--local=2", "--distribution=" + json.dumps(dist),
                 "--"] + me + ["--role", "psrt"] + common, env)
            results["server_rss_mb"][name + suffix] = memory.stop()
            results["%s%s_vs_%s%s" % (name, suffix, baseline, suffix)] = results[name + suffix] / results[baseline + suffix]
            if name == "psrt_fp32" and not clip:
                # What the first step's check for edits (GradScaler's in-place
                # unscale, .data edits) costs: the same job without it.
                results["psrt_fp32_mean_grads_off"], _ = run(
                    [os.path.join(build, "bin", "psrt-run"), "--local=2", "--distribution=" + json.dumps(dist),
                     "--"] + me + ["--role", "psrt", "--mean-grads-off"] + common, env)
                results["psrt_fp32_vs_mean_grads_off"] = results["psrt_fp32"] / results["psrt_fp32_mean_grads_off"]
        for name in ("psrt_fp32", "psrt_fp16", "ddp_gloo", "ddp_gloo_fp16"):
            if clip:
                results[name + "_clip_vs_" + name] = results[name + "_clip"] / results[name]
    print("%-14s %12s %12s %10s %16s" % ("run", "tokens/s", "vs DDP", "clip cost", "server RSS (MB)"))
    for name in ("ddp_gloo", "ddp_gloo_fp16", "psrt_fp32", "psrt_fp16"):
        for suffix in ("", "_clip"):
            key = name + suffix
            base = {"psrt_fp32": "ddp_gloo", "psrt_fp16": "ddp_gloo_fp16"}.get(name)
            vs = "%.2fx" % results["%s_vs_%s%s" % (key, base, suffix)] if base else "-"
            cost = "%.2fx" % results[name + "_clip_vs_" + name] if suffix else "-"
            rss = "%.0f" % results["server_rss_mb"][key] if key in results["server_rss_mb"] else "-"
            print("%-14s %12.1f %12s %10s %16s" % (key, results[key], vs, cost, rss))
    print("psrt fp32 against mean_grads=False (no first-step check for edits): %.2fx"
          % results["psrt_fp32_vs_mean_grads_off"])
    print("per step (ms): forward / backward / step")
    for name, ph in results["phases_ms"].items():
        print("  %-16s %9.1f %9.1f %9.1f" % (name, ph["forward_ms"], ph["backward_ms"], ph["step_ms"]))
    with open(os.path.join(out, "gpt2.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("gpt2_bench: wrote", os.path.join(out, "gpt2.json"))


def optimizer_trade(args, build, out, env, me):
    """Adam on the servers (they hold weights and moments) against Adam on
    every worker (the servers only sum: BytePS's design), float32, without
    and with the clip, each pair run twice, alternated."""
    dist = {"parameter_server": {"enabled": True, "compression": "none", "pull_compression": "none"}}
    common = ["--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    results = {"tokens_per_step": args.batch * SEQ * 2, "steps": args.steps, "phases_ms": {}, "server_rss_mb": {}}
    for clip in (False, True):
        suffix = "_clip" if clip else ""
        for attempt in range(2):
            for on in ("servers", "workers"):
                key = "psrt_fp32_%s%s_%d" % (on, suffix, attempt)
                memory = ServerMemory()
                results[key], results["phases_ms"][key] = run(
                    [os.path.join(build, "bin", "psrt-run"), "--local=2", "--distribution=" + json.dumps(dist),
                     "--"] + me + ["--role", "psrt", "--optimizer-on", on] + common + (["--clip"] if clip else []),
                    env)
                results["server_rss_mb"][key] = memory.stop()
        for attempt in range(2):
            results["workers_vs_servers%s_%d" % (suffix, attempt)] = (
                results["psrt_fp32_workers%s_%d" % (suffix, attempt)] / results["psrt_fp32_servers%s_%d" % (suffix, attempt)])
    print("%-28s %12s %16s" % ("run", "tokens/s", "server RSS (MB)"))
    for key in sorted(k for k in results if k.startswith("psrt_fp32_")):
        print("%-28s %12.1f %16.0f" % (key, results[key], results["server_rss_mb"][key]))
    for key in sorted(k for k in results if k.startswith("workers_vs_servers")):
        print("%-28s %12.2fx" % (key, results[key]))
    with open(os.path.join(out, "gpt2_optimizer_trade.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("gpt2_bench: wrote", os.path.join(out, "gpt2_optimizer_trade.json"))


if __name__ == "__main__":
    main()
