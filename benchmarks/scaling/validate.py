#!/usr/bin/env python3
"""Checks the calibrated scaling model against jobs it did not see.

Runs multihost_bench's host scan: psrt-example-linreg (sync SGD, batch 64
per worker) on 1, 2, 4 and 8 network-namespace hosts of one server and one
worker each, every host's sending limited by tc's tbf, and predicts each
job's samples/s with model.py from calibration.json (calibrate.py). With
--per-host=2,4 it also runs multihost_bench --per-host: 2 hosts of N workers
each, with each host's workers summing first and each pushing alone. The
hosts share this machine's cores, so the model gets one CPU pool for all
of them. Prints and writes the predicted and measured samples/s side by side
(validation.json). Needs root (network namespaces); elsewhere it says so.

    python3 benchmarks/scaling/validate.py --build build --out DIR [--per-host=2,4]
"""

import argparse
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model  # noqa: E402


def tc_bytes(text):
    """tc's rate or size ("20mbit", "32kb") in bytes (per second)."""
    m = re.fullmatch(r"([0-9.]+)([kmg]?)(bit|b)", text.lower())
    if not m:
        raise ValueError("not a tc rate or size: " + text)
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    if m.group(3) == "b" and m.group(2) == "k":
        scale = 1024  # tc's "kb" is KiB
    value = float(m.group(1)) * scale
    return value / 8 if m.group(3) == "bit" else value


def predict(cal, hosts, dim, partition_bytes, rate, burst, workers_per_host=1, local_sum=False):
    costs = model.Costs(**cal["costs"])
    cluster = model.Cluster(hosts=hosts, workers_per_host=workers_per_host, local_sum=local_sum,
                            shared_cores=cal["nproc"], out_bytes_per_s=tc_bytes(rate),
                            burst_bytes=tc_bytes(burst), line_bytes_per_s=cal["raw_tcp_bytes_per_s"],
                            in_bytes_per_s=cal["raw_tcp_bytes_per_s"], link_latency_s=0.0)
    job = model.Job(params=dim + 1, variables=(("weight", dim), ("bias", 1)), compute_s=cal["linreg_compute_s"][str(dim)],
                    batch=cal["linreg_batch"], compute_on_cpu=True, partition_bytes=partition_bytes)
    return model.simulate(cluster, job, costs, steps=8, warmup=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True, help="holds calibration.json; validation.json goes here")
    ap.add_argument("--hosts", default="1,2,4,8", help="the host scan's hosts (none: \"\")")
    ap.add_argument("--dim", type=int, default=65536)
    ap.add_argument("--partition-bytes", type=int, default=65536)
    ap.add_argument("--rate", default="20mbit")
    ap.add_argument("--burst", default="32kb")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--per-host", default="", help="workers a host of 2-host jobs, e.g. 2,4 (none: \"\")")
    ap.add_argument("--measured", help="a multihost_bench JSON to read instead of running it (the host scan)")
    args = ap.parse_args()
    with open(os.path.join(args.out, "calibration.json")) as f:
        cal = json.load(f)
    if str(args.dim) not in cal["linreg_compute_s"]:
        sys.exit("calibration.json has no compute time for --dim=%d (calibrate.py --dims)" % args.dim)

    def bench(json_path, flags, run=True):
        if run:
            subprocess.run([os.path.join(args.build, "bin", "multihost_bench"), "--rounds=0",
                            "--scan-rate=" + args.rate, "--scan-burst=" + args.burst,
                            "--partition-bytes=%d" % args.partition_bytes, "--lr=1e-5",
                            "--steps=%d" % args.steps, "--json=" + json_path] + flags,
                           check=True, timeout=3600)
        with open(json_path) as f:
            measured = json.load(f)
        if "skipped" in measured:
            sys.exit("validate: skipped: " + measured["skipped"])
        return measured

    rows = []

    def row(label, measured, **setting):
        p = predict(cal, dim=args.dim, partition_bytes=args.partition_bytes, rate=args.rate, burst=args.burst,
                    **setting)
        rows.append(dict(setting, measured_samples_per_second=measured, model_samples_per_second=p,
                         model_over_measured=p / measured))
        print("%-34s %12.0f %12.0f %8.2f" % (label, measured, p, p / measured))

    print("\n%-34s %12s %12s %8s" % ("job", "measured", "model", "model/measured"))
    if args.hosts:
        measured = bench(args.measured or os.path.join(args.out, "multihost_scan.json"),
                         ["--scan-hosts=" + args.hosts, "--dim=%d" % args.dim], run=not args.measured)
        for point in measured["host_scan"]:
            row("%d hosts of 1 worker" % point["hosts"], point["samples_per_second"],
                hosts=point["hosts"])
    for n in [int(x) for x in args.per_host.split(",") if x]:
        measured = bench(os.path.join(args.out, "multihost_per_host%d.json" % n),
                         ["--per-host=%d" % n, "--per-host-rate=" + args.rate,
                          "--per-host-dim=%d" % args.dim, "--per-host-batch=%d" % cal["linreg_batch"]])
        got = measured["per_host"]
        for summed in (False, True):
            key = "summed_samples_per_second" if summed else "alone_samples_per_second"
            row("2 hosts of %d, %s" % (n, "summing first" if summed else "each pushing alone"),
                sorted(got[key])[len(got[key]) // 2], hosts=2, workers_per_host=n, local_sum=summed)
    worst = max(abs(r["model_over_measured"] - 1) for r in rows)
    print("largest difference: %.0f%%" % (100 * worst))
    result = {"job": {"dim": args.dim, "batch": cal["linreg_batch"], "partition_bytes": args.partition_bytes,
                      "rate": args.rate, "burst": args.burst, "steps": args.steps,
                      "per_host": args.per_host},
              "rows": rows, "largest_difference": worst}
    with open(os.path.join(args.out, "validation.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
