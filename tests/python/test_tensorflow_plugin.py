"""The TensorFlow plugin in real jobs (psrt.tensorflow, Keras 3)."""

import os

import pytest

from jobs import EXAMPLES, HERE, assert_trained_like, run_job, trained_arrays

tf = pytest.importorskip("tensorflow", reason="tensorflow is not installed (scripts/setup.sh frameworks)")
keras = pytest.importorskip("keras")
import tf_worker  # noqa: E402


def reference(kind, steps, workers):
    """One process, the same Keras optimizer, on the mean gradient."""
    model = tf_worker.build_model(seed=0)
    opt = tf_worker.make_optimizer(kind)
    for step in range(steps):
        grads = []
        for rank in range(workers):
            x, y = tf_worker.batch(step, rank)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x) - y))
            grads.append(tape.gradient(loss, model.trainable_variables))
        mean = [sum(g[i] for g in grads) / workers for i in range(len(grads[0]))]
        opt.apply_gradients(zip(mean, model.trainable_variables))
    return [v.numpy() for v in model.trainable_variables]


# Keras's Adam adds epsilon to sqrt(v) before bias correction, the servers'
# (PyTorch's) after it: the results differ by about epsilon over sqrt(v),
# up to 5e-4 after 10 steps for parameters with tiny gradients.
@pytest.mark.parametrize("kind,eager,atol", [("sgd", False, 1e-5), ("adam", False, 5e-4), ("sgd", True, 1e-5)])
def test_sync_two_workers_equal_one_process_on_the_mean_gradient(kind, eager, atol):
    steps = 10
    got = trained_arrays(os.path.join(HERE, "tf_worker.py"),
                         ["--optimizer", kind, "--steps", str(steps)] + (["--eager"] if eager else []))
    want = reference(kind, steps, 2)
    initial = [v.numpy() for v in tf_worker.build_model(seed=0).trainable_variables]
    assert_trained_like(got, want, initial, atol)


def test_keras_fit_trains_the_digits_to_the_demo_accuracy():
    code, log = run_job(os.path.join(EXAMPLES, "keras_digits.py"), ["--epochs", "12", "--threshold", "0.9"])
    assert code == 0, log
    assert "demo: test accuracy 0." in log, log


def test_unsupported_keras_optimizers_are_refused_clearly():
    import psrt
    from psrt.tensorflow import keras as pkeras
    with pytest.raises(psrt.PsrtError, match="RMSprop cannot run on the parameter servers"):
        pkeras.DistributedOptimizer(keras.optimizers.RMSprop())
    with pytest.raises(psrt.PsrtError, match="clipnorm"):
        pkeras.DistributedOptimizer(keras.optimizers.SGD(clipnorm=1.0))
    assert pkeras._server_optimizer(keras.optimizers.AdamW(1e-3, weight_decay=0.01))["name"] == "adamw"
