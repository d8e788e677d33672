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
import statistics
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
    return ({r["bytes"]: {t: r["psrt_" + t]["gbps"] for t in ("tcp", "shm")} for r in rows},
            {r["bytes"]: {t: r["psrt_" + t]["cpu_ms_per_round"] for t in ("tcp", "shm")} for r in rows},
            {r["bytes"]: {t: r["psrt_" + t]["busy_cores"] for t in ("tcp", "shm")} for r in rows})


def samples_per_second(bin_dir, replicas, steps, dim, batch, skip=50):
    """The whole job's samples/s (start-up included) and the steady state's
    (rank 0's loss log from step `skip` on)."""
    dist = {"parameter_server": {"enabled": True, "partition_bytes": 1 << 16, "replicas": replicas}}
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "loss")
        start = time.monotonic()
        subprocess.run([os.path.join(bin_dir, "psrt-run"), "--local=2", "--distribution=" + json.dumps(dist), "--",
                        os.path.join(bin_dir, "psrt-example-linreg"), "--steps=%d" % steps, "--dim=%d" % dim,
                        "--batch=%d" % batch, "--lr=1e-6", "--log-every=1", "--loss-log=" + log],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, timeout=900)
        whole = 2 * batch * steps / (time.monotonic() - start)
        with open(log) as f:
            rows = [(float(t), int(step)) for t, step, _ in (line.split() for line in f) if int(step) >= skip]
    (t0, s0), (t1, s1) = rows[0], rows[-1]
    return whole, 2 * batch * (s1 - s0) / (t1 - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", default="64K,1M,16M")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--dim", type=int, default=1 << 16, help="weights of the trainer (256 KiB)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3, help="trainer jobs without and with a replica, in turns")
    args = ap.parse_args()
    bin_dir = os.path.join(args.build, "bin")
    report = {"goodput_gbps": {}, "cpu_ms_per_round": {}, "busy_cores": {}, "samples_per_second": {0: [], 1: []},
              "steady_samples_per_second": {0: [], 1: []}}
    for replicas in (0, 1):
        (report["goodput_gbps"][replicas], report["cpu_ms_per_round"][replicas],
         report["busy_cores"][replicas]) = goodput(bin_dir, replicas, args.sizes, args.seconds)
    # Jobs without and with a replica in turns: this VM's speed drifts.
    for _ in range(args.rounds):
        for replicas in (0, 1):
            whole, steady = samples_per_second(bin_dir, replicas, args.steps, args.dim, args.batch)
            report["samples_per_second"][replicas].append(whole)
            report["steady_samples_per_second"][replicas].append(steady)
    # Where the time goes: CPU a round (the bench's worker and both
    # servers) and cores busy while timed; on a machine whose cores are all
    # busy, goodput follows the CPU a round.
    print("%10s  %-4s  %8s  %12s  %6s  %13s  %10s  %11s" % (
        "size", "path", "GB/s", "GB/s replica", "ratio", "CPU ms/round", "with", "busy cores"))
    ratios, cpu_ratios = {}, {}
    for size, without in report["goodput_gbps"][0].items():
        for t, g in without.items():
            with_replica = report["goodput_gbps"][1][size][t]
            cpu0, cpu1 = (report["cpu_ms_per_round"][r][size][t] for r in (0, 1))
            busy0, busy1 = (report["busy_cores"][r][size][t] for r in (0, 1))
            ratios["%d_%s" % (size, t)] = with_replica / g
            cpu_ratios["%d_%s" % (size, t)] = cpu1 / cpu0
            print("%10d  %-4s  %8.3f  %12.3f  %6.2f  %13.3f  %10.3f  %5.2f, %4.2f" % (
                size, t, g, with_replica, with_replica / g, cpu0, cpu1, busy0, busy1))
    report["goodput_ratio"] = ratios
    report["cpu_per_round_ratio"] = cpu_ratios
    for what, name in (("samples_per_second", "whole job"), ("steady_samples_per_second", "steady state")):
        s0, s1 = (statistics.median(report[what][r]) for r in (0, 1))
        print("trainer samples/s (%s, median of %d): %.0f without a replica, %.0f with (ratio %.2f)" %
              (name, args.rounds, s0, s1, s1 / s0))
        report[what + "_ratio"] = s1 / s0
    with open(os.path.join(args.out, "replicas.json"), "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
