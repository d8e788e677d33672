"""Keras optimizers the servers do not run, run by every worker on the mean
gradient (psrt.keras.DistributedOptimizer's optimizer_on), in a real
2-worker job, each against one process on the mean of the workers'
gradients."""

import os

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
