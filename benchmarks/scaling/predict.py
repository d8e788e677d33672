#!/usr/bin/env python3
"""Predicts psrt's scaling efficiency with the calibrated model (model.py).

Three jobs, sync SGD, 8 GPUs (workers) a host, 8 to 256 workers, on hosts
linked at 25, 100 and 400 Gb/s; efficiency is the job's samples/s over the
workers' count times one GPU's samples/s with no communication. The GPU
compute times are stated inputs (V100-class, from the figures the anchors'
setups publish), not measured here; every communication and server cost is
calibrate.py's, measured on this machine, with the server side given
`--cores` cores a host. Writes predictions.json and scaling.png (the curves
with the published Horovod and BytePS points), and, for each job and link at
256 workers, the first psrt setting in a fixed order of cost that reaches
90%.

    python3 benchmarks/scaling/predict.py --out DIR   (DIR holds calibration.json)
"""

import argparse
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model  # noqa: E402

# Sizes from the models' papers; compute per step on one V100-class GPU at
# the anchors' batch sizes.
JOBS = {
    # 25.6M parameters, fp32, batch 64 at ~360 images/s.
    "ResNet-50": model.Job(params=25_600_000, compute_s=64 / 360, batch=64, overlap=True,
                           straggler_sigma=0.02),
    # 340M parameters, mixed precision (fp16 gradients), batch 64 of 128
    # tokens at ~190 sequences/s; Adam on the servers.
    "BERT-large": model.Job(params=340_000_000, compute_s=64 / 190, batch=64, overlap=True,
                            straggler_sigma=0.02, fp16=True),
    # MLPerf's DLRM: 2.9M dense parameters, 26 tables of 128-wide rows,
    # batch 2048: 2048 x 26 rows of 512 bytes pushed and pulled a step
    # (no deduplication), ~20 ms of compute.
    "DLRM": model.Job(params=2_900_000, compute_s=0.020, batch=2048, overlap=True,
                      straggler_sigma=0.02, sparse_bytes=2048 * 26 * 128 * 4),
}
ADAM = {"BERT-large"}
LINKS_GBPS = (25, 100, 400)
WORKERS = (8, 16, 32, 64, 128, 256)
GPUS_PER_HOST = 8
# Stated inputs of the local stage as psrt builds it (docs/runtime.md, "Local
# aggregation"), not measured here: a GPU's copies to and from the host, and
# a host's memory bandwidth shared by its 8 processes' passes.
PCIE_BYTES_PER_S = 12e9
HOST_MEMORY_BYTES_PER_S = 100e9
# The servers only sum and every GPU runs the optimizer on the mean
# (optimizer_on="workers", docs/frameworks.md; BytePS's design): the
# servers' step becomes a copy of the mean, and each GPU's step gains Adam
# over every parameter, a stated input: Adam reads the fp32 weights, the
# gradient and both moments and writes three of them back, 28 bytes a
# parameter, at a V100's ~900 GB/s.
GPU_ADAM_S_PER_PARAM = 28 / 900e9

# Published points (scaling efficiency, GPUs, link):
ANCHORS = [
    # Horovod's docs/benchmarks: 128 servers of 4 Pascal GPUs, 25 Gbit/s RoCE.
    ("Horovod Inception V3 (23.8M), 25 Gb/s RoCE", 512, 0.90, 25),
    ("Horovod ResNet-101 (44.5M), 25 Gb/s RoCE", 512, 0.90, 25),
    ("Horovod VGG-16 (138M), 25 Gb/s RoCE", 512, 0.68, 25),
    # BytePS README: BERT-large, mixed precision, 8 V100 a machine, 100 Gbit/s RDMA.
    ("BytePS BERT-large, 100 Gb/s RDMA", 256, 0.90, 100),
]

# The servers only summing (link, curve key, label, changes).
SUM_ONLY = [
    (100, "sum_only", "as built", {"overlap": False}),
    (100, "sum_only_overlap", "mean in buckets during backward", {"overlap": True}),
    (400, "sum_only_overlap", "mean in buckets during backward", {"overlap": True}),
    (100, "sum_only_host_reduce", "buckets, a host's GPUs summing on the devices",
     {"overlap": True, "host_reduce": True}),
]

