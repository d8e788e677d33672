#!/usr/bin/env python3
"""What a server joining and one leaving cost a running sync job ("max_servers"):
the example trainer on 2 hosts, once with its servers fixed and once with
server 2 joining (started by hand) and server 0 removed (psrt-ckpt
remove-server) while it trains, for models of several sizes, measured in this
run. Reports the whole job's samples/s of both, each move's time (copy, hand-
over and switch, from the coordinator's log), the longest time between two
steps around the moves against the median step, and that the weights came out
equal. Writes server_moves.json and prints a table.

    python3 benchmarks/server_moves_bench.py --build BUILD --out OUT
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import time

PARTITION = 1 << 18  # 256 KiB keys


def run_job(bin_dir, dim, steps, batch, moves, workdir):
    """One job; with `moves`, server 2 joins at a third of the steps and
    server 0 leaves at two thirds. Returns its figures."""
    dist = {"parameter_server": {"enabled": True, "partition_bytes": PARTITION, "max_servers": 3,
                                 "heartbeat_timeout_s": 5}}
    token = os.urandom(16).hex()
    loss = os.path.join(workdir, "loss")
    log = open(os.path.join(workdir, "log"), "w")
    env = dict(os.environ, PSRT_LOG_LEVEL="info")
    start = time.monotonic()
    job = subprocess.Popen([os.path.join(bin_dir, "psrt-run"), "--local=2", "--token=" + token,
                            "--distribution=" + json.dumps(dist), "--",
                            os.path.join(bin_dir, "psrt-example-linreg"), "--steps=%d" % steps,
                            "--dim=%d" % dim, "--batch=%d" % batch, "--lr=1e-6", "--log-every=1",
                            "--loss-log=" + loss, "--result=" + os.path.join(workdir, "r")],
                           stdout=log, stderr=subprocess.STDOUT, env=env)

    def text():
        with open(os.path.join(workdir, "log")) as f:
            return f.read()

    def wait_step(step):
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                with open(loss) as f:
                    if any(int(line.split()[1]) >= step for line in f if line.strip()):
                        return
            except FileNotFoundError:
                pass
            if job.poll() is not None:
                raise RuntimeError("the job ended early:\n" + text()[-3000:])
            time.sleep(0.02)
        raise RuntimeError("step %d not reached" % step)

    joined = None
    if moves:
        wait_step(1)
        coordinator = re.search(r"coordinator at (\S+)", text()).group(1)
        wait_step(steps // 3)
        joined = subprocess.Popen([os.path.join(bin_dir, "psrt-server"), "--coordinator=" + coordinator,
                                   "--index=2", "--host=127.0.0.1", "--token=" + token],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        wait_step(2 * steps // 3)
        subprocess.run([os.path.join(bin_dir, "psrt-ckpt"), "remove-server", "--coordinator=" + coordinator,
                        "--token=" + token, "--index=0", "--timeout=300"], check=True,
                       stdout=subprocess.DEVNULL, timeout=400)
    code = job.wait(timeout=900)
    seconds = time.monotonic() - start
    if joined is not None:
        joined.wait(timeout=60)
    log.close()
    if code != 0:
        raise RuntimeError("the job failed:\n" + text()[-3000:])
    with open(loss) as f:
        times = [float(line.split()[0]) for line in f if line.strip()]
    gaps = [b - a for a, b in zip(times, times[1:])]
    moved = [float(v) * (1e-3 if u == "ms" else 1)
             for v, u in re.findall(r"serves server \d+'s keys \(moved from server \d+ in ([0-9.]+)(ms|s)", text())]
    with open(os.path.join(workdir, "r.rank0.weights"), "rb") as f:
        weights = f.read()
    return {"samples_per_s": 2 * batch * steps / seconds, "median_step_s": statistics.median(gaps),
            "longest_step_s": max(gaps), "moves_s": moved, "weights": weights}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dims", default="262144,1048576,2097152",
                    help="trainer weights: 1, 4 and 8 MiB (4, 16 and 32 keys of 256 KiB)")
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    bin_dir = os.path.join(args.build, "bin")
    rows = []
    for dim in (int(d) for d in args.dims.split(",")):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            fixed = run_job(bin_dir, dim, args.steps, args.batch, False, a)
            moving = run_job(bin_dir, dim, args.steps, args.batch, True, b)
        rows.append({
            "dim": dim, "model_bytes": 4 * dim, "keys": -(-4 * dim // PARTITION),
            "fixed_samples_per_s": fixed["samples_per_s"], "moving_samples_per_s": moving["samples_per_s"],
            "ratio": moving["samples_per_s"] / fixed["samples_per_s"],
            "move_seconds": moving["moves_s"], "median_step_s": moving["median_step_s"],
            "longest_step_s": moving["longest_step_s"], "fixed_longest_step_s": fixed["longest_step_s"],
            "weights_equal": fixed["weights"] == moving["weights"]})
    print("%10s %6s %12s %12s %6s %18s %10s %12s %12s %7s" % (
        "model", "keys", "fixed smp/s", "moving smp/s", "ratio", "moves (join, leave)", "step med",
        "longest", "fixed longest", "equal"))
    for r in rows:
        print("%8.1fMi %6d %12.1f %12.1f %6.2f %18s %9.1fms %10.0fms %12.0fms %7s" % (
            r["model_bytes"] / 2**20, r["keys"], r["fixed_samples_per_s"], r["moving_samples_per_s"], r["ratio"],
            ", ".join("%.2fs" % s for s in r["move_seconds"]), 1e3 * r["median_step_s"],
            1e3 * r["longest_step_s"], 1e3 * r["fixed_longest_step_s"], r["weights_equal"]))
    with open(os.path.join(args.out, "server_moves.json"), "w") as f:
        json.dump({"partition_bytes": PARTITION, "steps": args.steps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
