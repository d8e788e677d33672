"""Running a real job for the framework plugins' tests: psrt-run over
loopback with this interpreter's training processes."""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("PSRT_BIN_DIR", os.path.join(ROOT, "build", "bin"))
EXAMPLES = os.path.join(ROOT, "examples")


def job_command(script, args, ps=None, hosts=2, token=None):
    dist = {"parameter_server": dict({"enabled": True, "heartbeat_timeout_s": 5}, **(ps or {}))}
    return ([os.path.join(BIN, "psrt-run"), "--local=%d" % hosts, "--distribution=" + json.dumps(dist)] +
            (["--token=" + token] if token else []) + ["--", sys.executable, script] + list(args))


def run_job(script, args, ps=None, hosts=2, timeout=240):
    """Runs `script` (a path) with `args` as every worker of a local job;
    returns (exit code, combined output)."""
    p = subprocess.run(job_command(script, args, ps, hosts), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    return p.returncode, p.stdout


def run_table_job(script, args, hosts):
    """Runs a table worker `script` that writes OUT (rank 0's arrays, .npz)
    and OUT.initialR.npy (rank R's first rows) for --out OUT, on 2 workers
    (hosts 1: one host of 2); returns (rank 0's arrays, every rank's first
    rows)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.npz")
        code, log = run_job(script, list(args) + ["--out", out], ONE_HOST if hosts == 1 else None, hosts)
        assert code == 0, log
        return dict(np.load(out)), [np.load("%s.initial%d.npy" % (out, r)) for r in range(2)]


def failure_text(log, tail=4000):
    """What a failed job's assertion shows: every Python traceback in the
    log (the first failing worker's is often far from the end), then the
    log's last `tail` characters."""
    lines = log.splitlines()
    excerpts = []
    for i, line in enumerate(lines):
        if line.lstrip().startswith("Traceback (most recent call last)"):
            end = i + 1
            while end < len(lines) and lines[end].startswith((" ", "\t")):
                end += 1
            excerpts.append("\n".join(lines[max(0, i - 3):end + 1]))
    return "\n...\n".join(excerpts + [log[-tail:]])


def job_processes(token):
    """{pid: command line} of the live processes whose environment holds the
    job token."""
    needle = ("PSRT_JOB_TOKEN=" + token).encode()
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                found[int(pid)] = f.read().replace(b"\0", b" ").decode()
        except OSError:
            pass
    return found


# Both workers on one host, which sums their gradients before the push
# (docs/runtime.md, "Local aggregation"): run_job(..., ps=ONE_HOST, hosts=1).
ONE_HOST = {"workers_per_host": 2}


def trained_arrays(script, args, ps=None, hosts=2):
    """Runs `script` with `args` plus `--out FILE`, where rank 0 saves its
    final arrays with numpy.savez; returns them in order. A job of several
    workers on a host must say that the host summed first."""
    import tempfile

    import numpy as np
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "final.npz")
        code, log = run_job(script, list(args) + ["--out", out], ps, hosts)
        assert code == 0, log
        if (ps or {}).get("workers_per_host", 1) > 1:
            assert "each host summing first" in log, log
        saved = np.load(out)
        return [saved["arr_%d" % i] for i in range(len(saved.files))]


def shard_order(dataset, workers, rank, epochs):
    """The samples `rank` of `workers` reads over `epochs`, as a
    DistributedSampler (shuffled, seed 0, set_epoch each epoch) deals them."""
    from torch.utils.data import DistributedSampler
    order = []
    for epoch in range(epochs):
        sampler = DistributedSampler(dataset, workers, rank, shuffle=True, seed=0)
        sampler.set_epoch(epoch)
        order += list(sampler)
    return order


def job_reports(script, args, out, workers=2):
    """Runs `script` with `args` and `--out OUT` as every worker of a local
    job; returns each rank's report (`OUT.rankN.json`)."""
    code, log = run_job(script, list(args) + ["--out", out])
    assert code == 0, failure_text(log)
    reports = []
    for r in range(workers):
        with open("%s.rank%d.json" % (out, r)) as f:
            reports.append(json.load(f))
    return reports


def references(script, runs, workers=2):
    """Runs `script` as one process on the global batch of `workers`
    (`--reference WORKERS`) for each of `runs` (argument lists, each with
    its own --out) in turn, in one interpreter through the script's
    main(argv): the framework is imported once, not once per run."""
    name = os.path.splitext(os.path.basename(script))[0]
    argvs = [list(args) + ["--reference", str(workers)] for args in runs]
    driver = ("import json, sys; sys.path.insert(0, %r); import %s as w\n"
              "for argv in json.loads(sys.argv[1]): w.main(argv)" % (os.path.dirname(script), name))
    ref = subprocess.run([sys.executable, "-c", driver, json.dumps(argvs)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=300)
    assert ref.returncode == 0, ref.stdout[-8000:]


def assert_trained_like(got, want, initial, atol):
    """`got` equals `want` array by array within `atol`, and training moved
    the arrays away from `initial` (so the equality says something)."""
    import numpy as np
    assert len(got) == len(want) == len(initial)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=atol)
    assert max(np.abs(g - i).max() for g, i in zip(got, initial)) > 1e-2
