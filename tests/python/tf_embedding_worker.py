"""A training process with psrt.keras.layers.Embedding, started by psrt-run
for tests/python/test_tensorflow_embedding.py.

A table, mean pooling and a dense head trained by model.fit on a fixed
click-like target; rank r of w takes the r-th slice of each step's global
batch, so the test can replay the global batch in one process. Rank 0 saves
the table's rows and the head's weights, before and after (numpy .npz), to
--out.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import keras  # noqa: E402

import psrt.tensorflow as psrt  # noqa: E402

VOCAB, DIM, BATCH, BAG = 40, 8, 16, 3


def batch(step):
    """The global batch of `step`: ids (BATCH, BAG) and targets (BATCH, 1)."""
    rng = np.random.default_rng(step)
    ids = rng.integers(0, VOCAB, (BATCH, BAG))
    return ids, (ids % 3 == 0).mean(axis=1, keepdims=True).astype(np.float32)


def table_args(kind):
    """The row-wise optimizer's settings, with Keras's names."""
    if kind == "adam":
        return {"optimizer": "adam", "lr": 0.05, "beta_1": 0.8, "beta_2": 0.95, "epsilon": 1e-6}
    if kind == "adagrad":
        return {"optimizer": "adagrad", "lr": 0.3, "initial_accumulator_value": 0.1}
    if kind == "ftrl":
        return {"optimizer": "ftrl", "lr": 0.2, "l1_regularization_strength": 1e-3,
                "l2_regularization_strength": 1e-2, "beta": 0.1}
    return {"optimizer": "sgd", "lr": 0.5}


def initializer(rank):
    """A seeded Keras initializer that differs per rank (--initializer)."""
    return keras.initializers.RandomUniform(-0.5, 0.5, seed=rank + 1)


def build_model(table):
    """ids -> table -> mean over the bag -> Dense(1); the head from seed 0."""
    keras.utils.set_random_seed(0)
    ids = keras.Input((BAG,), dtype="int64")
    pooled = keras.layers.GlobalAveragePooling1D()(table(ids))
    return keras.Model(ids, keras.layers.Dense(1, name="head")(pooled))


def head_optimizer():
    """The dense layers' SGD, its rate decaying every step: the servers
    follow the schedule for the dense variables, and the table keeps its
    own rate."""
    return keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1,
                                                                            decay_rate=0.9))


def head_weights(model):
    return [w.numpy() for w in model.get_layer("head").weights]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--optimizer", default="adam")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--out", required=True)
    ap.add_argument("--initializer", action="store_true",
                    help="the table starts from initializer(rank) (rank 0's, on every rank)")
    args = ap.parse_args()
    psrt.init()
    start = {"embeddings_initializer": initializer(psrt.rank())} if args.initializer else {}
    table = psrt.keras.layers.Embedding(VOCAB, DIM, name="table", compression=psrt.Compression.none,
                                        **table_args(args.optimizer), **start)
    model = build_model(table)
    model.compile(optimizer=psrt.keras.DistributedOptimizer(head_optimizer(),
                                                            compression=psrt.Compression.none),
                  loss="mse", jit_compile=False)
    rank, size = psrt.rank(), psrt.size()
    per = BATCH // size
    initial, initial_head = table.rows(np.arange(VOCAB)), head_weights(model)
    np.save("%s.initial%d.npy" % (args.out, rank), initial)
    # Rank r's slices of every step, in order: fit's batches of `per`.
    batches = [batch(step) for step in range(args.steps)]
    x = np.concatenate([ids[rank * per:(rank + 1) * per] for ids, _ in batches])
    y = np.concatenate([t[rank * per:(rank + 1) * per] for _, t in batches])
    model.fit(x, y, batch_size=per, epochs=1, shuffle=False, verbose=0)
    if rank == 0:
        final = table.rows(np.arange(VOCAB))  # once every worker's last step is applied
        np.savez(args.out, initial=initial, final=final, head_initial_kernel=initial_head[0],
                 head_initial_bias=initial_head[1], head_kernel=head_weights(model)[0],
                 head_bias=head_weights(model)[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
