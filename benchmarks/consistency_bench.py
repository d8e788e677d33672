#!/usr/bin/env python3
"""Loss against wall time for psrt's consistency modes with one slow worker.

Trains the example model (build/bin/psrt-example-linreg, linear regression
with a known exact solution) under ``psrt-run --local=3`` -- three simulated
hosts with one worker and one server each -- once per mode:

    sync (no slow worker)   the baseline
    sync                    rank 2 slowed
    async                   rank 2 slowed
    ssp, staleness 1        rank 2 slowed
    ssp, staleness 3        rank 2 slowed

"Slowed" is the example's ``--slow-rank=2 --slowdown=F``: rank 2 sleeps
(F - 1) times its compute time after computing each gradient. Rank 0 logs
``seconds step loss`` for every step (``--loss-log``); the loss is that of
rank 0's batch at the weights it computed the gradient from, and the seconds
count from rank 0's start of training.

Writes OUT/consistency.json (settings, machine, and per mode: job wall time,
rank 0's training time and steps/s, final loss, time to reach --threshold,
the whole loss curve) and OUT/consistency.png (loss, log scale, against rank
0's training time), and prints a table.

Needs matplotlib: ``scripts/setup.sh python`` makes .venv with it; run this
as ``.venv/bin/python benchmarks/consistency_bench.py --build build``.
"""

import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time

TAIL_LINES = 40


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--build", default="build",
                   help="CMake build directory holding bin/psrt-run")
    p.add_argument("--out", default=None,
                   help="output directory; BUILD/bench if not given")
    p.add_argument("--hosts", type=int, default=3,
                   help="simulated hosts (psrt-run --local), 1 worker and "
                        "1 server each")
    p.add_argument("--dim", type=int, default=512, help="features")
    p.add_argument("--batch", type=int, default=96,
                   help="samples per step and worker")
    p.add_argument("--steps", type=int, default=1200,
                   help="training steps (per worker)")
    p.add_argument("--lr", type=float, default=0.025,
                   help="SGD learning rate")
    p.add_argument("--slow-rank", type=int, default=2,
                   help="the worker that is slowed")
    p.add_argument("--slowdown", type=float, default=3.0,
                   help="how many times slower the slowed worker computes")
    p.add_argument("--threshold", type=float, default=1e-6,
                   help="report the time until rank 0's loss first drops "
                        "below this")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds each training job may take")
    p.add_argument("--modes", default=None,
                   help="comma-separated runs to do, of baseline, sync, "
                        "async, ssp1, ssp3; all if not given")
    return p.parse_args(argv)


def runs(args):
    """(key, label, distribution keys, slowed) for every run, in order."""
    all_runs = [
        ("baseline", "sync, no slow worker", {"mode": "sync"}, False),
        ("sync", "sync", {"mode": "sync"}, True),
        ("async", "async", {"mode": "async"}, True),
        ("ssp1", "ssp, staleness 1", {"mode": "ssp", "staleness": 1}, True),
        ("ssp3", "ssp, staleness 3", {"mode": "ssp", "staleness": 3}, True),
    ]
    if args.modes is None:
        return all_runs
    wanted = [m.strip() for m in args.modes.split(",") if m.strip()]
    known = {r[0] for r in all_runs}
    unknown = [m for m in wanted if m not in known]
    if unknown:
        sys.exit("consistency_bench: unknown --modes %s; known: %s"
                 % (", ".join(unknown), ", ".join(sorted(known))))
    return [r for r in all_runs if r[0] in wanted]


def tail(text, lines=TAIL_LINES):
    return "\n".join(text.splitlines()[-lines:])


