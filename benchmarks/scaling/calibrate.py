#!/usr/bin/env python3
"""Calibrates the scaling model (model.py) on this machine.

Runs psrt's own benchmarks and fits the model's costs to them:

* kernels_bench: memcpy over 64 MiB and the fp16 conversions at the CPU's
  ISA give the cost per byte of a server's passes over a key (adding a push
  into the sum; SGD's step), each a read and a write, and of fp16; Adam over
  100M parameters its cost per parameter (for the predictions);
* push_pull_bench --servers=1: psrt's push+pull round over its TCP data
  channel for 4 KiB to 16 MiB, the model's per-request CPU, per-byte CPU and
  per-message latency are fitted so that the model, replaying that
  benchmark (1 worker, 1 server, this machine's cores), gives the same round
  times; its raw TCP baseline gives the line rate behind a tbf;
* psrt-example-linreg --reference=1: the validation job's compute per step
  (the trainer alone, no servers), for each --dim to validate.

Writes calibration.json; validate.py and predict.py read it.

    python3 benchmarks/scaling/calibrate.py --build build --out DIR [--dims 65536]
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model  # noqa: E402

SIZES = "4K,64K,256K,1M,4M,16M"


def kernels(bin_dir):
    out = subprocess.run([os.path.join(bin_dir, "kernels_bench"), "--benchmark_format=json",
                          "--benchmark_filter=^(Memcpy/67108864|Fp32ToFp16/.*/67108864|"
                          "Fp16ToFp32/.*/67108864|Adam100M/.*)$"],
                         check=True, capture_output=True, text=True, timeout=600).stdout
    report = json.loads(out)
    isa = report["context"].get("psrt_cpu_isa", "scalar")
    rows = {b["name"]: b for b in report["benchmarks"]}
    memcpy_bps = rows["Memcpy/67108864"]["bytes_per_second"]  # read + written
    to16 = rows["Fp32ToFp16/%s/67108864" % isa]["items_per_second"]
    from16 = rows["Fp16ToFp32/%s/67108864" % isa]["items_per_second"]
    adam = rows["Adam100M/%s/iterations:5" % isa]
    adam_s = adam["real_time"] / 1e3 if adam.get("time_unit") == "ms" else adam["real_time"] / 1e9
    return {
        "isa": isa,
        "memcpy_bytes_per_s": memcpy_bps,
        # Adding a push into the sum, and SGD's step: a pass each, which
        # reads and writes each fp32 byte (2 bytes of memcpy's count).
        "accumulate_cpu_s": 2 / memcpy_bps,
        "apply_cpu_s": 2 / memcpy_bps,
        # Per fp32 byte: the worker converts to fp16, the server back (and
        # the answer the other way); here one conversion each way, per byte.
        "fp16_cpu_s": (1 / to16 + 1 / from16) / 4,
        "adam_cpu_s_per_param": adam_s / 100e6,
    }


def push_pull(bin_dir):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "push_pull.json")
        subprocess.run([os.path.join(bin_dir, "push_pull_bench"), "--servers=1", "--sizes=" + SIZES,
                        "--seconds=1", "--rss-steps=0", "--json=" + path],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1200)
        with open(path) as f:
            report = json.load(f)
    return {
        "partition_bytes": report["config"]["partition_bytes"],
        "round_s": {str(r["bytes"]): r["psrt_tcp"]["latency_ms"] / 1e3 for r in report["results"]},
        "raw_tcp_bytes_per_s": max(r["tcp"]["gbps"] for r in report["results"]) * 1e9 / 2,
        "nproc": report["machine"]["nproc"],
    }


def bench_model(costs, nproc, partition_bytes, nbytes):
    """The model's push_pull_bench round: 1 worker and 1 server on one host."""
    cluster = model.Cluster(hosts=1, shared_cores=nproc)
    job = model.Job(params=max(1, nbytes // 4), compute_s=0.0, partition_bytes=partition_bytes)
    return 1 / model.simulate(cluster, job, costs, steps=6, warmup=2)


def fit(measured, nproc, partition_bytes, fixed):
    """Least squares in log space, coordinate search over the three free costs."""
    names = ["request_cpu_s", "byte_cpu_s", "hop_latency_s"]
    x = {"request_cpu_s": 10e-6, "byte_cpu_s": 0.3e-9, "hop_latency_s": 10e-6}

    def error(params):
        costs = model.Costs(**params, **fixed)
        return sum(math.log(bench_model(costs, nproc, partition_bytes, int(b)) / t) ** 2
                   for b, t in measured.items())

    best = error(x)
    step = 2.0
    while step > 1.01:
        improved = False
        for n in names:
            for f in (step, 1 / step):
                trial = dict(x, **{n: x[n] * f})
                e = error(trial)
                if e < best:
                    x, best, improved = trial, e, True
        if not improved:
            step = math.sqrt(step)
    return x, math.sqrt(best / len(measured))


def linreg_compute(bin_dir, dim, batch, steps=20):
    start = time.monotonic()
    subprocess.run([os.path.join(bin_dir, "psrt-example-linreg"), "--reference=1", "--dim=%d" % dim,
                    "--batch=%d" % batch, "--steps=%d" % steps],
                   check=True, stdout=subprocess.DEVNULL, timeout=600)
    return (time.monotonic() - start) / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dims", default="65536", help="linreg --dim values to time (validate.py's)")
    ap.add_argument("--batch", type=int, default=64, help="multihost_bench's batch per worker")
    args = ap.parse_args()
    bin_dir = os.path.join(args.build, "bin")
    os.makedirs(args.out, exist_ok=True)

    k = kernels(bin_dir)
    print("kernels_bench (%s): memcpy %.1f GB/s, a pass %.3f ns/byte, fp16 %.3f ns/byte, "
          "Adam %.2f ns/param" % (k["isa"], k["memcpy_bytes_per_s"] / 1e9, k["accumulate_cpu_s"] * 1e9,
                                  k["fp16_cpu_s"] * 1e9, k["adam_cpu_s_per_param"] * 1e9))
    pp = push_pull(bin_dir)
    fixed = {n: k[n] for n in ("accumulate_cpu_s", "apply_cpu_s", "fp16_cpu_s")}
    fitted, rms = fit(pp["round_s"], pp["nproc"], pp["partition_bytes"], fixed)
    costs = model.Costs(**fitted, **fixed)
    print("fitted to push_pull_bench (psrt over TCP, 1 server, %d cores): request %.1f us, "
          "byte %.3f ns, hop %.1f us (rms log error %.3f)"
          % (pp["nproc"], fitted["request_cpu_s"] * 1e6, fitted["byte_cpu_s"] * 1e9,
             fitted["hop_latency_s"] * 1e6, rms))
    rows = []
    for b, t in sorted(pp["round_s"].items(), key=lambda kv: int(kv[0])):
        m = bench_model(costs, pp["nproc"], pp["partition_bytes"], int(b))
        rows.append({"bytes": int(b), "measured_s": t, "model_s": m})
        print("  %9d bytes: measured %8.3f ms, model %8.3f ms" % (int(b), t * 1e3, m * 1e3))
    compute = {}
    for dim in (int(d) for d in args.dims.split(",")):
        compute[str(dim)] = linreg_compute(bin_dir, dim, args.batch)
        print("linreg --dim=%d --batch=%d: %.1f ms of compute a step" % (dim, args.batch,
                                                                          compute[str(dim)] * 1e3))
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "nproc": pp["nproc"],
        "costs": dataclass_dict(costs),
        "kernels": k,
        "push_pull": {"partition_bytes": pp["partition_bytes"], "rounds": rows, "rms_log_error": rms},
        "raw_tcp_bytes_per_s": pp["raw_tcp_bytes_per_s"],
        "linreg_compute_s": compute,
        "linreg_batch": args.batch,
    }
    path = os.path.join(args.out, "calibration.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print("wrote", path)


def dataclass_dict(obj):
    return {f: getattr(obj, f) for f in obj.__dataclass_fields__}


if __name__ == "__main__":
    main()
