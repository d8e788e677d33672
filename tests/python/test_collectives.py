"""psrt's collectives for the user's own tensors (psrt.torch.allreduce and
the rest, psrt.tensorflow's, MetricAverageCallback) in real 2-worker jobs."""

import os

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


def test_collectives_are_refused_where_the_membership_can_change():
    code, log = run_job(SCRIPT, ["--refuse"], {"mode": "async"})
    assert code == 0, log
    for rank in (0, 1):
        assert ("rank %d: refusal: psrt collectives need every worker: FAILED_PRECONDITION: a sum over the "
                "job's workers needs every worker's push in each step; the job's mode is async" % rank) in log, log
