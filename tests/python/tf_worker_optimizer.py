"""A training process of test_tensorflow_worker_optimizer.py: Keras
optimizers the servers do not run, on the workers, against one process on
the mean of the workers' gradients (computed here on every rank from every
rank's batches). Prints "rank R: case C passed" or why not. With
--resume OUT: a job to checkpoint and restore (resume())."""

import sys

import numpy as np
import tensorflow as tf
import keras

import psrt.tensorflow as psrt

WORKERS, STEPS, BATCH = 2, 4, 8


def build(case):
    keras.utils.set_random_seed(0)
    constraint = keras.constraints.NonNeg() if case == "constraint" else None
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(3, kernel_constraint=constraint)])
    opt = {"amsgrad": lambda: keras.optimizers.Adam(0.01, amsgrad=True),
           "nadam": lambda: keras.optimizers.Nadam(0.01),
           "ema": lambda: keras.optimizers.SGD(0.1, momentum=0.9, use_ema=True, ema_momentum=0.5,
                                               ema_overwrite_frequency=2),
           "constraint": lambda: keras.optimizers.RMSprop(0.05, clipnorm=0.1),
           "fit": lambda: keras.optimizers.Lion(0.01),
           "loss_scale": lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Nadam(0.01))}[case]()
    return model, opt


def batch(rank, step):
    g = np.random.default_rng(100 * step + rank)
    return g.normal(size=(BATCH, 6)).astype(np.float32), g.integers(0, 3, BATCH)


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def gradient(model, x, y, opt=None):
    with tf.GradientTape() as tape:
        loss = LOSS(y, model(x, training=True))
        if isinstance(opt, keras.optimizers.LossScaleOptimizer):
            loss = opt.scale_loss(loss)
    return tape.gradient(loss, model.trainable_variables)


def reference(case):
    model, opt = build(case)
    for step in range(STEPS):
        grads = [gradient(model, *batch(r, step), opt) for r in range(WORKERS)]
        opt.apply_gradients(zip([sum(g) / WORKERS for g in zip(*grads)], model.trainable_variables))
    return model


def train(case, rank):
    model, opt = build(case)
    opt = psrt.keras.DistributedOptimizer(opt, model=model)
    if case in ("fit", "loss_scale"):
        model.compile(optimizer=opt, loss=LOSS, jit_compile=False)
        xs, ys = zip(*(batch(rank, s) for s in range(STEPS)))
        model.fit(np.concatenate(xs), np.concatenate(ys), batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    else:
        opt.build(model.trainable_variables)
        for step in range(STEPS):
            opt.apply_gradients(zip(gradient(model, *batch(rank, step)), model.trainable_variables))
    return model, opt


def tamper(rank):
    """A worker's weights changed behind psrt's back: the next check says so."""
    model, opt = build("nadam")
    opt = psrt.keras.DistributedOptimizer(opt, model=model, check_every=1)
    opt.build(model.trainable_variables)
    for step in range(3):
        if step == 1 and rank == 1:
            model.layers[1].bias.assign_add(np.full((3,), 1e-3, np.float32))
        try:
            opt.apply_gradients(zip(gradient(model, *batch(rank, step)), model.trainable_variables))
        except Exception as e:  # noqa: BLE001 (the error comes through TensorFlow's wrapper)
            print("rank %d: case tamper: step %d: %s" % (rank, step, str(e).splitlines()[0]), flush=True)
            return


def resume(rank, out):
    """Nadam, SGD with use_ema and Nadam under a LossScaleOptimizer, each on
    the workers in a custom loop, trained from the job's restored step (0
    when fresh) to STEPS; rank 0 writes every model's and optimizer's
    variables to `out` (.npz)."""
    runs = []
    for case in ("nadam", "ema", "loss_scale"):
        model, opt = build(case)
        opt = psrt.keras.DistributedOptimizer(opt, model=model)
        opt.build(model.trainable_variables)  # a restored job's state arrives here
        runs.append((case, model, opt))
    print("rank %d: from step %d" % (rank, psrt.restored_step()), flush=True)
    for step in range(psrt.restored_step(), STEPS):
        for _, model, opt in runs:
            opt.apply_gradients(zip(gradient(model, *batch(rank, step), opt), model.trainable_variables))
    if rank == 0:
        np.savez(out, **{"%s.%d" % (case, i): keras.ops.convert_to_numpy(v)
                         for case, model, opt in runs for i, v in enumerate(model.weights + opt.variables)})


def main():
    psrt.init()
    rank = psrt.rank()
    if sys.argv[1] == "--resume":
        resume(rank, sys.argv[2])
        return 0
    for case in sys.argv[1].split(","):
        if case == "tamper":
            tamper(rank)
            continue
        (got, opt), want = train(case, rank), reference(case)
        assert getattr(opt, "inner_optimizer", opt)._psrt_on_workers, case
        start, _ = build(case)
        worst = max(np.abs(a.numpy() - b.numpy()).max() for a, b in zip(got.weights, want.weights))
        moved = max(np.abs(a.numpy() - b.numpy()).max() for a, b in zip(start.weights, want.weights))
        ok = worst <= 1e-5 < moved and (case != "constraint" or got.layers[1].kernel.numpy().min() >= 0)
        print("rank %d: case %s %s (%.2g off, moved %.2g)" % (rank, case, "passed" if ok else "FAILED", worst, moved),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
