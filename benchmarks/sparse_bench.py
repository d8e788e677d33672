#!/usr/bin/env python3
"""Sparse tables: rows pulled and pushed per second through one psrt server
(one worker, sync, TCP or shared memory as the job picks) at several row
sizes and batches of distinct ids, against the same lookups and
torch.optim.SparseAdam updates done by torch in one process (the ratio), and
the recsys demo's samples/s with 1 and 2 servers. Everything is measured in
this run. Writes sparse.json and prints tables.

    python3 benchmarks/sparse_bench.py --build BUILD --out OUT
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(fn, repeat):
    """Best of `repeat` runs of fn() (seconds): the VM is noisy."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def worker(args):
    """Runs inside the psrt job: psrt's rows/s and torch's, per (dim, batch)."""
    import torch

    import psrt
    client = psrt.init()
    torch.manual_seed(0)
    results = []
    for dim in args.dims:
        step = 0  # this table's: a table's steps are its own
        vocab = 4 * max(args.batches)
        name = "t%d" % dim
        client.register_table(name, dim, vocab, 0, 0.01, 0, 0, 0, {"name": "adam", "lr": 1e-3},
                              psrt.Compression.none.value, psrt.Compression.none.value)
        local = torch.nn.Embedding(vocab, dim, sparse=True)
        opt = torch.optim.SparseAdam(local.parameters(), lr=1e-3)
        for batch in args.batches:
            ids = torch.randperm(vocab)[:batch].contiguous()
            rows = torch.empty(batch, dim)
            grads = torch.randn(batch, dim) * 1e-3
            repeat = max(3, min(20, (1 << 24) // (batch * dim)))

            def pull():
                client.wait(client.pull_rows(name, ids.data_ptr(), batch, rows.data_ptr(), step))

            def push():
                nonlocal step
                client.wait(client.push_rows(name, ids.data_ptr(), batch, grads.data_ptr(), step))
                step += 1

            def lookup():
                local(ids)

            def update():
                opt.zero_grad()
                local(ids).backward(grads)
                opt.step()

            for f in (pull, push, lookup, update):
                f()  # rows made, buffers warm
            r = {"dim": dim, "batch": batch,
                 "psrt_pull": batch / timed(pull, repeat), "psrt_push": batch / timed(push, repeat),
                 "torch_lookup": batch / timed(lookup, repeat), "torch_update": batch / timed(update, repeat)}
            results.append(r)
            print("bench-row " + json.dumps(r), flush=True)
        del local, opt
    return 0


def rows_per_second(build, dims, batches):
    dist = {"parameter_server": {"enabled": True, "mode": "sync", "workers_per_host": 1}}
    cmd = [os.path.join(build, "bin", "psrt-run"), "--local=1", "--distribution=" + json.dumps(dist), "--",
           sys.executable, os.path.abspath(__file__), "--worker", "--dims"] + [str(d) for d in dims] + \
          ["--batches"] + [str(b) for b in batches]
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"))
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=1800)
    if p.returncode != 0:
        raise SystemExit("sparse_bench: the table job failed:\n" + p.stdout[-4000:])
    return [json.loads(line.split("bench-row ", 1)[1]) for line in p.stdout.splitlines() if "bench-row " in line]


def demo_samples_per_second(build, servers, samples):
    dist = {"parameter_server": {"enabled": True, "mode": "sync", "workers_per_host": 2,
                                 "servers_per_host": servers}}
    cmd = [os.path.join(build, "bin", "psrt-run"), "--local=1", "--distribution=" + json.dumps(dist), "--",
           sys.executable, os.path.join(ROOT, "examples", "torch_recsys.py"), "--samples",
           str(samples), "--epochs", "1", "--threshold", "0"]
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"))
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=900)
    m = re.search(r"demo: (\d+) samples/s", p.stdout)
    if p.returncode != 0 or not m:
        raise SystemExit("sparse_bench: the demo failed:\n" + p.stdout[-4000:])
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build")
    ap.add_argument("--out")
    ap.add_argument("--dims", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--batches", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    ap.add_argument("--demo-samples", type=int, default=100000)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if not args.build or not args.out:
        ap.error("--build and --out are required")
    rows = rows_per_second(args.build, args.dims, args.batches)
    demo = {s: demo_samples_per_second(args.build, s, args.demo_samples) for s in (1, 2)}
    print("rows/s through 1 server (psrt) and in one process (torch: lookup; SparseAdam update)")
    print("%5s %7s  %12s %12s %6s  %12s %12s %6s" % ("dim", "ids", "psrt pull", "torch lookup", "ratio",
                                                   "psrt push", "torch update", "ratio"))
    for r in rows:
        r["pull_ratio"] = r["psrt_pull"] / r["torch_lookup"]
        r["push_ratio"] = r["psrt_push"] / r["torch_update"]
        print("%5d %7d  %12.0f %12.0f %6.3f  %12.0f %12.0f %6.3f" % (
            r["dim"], r["batch"], r["psrt_pull"], r["torch_lookup"], r["pull_ratio"], r["psrt_push"],
            r["torch_update"], r["push_ratio"]))
    print("recsys demo (2 workers, sync): %.0f samples/s with 1 server, %.0f with 2 (ratio %.2f)"
          % (demo[1], demo[2], demo[2] / demo[1]))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sparse.json"), "w") as f:
        json.dump({"rows_per_second": rows, "demo_samples_per_second": demo}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
