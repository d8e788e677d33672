"""psrt's collectives for the user's own tensors (psrt.torch.allreduce and
the rest, psrt.tensorflow's, MetricAverageCallback) in real 2-worker jobs."""

import os

import pytest

from jobs import HERE, run_job

SCRIPT = os.path.join(HERE, "collectives_worker.py")


def test_torch_and_tensorflow_collectives_give_every_worker_the_same_result():
    """Mean and sum (float32, bfloat16), allgather of int64 beyond 2^24 and
    broadcast of float64 bit for bit, broadcast_object, barrier; Keras's
    logged validation loss averaged by MetricAverageCallback."""
    code, log = run_job(SCRIPT, [])
    assert code == 0, log
    for rank in (0, 1):
        assert "rank %d: collectives passed" % rank in log, log


# Every reason Client::EveryWorkerEachStep gives (psrt.torch.lightning's
# PsrtStrategy refuses such jobs through the same call: test_lightning.py
# checks its message for async).
@pytest.mark.parametrize("ps,why", [
    ({"mode": "async"}, "the job's mode is async"),
    ({"backup_workers": 1}, "\"backup_workers\": 1 completes a step without the 1 slowest"),
    ({"elastic": {"min_workers": 1, "max_workers": 2}}, "\"elastic\": a step takes the workers"),
    ({"on_worker_failure": "continue"}, "\"on_worker_failure\": \"continue\": the steps after"),
])
def test_collectives_are_refused_where_the_membership_can_change(ps, why):
    code, log = run_job(SCRIPT, ["--refuse"], ps)
    assert code == 0, log
    for rank in (0, 1):
        assert ("rank %d: refusal: psrt collectives need every worker: FAILED_PRECONDITION: a sum over the "
                "job's workers needs every worker's push in each step; %s" % (rank, why)) in log, log
