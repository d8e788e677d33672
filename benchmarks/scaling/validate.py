#!/usr/bin/env python3
"""Checks the calibrated scaling model against jobs it did not see.

Runs multihost_bench's host scan: psrt-example-linreg (sync SGD, batch 64
per worker) on 1, 2, 4 and 8 network-namespace hosts of one server and one
worker each, every host's sending limited by tc's tbf, and predicts each
job's samples/s with model.py from calibration.json (calibrate.py). The
hosts share this machine's cores, so the model gets one CPU pool for all
of them. Prints and writes the predicted and measured samples/s side by side
(validation.json). Needs root (network namespaces); elsewhere it says so.

    python3 benchmarks/scaling/validate.py --build build --out DIR
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


def predict(cal, hosts, dim, partition_bytes, rate, burst):
    costs = model.Costs(**cal["costs"])
    cluster = model.Cluster(hosts=hosts, shared_cores=cal["nproc"], out_bytes_per_s=tc_bytes(rate),
                            burst_bytes=tc_bytes(burst), line_bytes_per_s=cal["raw_tcp_bytes_per_s"],
                            in_bytes_per_s=cal["raw_tcp_bytes_per_s"], link_latency_s=0.0)
    job = model.Job(params=dim + 1, variables=(("weight", dim), ("bias", 1)), compute_s=cal["linreg_compute_s"][str(dim)],
                    batch=cal["linreg_batch"], compute_on_cpu=True, partition_bytes=partition_bytes)
    return model.simulate(cluster, job, costs, steps=8, warmup=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True, help="holds calibration.json; validation.json goes here")
    ap.add_argument("--hosts", default="1,2,4,8")
    ap.add_argument("--dim", type=int, default=65536)
    ap.add_argument("--partition-bytes", type=int, default=65536)
    ap.add_argument("--rate", default="20mbit")
    ap.add_argument("--burst", default="32kb")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--measured", help="a multihost_bench JSON to read instead of running it")
    args = ap.parse_args()
    with open(os.path.join(args.out, "calibration.json")) as f:
        cal = json.load(f)
    if str(args.dim) not in cal["linreg_compute_s"]:
        sys.exit("calibration.json has no compute time for --dim=%d (calibrate.py --dims)" % args.dim)

    measured_path = args.measured or os.path.join(args.out, "multihost_scan.json")
    if not args.measured:
        subprocess.run([os.path.join(args.build, "bin", "multihost_bench"), "--rounds=0",
                        "--scan-hosts=" + args.hosts, "--scan-rate=" + args.rate,
                        "--scan-burst=" + args.burst, "--dim=%d" % args.dim,
                        "--partition-bytes=%d" % args.partition_bytes, "--lr=1e-5",
                        "--steps=%d" % args.steps, "--json=" + measured_path],
                       check=True, timeout=3600)
    with open(measured_path) as f:
        measured = json.load(f)
    if "skipped" in measured:
        print("validate: skipped:", measured["skipped"])
        return
    rows = []
    print("\n%6s %12s %12s %8s" % ("hosts", "measured", "model", "model/measured"))
    for point in measured["host_scan"]:
        n = point["hosts"]
        m = point["samples_per_second"]
        p = predict(cal, n, args.dim, args.partition_bytes, args.rate, args.burst)
        rows.append({"hosts": n, "measured_samples_per_second": m, "model_samples_per_second": p,
                     "model_over_measured": p / m})
        print("%6d %12.0f %12.0f %8.2f" % (n, m, p, p / m))
    worst = max(abs(r["model_over_measured"] - 1) for r in rows)
    print("largest difference: %.0f%%" % (100 * worst))
    result = {"job": {"dim": args.dim, "batch": cal["linreg_batch"], "partition_bytes": args.partition_bytes,
                      "rate": args.rate, "burst": args.burst, "steps": args.steps},
              "rows": rows, "largest_difference": worst}
    with open(os.path.join(args.out, "validation.json"), "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
