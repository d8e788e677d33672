"""A TensorFlow training process for the plugin's tests, started by psrt-run.

A small Keras MLP on random regression data, rank r's batch at step s drawn
from seed (s, r), trained in a custom loop (tf.function by default, or eager)
through psrt.keras.DistributedOptimizer. Rank 0 writes the final variables
(numpy .npz) to --out.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import psrt.tensorflow as psrt  # noqa: E402


def build_model(seed):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="tanh")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


def batch(step, rank, n=16):
    rng = np.random.default_rng(step * 1000 + rank)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    return x, np.sin(x.sum(axis=1, keepdims=True))


def make_optimizer(kind):
    if kind == "sgd":
        return keras.optimizers.SGD(learning_rate=0.1, momentum=0.9, nesterov=True)
    if kind == "adam":
        return keras.optimizers.Adam(learning_rate=1e-2)
    raise ValueError(kind)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--eager", action="store_true")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    psrt.init()
    rank = psrt.rank()
    model = build_model(seed=rank)  # rank 0's initial values must win
    opt = psrt.keras.DistributedOptimizer(make_optimizer(args.optimizer), compression=psrt.Compression.none)
    opt.build(model.trainable_variables)

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step_fn = train_step if args.eager else tf.function(train_step, jit_compile=False)
    for step in range(args.steps):
        step_fn(*batch(step, rank))
    if rank == 0:
        np.savez(args.out, *[v.numpy() for v in model.trainable_variables])
    return 0


if __name__ == "__main__":
    sys.exit(main())
