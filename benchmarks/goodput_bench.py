#!/usr/bin/env python3
"""Push+pull goodput against tensor size: psrt over TCP and over shared
memory and one raw loopback TCP connection (push_pull_bench's JSON, measured
in this run), and MXNet's own kvstore "dist_sync" (ps-lite from the MXNet
wheel: a scheduler, 2 servers and 1 worker on loopback) pushing and pulling
the same sizes, measured here right after. Draws them as one PNG and writes
the figures with their ratios as JSON.

  goodput = 2 * bytes * rounds / seconds      (a push and a pull a round)

    .venv/bin/python benchmarks/goodput_bench.py --push-pull OUT/push_pull.json --out OUT

The dist_sync part runs under .venv-mxnet's python (skipped, saying so,
without it).
"""

import argparse
import json
import os
import subprocess
import sys
import time

from frameworks_bench import ROOT, DistSync


def mx_worker(sizes, seconds):
    """One dist_sync worker: for each size, push a gradient and pull the
    weights until `seconds` have passed; prints one JSON line of results."""
    import mxnet as mx
    import numpy as np
    kv = mx.kv.create("dist_sync")
    results = []
    for key, size in enumerate(sizes):
        n = size // 4
        weights = mx.nd.ones((n,))
        grad = mx.nd.ones((n,))
        out = mx.nd.zeros((n,))
        kv.init(key, weights)
        rounds, start = 0, None
        warm_until = time.monotonic() + 0.1
        while True:
            kv.push(key, grad)
            kv.pull(key, out=out)
            out.wait_to_read()
            now = time.monotonic()
            if start is None:
                if now >= warm_until:
                    start = now
                continue
            rounds += 1
            if now - start >= seconds and rounds >= 3:
                break
        elapsed = time.monotonic() - start
        results.append({"bytes": size, "rounds": rounds, "seconds": elapsed,
                        "gbps": 2.0 * size * rounds / elapsed / 1e9})
        assert np.isfinite(out[0].asscalar())
    print("RESULT " + json.dumps(results), flush=True)


def run_dist_sync(python, sizes, seconds):
    with DistSync(python, 1) as ps:
        p = subprocess.run([python, os.path.abspath(__file__), "--mx-worker", "--sizes",
                            ",".join(map(str, sizes)), "--seconds", str(seconds)],
                           env=ps.worker_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=900)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError("dist_sync failed: " + p.stdout[-500:])


def human(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return "%d %s" % (b >> shift, unit)
    return "%d B" % b


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--push-pull", help="push_pull_bench's JSON from this run")
    ap.add_argument("--out", help="folder for goodput.json and goodput.png")
    ap.add_argument("--mx-python", default=os.path.join(ROOT, ".venv-mxnet", "bin", "python"))
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--mx-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mx_worker:
        return mx_worker([int(s) for s in args.sizes.split(",")], args.seconds)
    if not args.push_pull or not args.out:
        ap.error("--push-pull and --out are required")

    with open(args.push_pull) as f:
        pp = json.load(f)
    rows = pp["results"]
    sizes = [r["bytes"] for r in rows]
    series = {
        "psrt (TCP)": [r["psrt_tcp"]["gbps"] for r in rows],
        "psrt (shared memory)": [r["psrt_shm"]["gbps"] for r in rows],
        "one loopback TCP connection": [r["tcp"]["gbps"] for r in rows],
    }
    mx = None
    if os.path.exists(args.mx_python):
        mx = run_dist_sync(args.mx_python, sizes, args.seconds)
        series["MXNet dist_sync (ps-lite)"] = [m["gbps"] for m in mx]
    else:
        print("goodput_bench: no %s: MXNet dist_sync skipped (scripts/setup.sh frameworks makes it)"
              % args.mx_python)

    header = ["size", "psrt-tcp", "psrt-shm", "TCP"] + (["dist_sync", "tcp/mx", "shm/mx"] if mx else [])
    print("".join("%12s" % h for h in header) + "   (GB/s)")
    table = []
    for i, size in enumerate(sizes):
        e = {"bytes": size, "size": human(size)}
        e.update({k: v[i] for k, v in series.items()})
        line = [human(size)] + ["%.3f" % series[k][i] for k in list(series)[:3]]
        if mx:
            d = series["MXNet dist_sync (ps-lite)"][i]
            e["psrt_tcp_over_dist_sync"] = series["psrt (TCP)"][i] / d
            e["psrt_shm_over_dist_sync"] = series["psrt (shared memory)"][i] / d
            line += ["%.3f" % d, "%.2f" % e["psrt_tcp_over_dist_sync"], "%.2f" % e["psrt_shm_over_dist_sync"]]
        table.append(e)
        print("".join("%12s" % c for c in line))

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "goodput.json"), "w") as f:
        json.dump({"benchmark": "goodput", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "unit": "GB/s, 2 * bytes * rounds / seconds", "servers": 2, "workers": 1,
                   "results": table, "push_pull": pp}, f, indent=2)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (name, values), marker in zip(series.items(), "osx^"):
        ax.plot(sizes, values, marker=marker, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([human(s) for s in sizes], rotation=30)
    ax.set_xlabel("tensor size")
    ax.set_ylabel("push + pull goodput (GB/s)")
    ax.set_title("2 servers, 1 worker, one host (%s CPUs)" % pp["machine"]["nproc"])
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "goodput.png"), dpi=120)
    print("wrote %s and %s" % (os.path.join(args.out, "goodput.json"), os.path.join(args.out, "goodput.png")))


if __name__ == "__main__":
    sys.exit(main())
