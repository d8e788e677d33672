"""An MXNet training process for the plugin's tests, started by psrt-run.

A small Gluon MLP on random regression data (rank r's batch at step s from
seed (s, r)), trained by a gluon.Trainer with kvstore="psrt". Rank 0 writes
the final parameters (numpy .npz, in collect_params() order) to --out.
"""

import argparse
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import psrt.mxnet  # noqa: F401  (registers kvstore "psrt")


def build_net(seed):
    mx.random.seed(seed)
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(16, activation="tanh", in_units=8), gluon.nn.Dense(1, in_units=16))
    net.initialize(mx.init.Xavier())
    return net


def batch(step, rank, n=16):
    rng = np.random.default_rng(step * 1000 + rank)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    return mx.nd.array(x), mx.nd.array(np.sin(x.sum(axis=1, keepdims=True)))


OPTIMIZERS = {"sgd": ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}),
              "adam": ("adam", {"learning_rate": 1e-2})}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    kv = mx.kv.create("psrt")
    rank = kv.rank
    # Gluon's Trainer reaches the kvstore only in its first step, after the
    # first gradients: start every rank from the same values, as with MXNet's
    # own dist kvstores.
    net = build_net(seed=0)
    name, params = OPTIMIZERS[args.optimizer]
    trainer = gluon.Trainer(net.collect_params(), name, params, kvstore=kv, update_on_kvstore=True)
    loss_fn = gluon.loss.L2Loss()
    for step in range(args.steps):
        x, y = batch(step, rank)
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(x.shape[0])
    if rank == 0:
        np.savez(args.out, *[p.data().asnumpy() for p in net.collect_params().values()])
        kv.save_optimizer_states(args.out + ".states")
        kv.load_optimizer_states(args.out + ".states")
    return 0


if __name__ == "__main__":
    sys.exit(main())
