"""Optimizers the servers do not run, run by every worker on the mean
gradient (psrt.torch.DistributedOptimizer's optimizer_on), in real 2-worker
jobs: each against one process on the mean of the workers' gradients."""

import os
import signal
import subprocess
import tempfile
import time

import pytest

from jobs import HERE, job_command, job_processes, run_job

torch = pytest.importorskip("torch")

SCRIPT = os.path.join(HERE, "torch_worker_optimizer.py")
CASES = ["rmsprop", "nadam", "lbfgs", "adafactor", "groups", "amsgrad", "bf16", "batchnorm"]


@pytest.fixture(scope="module")
def job():
    return run_job(SCRIPT, ["--cases", ",".join(CASES + ["tamper"])])


@pytest.mark.parametrize("case", CASES)
def test_the_workers_step_as_one_process_on_the_mean_gradient(job, case):
    """RMSprop (centered, momentum), NAdam, LBFGS with its closure,
    transformers' Adafactor, two param groups with their own rates,
    Adam(amsgrad=True), bfloat16 parameters (within bf16's rounding), and a
    BatchNorm model clipped after backward() with optimizer_on="workers":
    within 1e-5 of one process."""
    code, log = job
    assert code == 0, log
    for rank in (0, 1):
        assert "rank %d: case %s passed" % (rank, case) in log, log


def test_a_worker_whose_weights_changed_behind_psrts_back_is_named(job):
    code, log = job
    for rank in (0, 1):
        assert ("rank %d: case tamper: step 1: FAILED_PRECONDITION: worker 1 holds other weights than "
                "worker 0" % rank) in log, log
    assert "case tamper: step 0" not in log, log


@pytest.mark.parametrize("ps,asked,why", [
    ({"mode": "async"}, "auto", "RMSprop cannot run on the parameter servers"),
    ({"mode": "async"}, "workers", "the job's mode is async"),
    ({"checkpoint": {"uri": "file:///tmp/psrt-never", "every_seconds": 600}}, "workers",
     '"checkpoint": "every_seconds" saves at no step the workers know'),
    ({"on_failure": "recover", "checkpoint": {"uri": "file:///tmp/psrt-never", "every_steps": 100}}, "workers",
     '"on_failure": "recover" rolls the servers back to a checkpoint'),
    ({"backup_workers": 1}, "workers", '"backup_workers": 1 completes a step without the 1 slowest'),
])
def test_jobs_that_cannot_keep_the_state_on_the_workers_refuse_it_at_start(ps, asked, why):
    code, log = run_job(SCRIPT, ["--refusal", asked], ps)
    assert code == 0, log
    for rank in (0, 1):
        assert "rank %d: refusal: " % rank in log and why in log, log
    assert "refusal: none" not in log, log


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """A job of 4 steps that checkpoints step 3 (every_steps) and step 4 (its
    final checkpoint, with the state rank 0 saves as it exits): its folder,
    holding ckpt/ and rank 0's final weights (whole.pt)."""
    d = str(tmp_path_factory.mktemp("uninterrupted"))
    code, log = run_job(SCRIPT, ["--resume", d + "/whole.pt"],
                        {"checkpoint": {"uri": "file://" + d + "/ckpt", "every_steps": 3}})
    assert code == 0, log
    for step in (3, 4):
        assert os.path.isdir("%s/ckpt/step-%012d" % (d, step)), (os.listdir(d + "/ckpt"), log)
    return d


def restored_like(whole, root, step, d):
    """Trains a job restored from `root`'s checkpoint of `step` to the end and
    checks that rank 0's weights and buffers are `whole`'s, bit for bit."""
    out = "%s/from%d.pt" % (d, step)
    code, log = run_job(SCRIPT, ["--resume", out], {"restore": "file://%s/ckpt/step-%012d" % (root, step)})
    assert code == 0, log
    assert "rank 1: from step %d" % step in log, log
    resumed = torch.load(out)
    for case in whole:
        for name, value in whole[case].items():
            assert torch.equal(resumed[case][name], value), (step, case, name)


def test_a_job_restored_from_a_checkpoint_goes_on_as_if_uninterrupted(uninterrupted):
    """The checkpoints keep the workers' state once (rank 0's): a job
    restored from step 3 trains step 3 and ends where the uninterrupted one
    did, bit for bit, and one restored from its final step 4 starts there.
    RMSprop's, LBFGS's and momentum's state, BatchNorm's statistics."""
    whole = torch.load(uninterrupted + "/whole.pt")
    with tempfile.TemporaryDirectory() as d:
        for step in (3, 4):
            restored_like(whole, uninterrupted, step, d)


def test_a_lost_server_ends_the_job_saying_so_and_its_last_checkpoint_goes_on(uninterrupted):
    """Where the workers hold the state, a server holds only a step's sum and
    the state's copy of the last checkpoint: a server killed mid-job ends it
    (on_failure "fail": the only choice in this mode), naming the server,
    and a job restored from the last checkpoint (step 3) ends where the
    uninterrupted one does, bit for bit."""
    token = "lost-server-%d" % os.getpid()
    with tempfile.TemporaryDirectory() as d:
        ckpt = {"uri": "file://" + d + "/ckpt", "every_steps": 3}
        run = subprocess.Popen(job_command(SCRIPT, ["--resume", d + "/unused.pt", "--stall-at", "3"],
                                           {"checkpoint": ckpt}, token=token),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            manifest = "%s/ckpt/step-%012d/MANIFEST.json" % (d, 3)
            deadline = time.monotonic() + 120
            while not os.path.exists(manifest):
                assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0]
                time.sleep(0.1)
            servers = [p for p, cmd in job_processes(token).items() if "psrt-server" in cmd and "--index=1" in cmd]
            assert len(servers) == 1, job_processes(token)
            os.kill(servers[0], signal.SIGKILL)
            log = run.communicate(timeout=120)[0]
        finally:
            if run.poll() is None:
                run.kill()
        assert run.returncode != 0, log
        assert "rank 0: stalls at step 3" in log, log
        assert "job failed: server 1 on local1" in log, log
        restored_like(torch.load(uninterrupted + "/whole.pt"), d, 3, d)
