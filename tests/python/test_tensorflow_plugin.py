"""The TensorFlow plugin in real jobs (psrt.tensorflow, Keras 3)."""

import json
import os
import re
import tempfile

import numpy as np
import pytest

from jobs import (EXAMPLES, HERE, ONE_HOST, assert_trained_like, failure_text, run_job,
                  trained_arrays)

# TensorFlow's oneDNN kernels round float16 differently by CPU (AVX-512 FP16
# against AVX2), and mixed-precision training grows a rounding difference
# past the tolerance within a few steps. Off for this process (the reference)
# and, through the environment, for the job's workers: both then run the
# same arithmetic, and what the tests compare is psrt's part.
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
tf = pytest.importorskip("tensorflow", reason="tensorflow is not installed (scripts/setup.sh frameworks)")
keras = pytest.importorskip("keras")
import tf_worker  # noqa: E402


def reference(steps, workers, kind="sgd", model="mlp", clip=None, mixed=False, fit=False, loss_scale_factor=None,
              tape_clip=None, aggregation="mean"):
    """One process, the same Keras optimizer, on the mean gradient over the
    workers' batches; BatchNormalization's statistics are the mean of what
    each worker's forward pass makes of them. Returns what tf_worker saves
    and the number of steps the loss scale skipped."""
    if mixed:
        keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        net = tf_worker.build_model(seed=0, model=model, mixed=mixed)
        opt = tf_worker.make_optimizer(kind, clip, loss_scale_factor=loss_scale_factor)
        if mixed:
            # model.compile's own LossScaleOptimizer keeps Keras's defaults.
            opt = (keras.optimizers.LossScaleOptimizer(opt) if fit else
                   tf_worker.make_optimizer(kind, clip, mixed=True))
        moving = [v for v in net.non_trainable_variables if v.path.endswith(("moving_mean", "moving_variance"))]
        skipped = 0
        for step in range(steps):
            start = [v.numpy() for v in moving]
            grads, stats = [], []
            for rank in range(workers):
                for v, s in zip(moving, start):
                    v.assign(s)
                x, y = tf_worker.batch(step, rank, model, mixed)
                with tf.GradientTape() as tape:
                    loss = opt.scale_loss(tf.reduce_mean(tf.square(net(x, training=True) - y)))
                grads.append(tape.gradient(loss, net.trainable_variables))
                stats.append([v.numpy() for v in moving])
            for i, v in enumerate(moving):
                v.assign(sum(s[i] for s in stats) / np.float32(workers))
            # A gradient no worker had stays None (Keras skips the variable).
            divide = workers if aggregation == "mean" else 1
            mean = [None if all(g[i] is None for g in grads) else
                    sum(g[i] for g in grads if g[i] is not None) / divide for i in range(len(grads[0]))]
            if tape_clip:
                mean, _ = tf.clip_by_global_norm(mean, tape_clip)
            if mixed and not all(np.isfinite(g.numpy()).all() for g in mean if g is not None):
                skipped += 1
            opt.apply_gradients(zip(mean, net.trainable_variables))
        return tf_worker.saved(net, opt), skipped
    finally:
        keras.mixed_precision.set_global_policy("float32")


def initial(model="mlp", mixed=False):
    net = tf_worker.build_model(seed=0, model=model, mixed=mixed)
    return tf_worker.saved(net, None) + ([np.array(tf_worker.MIXED_SCALE), np.array(0.0)] if mixed else [])


