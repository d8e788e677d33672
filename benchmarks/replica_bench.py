#!/usr/bin/env python3
"""What "replicas": 1 costs: push+pull goodput (push_pull_bench, psrt over TCP
and over shared memory, 2 servers, each keeping the other's copies) and the
example trainer's samples/s (2 hosts, sync), each without and with a replica,
measured in this run. Writes replicas.json with the ratios and prints a table.

    python3 benchmarks/replica_bench.py --build BUILD --out OUT
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def goodput(bin_dir, replicas, sizes, seconds):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "push_pull.json")
        subprocess.run([os.path.join(bin_dir, "push_pull_bench"), "--replicas=%d" % replicas, "--sizes=" + sizes,
                        "--seconds=%g" % seconds, "--rss-steps=0", "--json=" + out],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
        with open(out) as f:
            rows = json.load(f)["results"]
    return {r["bytes"]: {t: r["psrt_" + t]["gbps"] for t in ("tcp", "shm")} for r in rows}


def samples_per_second(bin_dir, replicas, steps, dim, batch):
    dist = {"parameter_server": {"enabled": True, "partition_bytes": 1 << 16, "replicas": replicas}}
    start = time.monotonic()
    subprocess.run([os.path.join(bin_dir, "psrt-run"), "--local=2", "--distribution=" + json.dumps(dist), "--",
                    os.path.join(bin_dir, "psrt-example-linreg"), "--steps=%d" % steps, "--dim=%d" % dim,
                    "--batch=%d" % batch, "--lr=1e-6", "--log-every=1000000"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, timeout=900)
    return 2 * batch * steps / (time.monotonic() - start)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", default="64K,1M,16M")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--dim", type=int, default=1 << 16, help="weights of the trainer (256 KiB)")
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    bin_dir = os.path.join(args.build, "bin")
    report = {"goodput_gbps": {}, "samples_per_second": {}}
    for replicas in (0, 1):
        report["goodput_gbps"][replicas] = goodput(bin_dir, replicas, args.sizes, args.seconds)
        report["samples_per_second"][replicas] = samples_per_second(bin_dir, replicas, args.steps, args.dim,
                                                                    args.batch)
    print("%10s  %-4s  %12s  %12s  %6s" % ("size", "path", "GB/s", "GB/s replica", "ratio"))
    ratios = {}
    for size, without in report["goodput_gbps"][0].items():
        for t, g in without.items():
            with_replica = report["goodput_gbps"][1][size][t]
            ratios["%d_%s" % (size, t)] = with_replica / g
            print("%10d  %-4s  %12.3f  %12.3f  %6.2f" % (size, t, g, with_replica, with_replica / g))
    s0, s1 = report["samples_per_second"][0], report["samples_per_second"][1]
    print("trainer samples/s: %.0f without a replica, %.0f with (ratio %.2f)" % (s0, s1, s1 / s0))
    report["goodput_ratio"] = ratios
    report["samples_per_second_ratio"] = s1 / s0
    with open(os.path.join(args.out, "replicas.json"), "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
