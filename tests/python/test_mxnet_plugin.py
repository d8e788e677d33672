"""The MXNet plugin (kvstore "psrt") in real jobs; runs in .venv-mxnet."""

import os

import pytest

from jobs import EXAMPLES, HERE, assert_trained_like, run_job, trained_arrays

mx = pytest.importorskip("mxnet", reason="mxnet is not installed (scripts/setup.sh frameworks makes .venv-mxnet)")
from mxnet import autograd, gluon  # noqa: E402
import mx_worker  # noqa: E402


def reference(kind, steps, workers):
    """One process, the same Gluon optimizer (no kvstore), on the mean of the
    workers' gradients at the same weights."""
    net = mx_worker.build_net(seed=0)
    name, params = mx_worker.OPTIMIZERS[kind]
    trainer = gluon.Trainer(net.collect_params(), name, params, kvstore=None)
    loss_fn = gluon.loss.L2Loss()
    for step in range(steps):
        grads = []
        for rank in range(workers):
            x, y = mx_worker.batch(step, rank)
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            grads.append([p.grad().copy() for p in net.collect_params().values()])
        for i, p in enumerate(net.collect_params().values()):
            p.grad()[:] = sum(g[i] for g in grads) / workers
        trainer.step(16)
    return [p.data().asnumpy() for p in net.collect_params().values()]


# MXNet's Adam, like Keras's, adds epsilon before bias correction.
@pytest.mark.parametrize("kind,atol", [("sgd", 1e-5), ("adam", 1e-4)])
def test_sync_two_workers_equal_one_process_on_the_mean_gradient(kind, atol):
    steps = 10
    got = trained_arrays(os.path.join(HERE, "mx_worker.py"), ["--optimizer", kind, "--steps", str(steps)])
    want = reference(kind, steps, 2)
    initial = [p.data().asnumpy() for p in mx_worker.build_net(seed=0).collect_params().values()]
    assert_trained_like(got, want, initial, atol)


def test_gluon_trains_the_digits_to_the_demo_accuracy():
    code, log = run_job(os.path.join(EXAMPLES, "gluon_digits.py"), ["--epochs", "12", "--threshold", "0.9"])
    assert code == 0, log
    assert "demo: test accuracy 0." in log, log


def test_unsupported_optimizers_and_foreign_states_are_refused_clearly():
    import psrt
    import psrt.mxnet as pmx
    with pytest.raises(psrt.PsrtError, match="RMSProp cannot run on the parameter servers"):
        pmx._server_optimizer(mx.optimizer.RMSProp())
    with pytest.raises(psrt.PsrtError, match="clip_gradient"):
        pmx._server_optimizer(mx.optimizer.SGD(clip_gradient=1.0))
    assert pmx._server_optimizer(mx.optimizer.NAG(momentum=0.9))["nesterov"] is True


def test_kvstore_api_init_push_pull_pushpull():
    code, log = run_job(os.path.join(HERE, "mx_kv_worker.py"), [])
    assert code == 0, log
    assert log.count("kvstore checks passed") == 2, log