# What psrt could change, in the order one would try it.
SETTINGS = [
    ("as configured (a worker per GPU, 1 server a host)", {}),
    ("fp16 gradients", {"fp16": True}),
    ("2 servers a host, fp16", {"servers_per_host": 2, "fp16": True}),
    ("a host's processes sum in shared memory, one push a host (built)", {"host_sum": True}),
    ("the same, fp16", {"host_sum": True, "fp16": True}),
    ("a host's GPUs sum on the devices, one push a host (not built)", {"host_reduce": True}),
    ("the same, fp16", {"host_reduce": True, "fp16": True}),
    ("the same, fp16, 2 servers a host", {"host_reduce": True, "fp16": True, "servers_per_host": 2}),
    ("the same, fp16, 2 servers and 64 cores a host", {"host_reduce": True, "fp16": True,
                                                       "servers_per_host": 2, "host_cores": 64}),
]


def job_is_sparse(name):
    return JOBS[name].sparse_bytes > 0


def costs_for(cal, name):
    c = dict(cal["costs"])
    if name in ADAM:  # Adam's step instead of SGD's, per fp32 byte
        c["apply_cpu_s"] = cal["kernels"]["adam_cpu_s_per_param"] / 4
    return model.Costs(**c)


def run(costs, name, workers, gbps, cores, **changes):
    base = JOBS[name]
    job = dataclasses.replace(base, **{k: v for k, v in changes.items() if k in base.__dataclass_fields__})
    if changes.get("sum_only"):
        # The servers' apply is a copy (a pass, as SGD's); Adam moves to the
        # GPUs, after the mean lands.
        costs = dataclasses.replace(costs, apply_cpu_s=costs.accumulate_cpu_s)
        job = dataclasses.replace(job, compute_s=job.compute_s + job.params * GPU_ADAM_S_PER_PARAM)
    per_host = min(workers, GPUS_PER_HOST)
    local_sum = bool(changes.get("host_sum"))
    if changes.get("host_reduce"):
        # One push a host of the host's gradients summed on the devices
        # (NCCL over NVLink, ~100 GB/s, reduce then broadcast), after the
        # backward pass: a bound, not overlapped.
        local = 2 * 4 * job.params / (2 if job.fp16 else 1) / 100e9
        job = dataclasses.replace(job, batch=job.batch * per_host, sparse_bytes=job.sparse_bytes * per_host,
                                  compute_s=job.compute_s + local)
        per_host = 1
    elif local_sum:
        # As psrt builds it, the local stage the validation checked
        # (model.py's local_sum): each process copies its fp32 gradient off
        # its GPU first and its weights back after (PCIe), and the passes of
        # all the host's cores share its memory bandwidth.
        job = dataclasses.replace(job, compute_s=job.compute_s + 2 * 4 * job.params / PCIE_BYTES_PER_S)
        host_cores = changes.get("host_cores", cores)
        costs = dataclasses.replace(costs, accumulate_cpu_s=max(costs.accumulate_cpu_s,
                                                                host_cores / HOST_MEMORY_BYTES_PER_S))
    rate = gbps * 1e9 / 8
    cluster = model.Cluster(hosts=max(1, workers // GPUS_PER_HOST), workers_per_host=per_host, local_sum=local_sum,
                            servers_per_host=changes.get("servers_per_host", 1), out_bytes_per_s=rate,
                            in_bytes_per_s=rate, link_latency_s=25e-6,
                            cores_per_host=changes.get("host_cores", cores))
    alone = base.batch / base.compute_s  # one GPU, no communication
    return model.simulate(cluster, job, costs, steps=3, warmup=1) / (workers * alone)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cores", type=int, default=16, help="cores a host gives psrt's server and sends")
    args = ap.parse_args()
    with open(os.path.join(args.out, "calibration.json")) as f:
        cal = json.load(f)
    curves = {}
    for name in JOBS:
        costs = costs_for(cal, name)
        for gbps in LINKS_GBPS:
            points = [run(costs, name, w, gbps, args.cores) for w in WORKERS]
            curves["%s %d" % (name, gbps)] = points
            print("%-10s %3d Gb/s: %s" % (name, gbps, " ".join("%3d:%.2f" % (w, e) for w, e in zip(WORKERS, points))))
        if job_is_sparse(name):
            continue  # a host's sum of different rows is no smaller
        # A host summing first: as built (shared memory), and on the devices.
        for key, label in (("host_sum", "in shared memory"), ("host_reduce", "on the devices")):
            points = [run(costs, name, w, 100, args.cores, **{key: True}) for w in WORKERS]
            curves["%s 100 %s" % (name, key)] = points
            print("%-10s 100 Gb/s, a host summing first %s: %s" % (
                name, label, " ".join("%3d:%.2f" % (w, e) for w, e in zip(WORKERS, points))))
        if name in ADAM:
            # The servers only sum: as built, the mean goes out once backward
            # ends; in buckets during backward (as DDP and BytePS: not built);
            # and with a host's GPUs summing on the devices, BytePS's whole
            # design (not built).
            for gbps, key, label, changes in SUM_ONLY:
                points = [run(costs, name, w, gbps, args.cores, sum_only=True, **changes) for w in WORKERS]
                curves["%s %d %s" % (name, gbps, key)] = points
                print("%-10s %3d Gb/s, the servers only sum, %s: %s" % (
                    name, gbps, label, " ".join("%3d:%.2f" % (w, e) for w, e in zip(WORKERS, points))))
    needs = []
    for name in JOBS:
        costs = costs_for(cal, name)
        for gbps in LINKS_GBPS:
            found = None
            for label, changes in SETTINGS:
                if job_is_sparse(name) and (changes.get("host_reduce") or changes.get("host_sum")):
                    continue
                e = run(costs, name, 256, gbps, args.cores, **changes)
                if e >= 0.9:
                    found = (label, e)
                    break
            needs.append({"job": name, "gbps": gbps, "setting": found[0] if found else None,
                          "efficiency": found[1] if found else None})
            print("%-10s %3d Gb/s, 256 workers: %s" % (
                name, gbps, "%s (%.2f)" % found if found else "none of the settings reaches 90%"))
    with open(os.path.join(args.out, "predictions.json"), "w") as f:
        json.dump({"workers": WORKERS, "curves": curves, "to_reach_90": needs, "anchors": ANCHORS,
                   "cores_per_host": args.cores, "gpus_per_host": GPUS_PER_HOST}, f, indent=2)
    plot(curves, os.path.join(args.out, "scaling.png"))


def plot(curves, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(JOBS), figsize=(15, 4.6), sharey=True)
    styles = {25: ":", 100: "--", 400: "-"}
    for ax, name in zip(axes, JOBS):
        for gbps in LINKS_GBPS:
            ax.plot(WORKERS, curves["%s %d" % (name, gbps)], styles[gbps], marker="o", label="psrt model, %d Gb/s" % gbps)
        if not job_is_sparse(name):
            ax.plot(WORKERS, curves["%s 100 host_sum" % name], "-.", marker="D", color="dimgrey",
                    label="psrt model, 100 Gb/s, a host summing\nfirst in shared memory (built)")
            ax.plot(WORKERS, curves["%s 100 host_reduce" % name], "-.", marker="s", color="black",
                    label="psrt model, 100 Gb/s, a host's GPUs\nsumming on the devices (not built)")
        markers = iter(["*", "P", "X", "*"])
        for label, gpus, eff, gbps in ANCHORS:
            if ("BERT" in label) == (name == "BERT-large") and name != "DLRM":
                ax.plot([gpus], [eff], marker=next(markers), markersize=11, linestyle="none", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(WORKERS) + [512])
        ax.set_xticklabels([str(w) for w in WORKERS] + ["512"])
        ax.set_title(name)
        ax.set_xlabel("workers (GPUs, 8 a host)")
        ax.set_ylim(0, 1.05)
        ax.axhline(0.9, color="grey", linewidth=0.5)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    axes[0].set_ylabel("scaling efficiency")
    fig.suptitle("psrt, sync SGD: predicted scaling efficiency (model calibrated on this machine) "
                 "and published points")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print("wrote", path)


if __name__ == "__main__":
    main()