def run_job(cmd, timeout):
    """Runs cmd in its own process group; returns (rc, seconds, output).

    rc is None when the job ran past timeout; its process group is then
    stopped (SIGTERM, then SIGKILL).
    """
    start = time.monotonic()
    with tempfile.TemporaryFile(mode="w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
            for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
        seconds = time.monotonic() - start
        out.seek(0)
        return rc, seconds, out.read()


def read_loss_log(path):
    """[(seconds, step, loss), ...] from rank 0's --loss-log file."""
    curve = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3:
                curve.append((float(parts[0]), int(parts[1]),
                              float(parts[2])))
    return curve


def final_losses(output):
    """{rank: (loss, relative error)} from 'rank N final loss X ...' lines."""
    result = {}
    for line in output.splitlines():
        parts = line.split()
        if (len(parts) == 8 and parts[0] == "rank" and parts[2:4] ==
                ["final", "loss"] and parts[5:7] == ["relative", "error"]):
            try:
                result[int(parts[1])] = (float(parts[4]), float(parts[7]))
            except ValueError:
                pass
    return result


def measure(args, bin_dir, key, label, dist, slowed, work):
    distribution = {"parameter_server": dict(
        {"enabled": True, "servers_per_host": 1, "workers_per_host": 1},
        **dist)}
    loss_log = os.path.join(work, key + ".loss")
    if os.path.exists(loss_log):
        os.remove(loss_log)  # the example appends
    cmd = [os.path.join(bin_dir, "psrt-run"), "--local=%d" % args.hosts,
           "--distribution=" + json.dumps(distribution), "--",
           os.path.join(bin_dir, "psrt-example-linreg"),
           "--dim=%d" % args.dim, "--batch=%d" % args.batch,
           "--steps=%d" % args.steps, "--lr=%g" % args.lr,
           "--log-every=%d" % max(args.steps, 1), "--loss-log=" + loss_log]
    if slowed:
        cmd += ["--slow-rank=%d" % args.slow_rank,
                "--slowdown=%g" % args.slowdown]
    print("consistency_bench: %s ..." % label, flush=True)
    rc, wall, output = run_job(cmd, args.timeout)
    entry = {"name": key, "label": label, "slowed": slowed,
             "distribution": distribution, "command": cmd,
             "job_wall_s": round(wall, 3)}
    error = None
    if rc is None:
        error = "timed out after %.0f s" % args.timeout
    elif rc != 0:
        error = "psrt-run exited with code %d" % rc
    curve = read_loss_log(loss_log) if os.path.exists(loss_log) else []
    if error is None and not curve:
        error = "rank 0 wrote no loss log (%s)" % loss_log
    if error is not None:
        entry["error"] = error
        entry["output_tail"] = tail(output)
        print("consistency_bench: %s: %s; last lines of its output:\n%s"
              % (label, error, tail(output)), file=sys.stderr, flush=True)
        return entry

    train_s = curve[-1][0]
    steps_done = curve[-1][1] + 1
    finals = final_losses(output)
    reached = next(((t, s) for t, s, loss in curve
                    if loss < args.threshold), None)
    final_loss, final_error = finals.get(0, (curve[-1][2], None))
    first_loss = curve[0][2]
    entry.update({
        "rank0_train_s": round(train_s, 3),
        "rank0_steps": steps_done,
        "steps_per_s": round(steps_done / train_s, 2) if train_s > 0 else None,
        "first_loss": first_loss,
        "final_loss": final_loss,
        "final_relative_error": final_error,
        "final_loss_per_rank": {str(r): v[0]
                                for r, v in sorted(finals.items())},
        "orders_of_magnitude": (round(math.log10(first_loss / final_loss), 1)
                                if final_loss > 0 and first_loss > 0
                                else None),
        "time_to_threshold_s": round(reached[0], 3) if reached else None,
        "step_to_threshold": reached[1] if reached else None,
        "loss_curve": {"seconds": [c[0] for c in curve],
                       "step": [c[1] for c in curve],
                       "loss": [c[2] for c in curve]},
    })
    return entry


def machine():
    info = {"host": platform.node(), "nproc": os.cpu_count(),
            "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


def loadavg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def print_table(results, threshold):
    head = ("mode", "job s", "rank0 s", "steps/s",
            "s to loss<%g" % threshold, "final loss")
    rows = []
    for r in results:
        if "error" in r:
            rows.append((r["label"], fmt(r["job_wall_s"], ".1f"), "failed",
                         "", "", r["error"]))
            continue
        rows.append((r["label"], fmt(r["job_wall_s"], ".1f"),
                     fmt(r["rank0_train_s"], ".1f"),
                     fmt(r["steps_per_s"], ".0f"),
                     fmt(r["time_to_threshold_s"], ".2f"),
                     fmt(r["final_loss"], ".2e")))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]

    def line(cells):
        return "  ".join((str(c).ljust(w) if i == 0 else str(c).rjust(w))
                         for i, (c, w) in enumerate(zip(cells, widths)))

    print(line(head))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))


