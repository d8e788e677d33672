"""A training process of test_collectives.py: psrt's collectives on the
user's own torch and TensorFlow values, each checked against what every
worker gave (ranks 0 and 1). Prints "rank R: collectives passed" or what
differed; with --refuse, the error of a first collective."""

import sys

import numpy as np


def check(rank, failures, what, ok):
    if not ok:
        failures.append(what)


def torch_checks(rank, failures):
    import torch

    import psrt.torch as psrt
    t = torch.full((3, 2), float(rank + 1))
    check(rank, failures, "torch mean", torch.equal(psrt.allreduce(t), torch.full((3, 2), 1.5)))
    check(rank, failures, "torch sum", torch.equal(psrt.allreduce(t, op="sum"), torch.full((3, 2), 3.0)))
    b = torch.full((4,), 0.5 * (rank + 1), dtype=torch.bfloat16)
    got = psrt.allreduce(b)
    check(rank, failures, "torch bf16 mean", got.dtype == torch.bfloat16 and torch.equal(got, torch.full((4,), 0.75, dtype=torch.bfloat16)))
    big = torch.tensor([2 ** 40 + rank, -7], dtype=torch.int64)
    check(rank, failures, "torch allgather int64",
          torch.equal(psrt.allgather(big), torch.tensor([[2 ** 40, -7], [2 ** 40 + 1, -7]])))
    x = torch.tensor([np.pi * (rank + 1), 1e-300], dtype=torch.float64)
    check(rank, failures, "torch broadcast float64 from rank 1",
          torch.equal(psrt.broadcast(x, root_rank=1), torch.tensor([2 * np.pi, 1e-300], dtype=torch.float64)))
    obj = {"rank": rank, "text": "é" * 3000} if rank == 1 else None
    check(rank, failures, "broadcast_object", psrt.broadcast_object(obj, root_rank=1) == {"rank": 1, "text": "é" * 3000})
    psrt.barrier()


def tf_checks(rank, failures):
    import tensorflow as tf

    import psrt.tensorflow as ptf
    check(rank, failures, "tf mean", np.array_equal(ptf.allreduce(tf.constant([rank + 1.0, 2.0])).numpy(), [1.5, 2.0]))
    check(rank, failures, "tf allgather",
          np.array_equal(ptf.allgather(tf.constant([rank], tf.int32)).numpy(), [[0], [1]]))
    check(rank, failures, "tf broadcast", np.array_equal(ptf.broadcast(tf.constant([rank * 3.0])).numpy(), [0.0]))
    # fit with validation data of each worker's own: the callback makes the
    # logged validation loss the mean of both workers' losses.
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    g = np.random.default_rng(rank)
    xv, yv = g.normal(size=(16, 4)), g.normal(size=(16, 1))
    mine = model.evaluate(xv, yv, verbose=0)
    history = model.fit(np.zeros((4, 4)), np.zeros((4, 1)), epochs=1, verbose=0, validation_data=(xv, yv),
                        callbacks=[ptf.MetricAverageCallback()])
    logged = history.history["val_loss"][0]
    both = ptf.allgather(np.array([mine, logged])).numpy()
    # Zero inputs and targets give zero gradients: the step moves nothing,
    # so each worker's own validation loss is the one evaluated before.
    check(rank, failures, "MetricAverageCallback",
          abs(logged - (both[0][0] + both[1][0]) / 2) < 1e-6 and both[0][1] == both[1][1] and both[0][0] != both[1][0])


def main():
    import psrt
    import psrt.collectives
    psrt.init()
    rank = psrt.rank()
    if "--refuse" in sys.argv:
        try:
            psrt.collectives.barrier()
            print("rank %d: refusal: none" % rank, flush=True)
        except psrt.PsrtError as e:
            print("rank %d: refusal: %s" % (rank, e), flush=True)
        return 0
    failures = []
    torch_checks(rank, failures)
    tf_checks(rank, failures)
    print("rank %d: collectives %s" % (rank, "passed" if not failures else "FAILED: " + ", ".join(failures)),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
