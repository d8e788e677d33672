"""Keras optimizers the servers do not run, run by every worker on the mean
gradient (psrt.keras.DistributedOptimizer's optimizer_on), in a real
2-worker job, each against one process on the mean of the workers'
gradients."""

import os
import tempfile

import numpy as np
import pytest

from jobs import HERE, run_job

CASES = ["amsgrad", "nadam", "ema", "constraint", "fit", "loss_scale"]


@pytest.fixture(scope="module")
def job():
    return run_job(os.path.join(HERE, "tf_worker_optimizer.py"), [",".join(CASES + ["tamper"])])


@pytest.mark.parametrize("case", CASES)
def test_the_workers_step_as_one_process_on_the_mean_gradient(job, case):
    """Adam(amsgrad=True), Nadam, SGD with use_ema, RMSprop with clipnorm
    over a kernel_constraint=NonNeg() (the kernel stays >= 0), Lion through
    model.fit, and Nadam under a LossScaleOptimizer through model.fit: within
    1e-5 of one process."""
    code, log = job
    assert code == 0, log
    for rank in (0, 1):
        assert "rank %d: case %s passed" % (rank, case) in log, log


def test_a_worker_whose_weights_changed_behind_psrts_back_is_named(job):
    code, log = job
    for rank in (0, 1):
        assert "rank %d: case tamper: step 1: " % rank in log, log
        assert "worker 1 holds other weights than worker 0" in log, log
    assert "case tamper: step 0" not in log, log


def test_a_job_restored_from_a_checkpoint_goes_on_as_if_uninterrupted():
    """The checkpoints keep the workers' state once (rank 0's): a job of 4
    steps checkpoints step 3 (every_steps) and step 4 (its final checkpoint,
    with the state rank 0 saves as it exits); a job restored from step 3
    trains step 3 and ends where the first did, bit for bit, and one
    restored from step 4 starts there. Nadam's moments, the EMA's copies,
    the loss scale and every optimizer's step count."""
    script = os.path.join(HERE, "tf_worker_optimizer.py")
    with tempfile.TemporaryDirectory() as d:
        ckpt = {"uri": "file://" + d + "/ckpt", "every_steps": 3}
        code, log = run_job(script, ["--resume", d + "/whole.npz"], {"checkpoint": ckpt})
        assert code == 0, log
        for step in (3, 4):
            assert os.path.isdir("%s/ckpt/step-%012d" % (d, step)), (os.listdir(d + "/ckpt"), log)
        whole = dict(np.load(d + "/whole.npz"))
        for step in (3, 4):
            out = "%s/from%d.npz" % (d, step)
            code, log = run_job(script, ["--resume", out], {"restore": "file://%s/ckpt/step-%012d" % (d, step)})
            assert code == 0, log
            assert "rank 1: from step %d" % step in log, log
            resumed = dict(np.load(out))
            assert sorted(resumed) == sorted(whole)
            for name, value in whole.items():
                np.testing.assert_array_equal(resumed[name], value, err_msg="step %d: %s" % (step, name))