def trained_in_one_job(cases, ps=None):
    """{case: rank 0's final arrays}, `cases` ({case: its tf_worker.py
    arguments}) trained one after the other in one job of two workers
    (tf_worker.py --configs, each case's variables its own keys): a job's
    time is mostly its workers' start and TensorFlow's import."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "final")
        configs = json.dumps(list(cases.values()))
        code, log = run_job(os.path.join(HERE, "tf_worker.py"), ["--configs", configs, "--out", out], ps, 2,
                            timeout=600)
        assert code == 0, failure_text(log)
        got = {}
        for i, case in enumerate(cases):
            saved = np.load("%s.c%d.npz" % (out, i))
            got[case] = [saved["arr_%d" % k] for k in range(len(saved.files))]
        return got


# Keras's Adam adds epsilon to sqrt(v) before bias correction, the servers'
# (PyTorch's) after it: the results differ by about epsilon over sqrt(v),
# up to 5e-4 after 10 steps for parameters with tiny gradients. A fixed
# loss_scale_factor scales the loss; the gradients are unscaled before the
# push. The four cases train one after the other in one job.
SYNC = [("sgd", False, 1e-5, None), ("adam", False, 5e-4, None), ("sgd", True, 1e-5, None),
        ("sgd", False, 1e-5, 1024.0)]
SYNC_STEPS = 10


@pytest.fixture(scope="module")
def sync_trained():
    return trained_in_one_job({
        (kind, eager, atol, factor): ["--optimizer", kind, "--steps", str(SYNC_STEPS)] +
        (["--eager"] if eager else []) + (["--loss-scale-factor", str(factor)] if factor else [])
        for kind, eager, atol, factor in SYNC})


@pytest.mark.parametrize("kind,eager,atol,factor", SYNC)
def test_sync_two_workers_equal_one_process_on_the_mean_gradient(kind, eager, atol, factor,
                                                                 sync_trained):
    got = sync_trained[(kind, eager, atol, factor)]
    want, _ = reference(SYNC_STEPS, 2, kind, loss_scale_factor=factor)
    assert_trained_like(got, want, initial(), atol)


# Real models' layers: self-attention; BatchNormalization, whose moving
# statistics must be the mean of the workers' (each worker's own differ);
# a frozen keras.applications backbone whose weights every worker draws
# from its own seed, so that they must become rank 0's (as the trainable
# ones do). The statistics and the backbone are among the arrays compared.
# The three cases train one after the other in one job.
REAL = [("mha", False, 1e-5), ("bn", True, 1e-5), ("frozen", False, 1e-5)]
REAL_STEPS = 6


@pytest.fixture(scope="module")
def real_trained():
    return trained_in_one_job({
        (model, fit, atol): ["--model", model, "--steps", str(REAL_STEPS), "--backbone-seed", "-1"]
        + (["--fit"] if fit else []) for model, fit, atol in REAL})


@pytest.mark.parametrize("model,fit,atol", REAL)
def test_sync_two_workers_on_real_layers_equal_one_process(model, fit, atol, real_trained):
    got = real_trained[(model, fit, atol)]
    want, _ = reference(REAL_STEPS, 2, model=model, fit=fit)
    assert_trained_like(got, want, initial(model), atol)


FEATURE_STEPS = 6


@pytest.fixture(scope="module")
def features_trained():
    """The variable without a gradient's case and the clip after a
    DistributedGradientTape's, one after the other in one job."""
    return trained_in_one_job({
        "unused": ["--model", "unused", "--optimizer", "adamw", "--steps", str(FEATURE_STEPS)],
        "tape_clip": ["--tape-clip", "0.05", "--steps", str(FEATURE_STEPS)]})


# A head without a gradient at every step and AdamW excluding the biases
# from weight decay: Keras leaves the head alone (no decay either) and
# decays the kernels only; so must the servers. (Keras's Adam puts epsilon
# elsewhere than the servers, hence 5e-4, as above.)
def test_a_variable_without_a_gradient_and_excluded_from_weight_decay_train_as_in_one_process(
        features_trained):
    steps = FEATURE_STEPS
    got = features_trained["unused"]
    want, _ = reference(steps, 2, kind="adamw", model="unused")
    start = initial("unused")
    assert_trained_like(got, want, start, 5e-4)
    # The head is where it started, as one process leaves it.
    head = [i for i, w in enumerate(want) if w.shape == (16, 1) and np.array_equal(w, start[i])]
    assert head, "the reference moved the unused head"
    # Decaying the biases too would end elsewhere.
    keras_decays_all = reference(steps, 2, kind="adamw-all", model="unused")[0]
    assert max(np.abs(a - b).max() for a, b in zip(keras_decays_all, want)) > 2e-3


