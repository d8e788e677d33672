#!/usr/bin/env python3
"""Checkpoint write and restore throughput, and the training pause.

A real job (psrt-run --local=1 with two psrt-servers, the example trainer
with Adam over --dim weights, so the servers hold weights and two optimizer
slots) writes its final checkpoint, then a second job restores it. Measured
against baselines of the same bytes in the same run:

  local disk   write: dd if=/dev/zero bs=1M conv=fsync of the same bytes
               restore: dd of the shard files to /dev/null (page cache warm
               for both, as the shards were just written)
  S3 (moto)    write: boto3 upload_fileobj of the same bytes (multipart at
               8 MiB, as psrt), restore: boto3 download of them; moto's
               server from .venv on loopback (skipped without it)

and the longest time a key (4 MiB partitions, the default) was held to copy
it for a checkpoint: what training pauses for. The job checkpoints every
step; "first" is the first checkpoint (the servers allocate their copy
buffers), "write" the last (buffers reused). Writes OUT/checkpoint.json and
prints a table.
"""

import argparse
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def seconds(text):
    """absl::FormatDuration text ("1.5s", "2m3.1s", "30.05ms") in seconds."""
    total = 0.0
    for value, unit in re.findall(r"([0-9.]+)(h|ms|us|ns|m|s)", text):
        total += float(value) * UNITS[unit]
    return total


def run_job(bin_dir, dist, steps, dim, env=None, timeout=600):
    cmd = [os.path.join(bin_dir, "psrt-run"), "--local=1",
           "--distribution=" + json.dumps({"parameter_server": dist}), "--",
           os.path.join(bin_dir, "psrt-example-linreg"), "--dim=%d" % dim,
           "--batch=1", "--optimizer=adam", "--lr=0.001", "--steps=%d" % steps,
           "--log-every=1"]
    start = time.monotonic()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=timeout)
    wall = time.monotonic() - start
    if p.returncode != 0:
        sys.exit("checkpoint_bench: job failed:\n" + p.stdout[-4000:])
    return p.stdout, wall


def parse_commits(log):
    """(bytes, seconds, longest pause) of every committed checkpoint."""
    found = re.findall(r"committed: (\d+) bytes in \d+ shards, \d+ keys, (\S+); "
                       r"longest training pause (\S+)", log)
    if not found:
        sys.exit("checkpoint_bench: no committed checkpoint in:\n" + log[-4000:])
    return [(int(b), seconds(t), seconds(p)) for b, t, p in found]


def parse_restore(log):
    times = [seconds(t) for t in re.findall(r"restored \d+ keys from \S+ \(step \d+\) in (\S+)", log)]
    if not times:
        sys.exit("checkpoint_bench: no restore in:\n" + log[-4000:])
    return max(times)


def dd(args):
    start = time.monotonic()
    subprocess.run(["dd"] + args, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.monotonic() - start


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(bin_dir, uri, dim, steps, env):
    # A checkpoint every step: the first one allocates the servers' copy
    # buffers, later ones reuse them (the steady state).
    ps = {"enabled": True, "servers_per_host": 2, "checkpoint": {"uri": uri, "every_steps": 1}}
    log, wall = run_job(bin_dir, ps, steps, dim, env)
    commits = parse_commits(log)
    ps_restore = dict(ps, restore="latest")
    rlog, _ = run_job(bin_dir, ps_restore, steps, dim, env)
    restore_s = parse_restore(rlog)
    return {"bytes": commits[-1][0], "first_write_s": commits[0][1], "write_s": commits[-1][1],
            "restore_s": restore_s, "pause_s": max(c[2] for c in commits), "job_s": wall,
            "checkpoints": len(commits)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--out", default=None)
    p.add_argument("--dim", type=int, default=8 << 20,
                   help="weights (x3 with Adam's slots: 96 MiB at the default)")
    p.add_argument("--steps", type=int, default=4, help="steps, each checkpointed")
    args = p.parse_args()
    bin_dir = os.path.join(args.build, "bin")
    out = args.out or os.path.join(args.build, "bench")
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="psrt-ckpt-bench-")
    results = {"dim": args.dim, "steps": args.steps}
    try:
        # Local disk.
        root = os.path.join(work, "ckpt")
        local = measure(bin_dir, "file://" + root, args.dim, args.steps, None)
        mib = max(1, local["bytes"] >> 20)
        local["dd_write_s"] = dd(["if=/dev/zero", "of=" + os.path.join(work, "dd"),
                                  "bs=1M", "count=%d" % mib, "conv=fsync"]) * local["bytes"] / (mib << 20)
        shards = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".psrt")]
        local["dd_read_s"] = sum(dd(["if=" + s, "of=/dev/null", "bs=1M"]) for s in shards)
        results["local"] = local

        # S3 through moto's server on loopback.
        root_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        moto = os.path.join(root_dir, ".venv", "bin", "moto_server")
        if os.access(moto, os.X_OK):
            port = free_port()
            server = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(port)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                endpoint = "http://127.0.0.1:%d" % port
                env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing",
                           AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1")
                import boto3
                from boto3.s3.transfer import TransferConfig
                deadline = time.monotonic() + 60
                while True:
                    try:
                        socket.create_connection(("127.0.0.1", port), 1).close()
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.1)
                s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                                  aws_secret_access_key="testing", region_name="us-east-1")
                s3.create_bucket(Bucket="bench")
                r = measure(bin_dir, "s3://bench/ckpt", args.dim, args.steps, env)
                # As many parts in flight as psrt's servers have together
                # (4 each, S3ClientOptions::parallel_parts).
                config = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20,
                                        max_concurrency=8)
                data = os.urandom(1 << 20) * max(1, r["bytes"] >> 20)
                start = time.monotonic()
                s3.upload_fileobj(io.BytesIO(data), "bench", "baseline", Config=config)
                r["boto3_put_s"] = (time.monotonic() - start) * r["bytes"] / len(data)
                start = time.monotonic()
                s3.download_fileobj("bench", "baseline", io.BytesIO(), Config=config)
                r["boto3_get_s"] = (time.monotonic() - start) * r["bytes"] / len(data)
                results["s3"] = r
            finally:
                server.terminate()
                server.wait()
        else:
            results["s3"] = {"skipped": "no " + moto + " (scripts/setup.sh s3)"}
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def gbps(nbytes, s):
        return nbytes / s / 1e9 if s > 0 else float("inf")

    print("%-6s %10s %12s %12s %12s %12s %12s %12s" % (
        "where", "MB", "first GB/s", "write GB/s", "vs base", "restore GB/s", "vs base", "max pause"))
    for where, base_w, base_r in (("local", "dd_write_s", "dd_read_s"), ("s3", "boto3_put_s", "boto3_get_s")):
        r = results.get(where, {})
        if "bytes" not in r:
            print("%-6s %s" % (where, r.get("skipped", "not run")))
            continue
        r["write_vs_baseline"] = r[base_w] / r["write_s"]
        r["restore_vs_baseline"] = r[base_r] / r["restore_s"]
        print("%-6s %10.1f %12.3f %12.3f %11.2fx %12.3f %11.2fx %10.3fms" % (
            where, r["bytes"] / 1e6, gbps(r["bytes"], r["first_write_s"]), gbps(r["bytes"], r["write_s"]),
            r["write_vs_baseline"],
            gbps(r["bytes"], r["restore_s"]), r["restore_vs_baseline"], r["pause_s"] * 1e3))
    with open(os.path.join(out, "checkpoint.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("checkpoint_bench: wrote", os.path.join(out, "checkpoint.json"))


if __name__ == "__main__":
    main()