def plot(results, args, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    styles = {"baseline": dict(color="black", linestyle="--"),
              "sync": dict(color="tab:blue"),
              "async": dict(color="tab:red"),
              "ssp1": dict(color="tab:green"),
              "ssp3": dict(color="tab:purple")}
    for r in results:
        if "error" in r:
            continue
        c = r["loss_curve"]
        ax.plot(c["seconds"], c["loss"], linewidth=1.3,
                label="%s (rank 0 done at %.1f s)"
                % (r["label"], r["rank0_train_s"]),
                **styles.get(r["name"], {}))
    ax.axhline(args.threshold, color="gray", linestyle=":", linewidth=1,
               label="threshold %g" % args.threshold)
    ax.set_yscale("log")
    ax.set_xlabel("wall time since rank 0 started training (s)")
    ax.set_ylabel("rank 0 batch loss (MSE / 2, log scale)")
    ax.set_title("psrt linear regression: %d workers, rank %d slowed %gx "
                 "(baseline: none slowed)\ndim %d, batch %d, %d steps, "
                 "SGD lr %g" % (args.hosts, args.slow_rank, args.slowdown,
                                args.dim, args.batch, args.steps, args.lr),
                 fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    if args.slowdown < 1:
        sys.exit("consistency_bench: --slowdown must be >= 1")
    if not 0 <= args.slow_rank < args.hosts:
        sys.exit("consistency_bench: --slow-rank must be in 0..%d"
                 % (args.hosts - 1))
    out_dir = args.out or os.path.join(args.build, "bench")
    bin_dir = os.path.abspath(os.path.join(args.build, "bin"))
    for exe in ("psrt-run", "psrt-example-linreg", "psrt-server",
                "psrt-coordinator", "psrt-worker"):
        if not os.access(os.path.join(bin_dir, exe), os.X_OK):
            sys.exit("consistency_bench: %s/%s is missing; build it with: "
                     "ninja -C %s" % (bin_dir, exe, args.build))
    if importlib.util.find_spec("matplotlib") is None:
        sys.exit("consistency_bench: matplotlib is missing; run "
                 "scripts/setup.sh python and use .venv/bin/python")
    os.makedirs(out_dir, exist_ok=True)

    load_before = loadavg()
    started = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory(prefix="psrt-consistency-") as work:
        for key, label, dist, slowed in runs(args):
            results.append(measure(args, bin_dir, key, label, dist, slowed,
                                   work))
    total = time.monotonic() - started

    report = {
        "benchmark": "consistency_bench",
        "date_utc": datetime.datetime.now(datetime.timezone.utc)
        .strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": dict(machine(), loadavg_before=load_before,
                        loadavg_after=loadavg()),
        "settings": {"hosts": args.hosts, "workers_per_host": 1,
                     "servers_per_host": 1, "dim": args.dim,
                     "batch": args.batch, "steps": args.steps,
                     "lr": args.lr, "optimizer": "sgd",
                     "slow_rank": args.slow_rank, "slowdown": args.slowdown,
                     "threshold": args.threshold, "timeout_s": args.timeout},
        "total_s": round(total, 1),
        "runs": results,
    }
    json_path = os.path.join(out_dir, "consistency.json")
    with open(json_path, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    png_path = os.path.join(out_dir, "consistency.png")
    plot(results, args, png_path)

    print()
    print("%d workers, rank %d slowed %gx; dim %d, batch %d, %d steps, lr %g"
          % (args.hosts, args.slow_rank, args.slowdown, args.dim, args.batch,
             args.steps, args.lr))
    print_table(results, args.threshold)
    print("total %.0f s; reports: %s, %s" % (total, json_path, png_path))
    failed = [r["label"] for r in results if "error" in r]
    if failed:
        print("consistency_bench: failed: %s" % ", ".join(failed),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