# Servers that sum (gradient_aggregation "sum", MXNet's way): the model
# takes the sum of the workers' gradients, and BatchNormalization's
# statistics are still the workers' mean, in model.fit and in a custom loop
# with a clip (the mean gradients' round trip). The two cases train one
# after the other in one job.
SUMS = [(True, None), (False, "global_clipnorm=0.3")]


@pytest.fixture(scope="module")
def sum_trained():
    return trained_in_one_job({
        (fit, clip): ["--model", "bn", "--steps", "4"] + (["--fit"] if fit else ["--clip", clip])
        for fit, clip in SUMS}, {"gradient_aggregation": "sum"})


@pytest.mark.parametrize("fit,clip", SUMS)
def test_servers_that_sum_give_keras_the_summed_gradient_and_the_mean_statistics(fit, clip,
                                                                                 sum_trained):
    steps = 4
    got = sum_trained[(fit, clip)]
    want, _ = reference(steps, 2, model="bn", fit=fit, clip=clip, aggregation="sum")
    assert_trained_like(got, want, initial("bn"), 1e-5)


# A constraint Keras applies after each update cannot reach the servers'
# weights: refused when the optimizer builds, naming the variable.
def test_a_constrained_variable_is_refused_with_the_reason():
    with tempfile.TemporaryDirectory() as d:
        code, log = run_job(os.path.join(HERE, "tf_worker.py"),
                            ["--model", "nonneg", "--steps", "2", "--out", os.path.join(d, "x.npz")], None, 2)
    assert code != 0
    assert "has a constraint (kernel_constraint, bias_constraint, ...)" in log, log


# One host of two workers summing first: the same training.
def test_one_host_summing_first_equals_one_process():
    steps = 6
    got = trained_arrays(os.path.join(HERE, "tf_worker.py"),
                         ["--model", "bn", "--steps", str(steps), "--backbone-seed", "-1", "--fit"],
                         ONE_HOST, hosts=1)
    want, _ = reference(steps, 2, model="bn", fit=True)
    assert_trained_like(got, want, initial("bn"), 1e-5)


# Clipping applies to the mean gradient, as one process clips it; the
# bounds are below the gradients' size, so every step clips (clipping each
# worker's own gradient, or none, gives other weights).
CLIPS = ["global_clipnorm=0.3", "clipnorm=0.1", "clipvalue=0.02"]
CLIP_STEPS = 8
MIXED_STEPS = 10


@pytest.fixture(scope="module")
def clip_and_mixed_trained():
    """The two mixed precision cases, then the three clips, in one job: the
    clips run under float32 again (a mixed_float16 policy left behind would
    put them past their tolerance)."""
    cases = {("mixed", fit): ["--mixed", "--steps", str(MIXED_STEPS)] + (["--fit"] if fit else [])
             for fit in (False, True)}
    cases.update({("clip", clip): ["--clip", clip, "--steps", str(CLIP_STEPS)] for clip in CLIPS})
    return trained_in_one_job(cases)


@pytest.mark.parametrize("clip", CLIPS)
def test_sync_two_workers_clip_the_mean_gradient(clip, clip_and_mixed_trained):
    steps = CLIP_STEPS
    got = clip_and_mixed_trained[("clip", clip)]
    want, _ = reference(steps, 2, clip=clip)
    unclipped, _ = reference(steps, 2)
    assert max(np.abs(w - u).max() for w, u in zip(want, unclipped)) > 1e-2
    assert_trained_like(got, want, initial(), 1e-5)


# A custom loop that clips after the tape clips the mean gradient where the
# tape is a DistributedGradientTape (as with Horovod's); clipping each
# worker's own gradient ends elsewhere. Trained in the job of the variable
# without a gradient.
def test_a_clip_after_a_distributed_gradient_tape_clips_the_mean_gradient(features_trained):
    steps = FEATURE_STEPS
    got = features_trained["tape_clip"]
    want, _ = reference(steps, 2, tape_clip=0.05)
    unclipped, _ = reference(steps, 2)
    assert max(np.abs(w - u).max() for w, u in zip(want, unclipped)) > 1e-2
    assert_trained_like(got, want, initial(), 1e-5)


# mixed_float16 with a LossScaleOptimizer, given explicitly or added by
# model.compile: rank 1's gradients are 10 times rank 0's, so at some loss
# scales only rank 1's overflow. One process on the mean skips those steps
# (the mean is not finite); so must both workers, with the same loss scale
# after (the last two arrays: the scale and the number of applied steps).
@pytest.mark.parametrize("fit", [False, True])
def test_sync_two_workers_mixed_precision_skip_steps_together(fit, clip_and_mixed_trained):
    steps = MIXED_STEPS
    got = clip_and_mixed_trained[("mixed", fit)]
    want, skipped = reference(steps, 2, mixed=True, fit=fit)
    assert 0 < skipped < steps - 2
    assert float(want[-1]) == steps - skipped
    assert float(got[-2]) == float(want[-2]) and float(got[-1]) == float(want[-1])
    # float16 forward passes: the weights agree to float16's precision.
    assert_trained_like(got[:-2], want[:-2], initial(mixed=True)[:-2], 1e-3)


# Async and ssp: no step-wide mean exists, so each worker clips its own
# gradient and BatchNormalization's statistics are the last pushed; the
# model still learns its two fixed batches per worker: in 40 Adam steps the
# loss falls below half (measured: to 0.08-0.23 of the first steps').
@pytest.mark.parametrize("mode", [{"mode": "async"}, {"mode": "ssp", "staleness": 1}])
def test_async_and_ssp_learn_with_clipping_and_batch_norm(mode):
    with tempfile.TemporaryDirectory() as d:
        code, log = run_job(os.path.join(HERE, "tf_worker.py"),
                            ["--model", "bn", "--optimizer", "adam", "--clip", "global_clipnorm=1.0", "--fixed",
                             "--steps", "40", "--out", os.path.join(d, "final.npz")], ps=mode)
    assert code == 0, log
    found = re.findall(r"rank (\d) loss first ([\d.]+) last ([\d.]+)", log)
    assert sorted(r for r, _, _ in found) == ["0", "1"], log
    for _, first, last in found:
        assert float(last) < 0.5 * float(first), log


def test_keras_fit_trains_the_digits_to_the_demo_accuracy():
    code, log = run_job(os.path.join(EXAMPLES, "keras_digits.py"), ["--epochs", "12", "--threshold", "0.9"])
    assert code == 0, log
    assert "demo: test accuracy 0." in log, log


def test_unsupported_keras_optimizers_are_refused_clearly():
    import psrt
    from psrt.tensorflow import keras as pkeras
    with pytest.raises(psrt.PsrtError, match="RMSprop cannot run on the parameter servers"):
        pkeras.DistributedOptimizer(keras.optimizers.RMSprop())
    with pytest.raises(psrt.PsrtError, match="gradient_accumulation_steps is not supported"):
        pkeras.DistributedOptimizer(keras.optimizers.SGD(gradient_accumulation_steps=2))
    with pytest.raises(psrt.PsrtError, match="the optimizer is distributed already"):
        pkeras.DistributedOptimizer(pkeras.DistributedOptimizer(keras.optimizers.SGD()))
    # Clipping and loss scaling are taken (they run on the mean gradient).
    assert pkeras.DistributedOptimizer(keras.optimizers.SGD(global_clipnorm=1.0)).global_clipnorm == 1.0
    lso = pkeras.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()))
    assert isinstance(lso, keras.optimizers.LossScaleOptimizer)
    assert isinstance(lso.inner_optimizer, keras.optimizers.Adam)
    assert pkeras._server_optimizer(keras.optimizers.AdamW(1e-3, weight_decay=0.01))["name"] == "adamw"
