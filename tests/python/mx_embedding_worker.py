"""An MXNet training process with a table on psrt's servers (kvstore "psrt"),
started by psrt-run for tests/python/test_mxnet_embedding.py.

Gluon's SparseEmbedding (row_sparse weight and gradient), mean pooling and a
dense head, trained by gluon.Trainer(kvstore="psrt") on a fixed click-like
target: the Trainer row_sparse_pulls the batch's rows before the forward and
pushes their row_sparse gradient in step(). Rank r of w takes the r-th slice
of each step's global batch. The head trains too with SGD (the servers' SGD
is MXNet's exactly); with the other optimizers it stays fixed, so that the
comparison is about the table alone. Rank 0 saves the table's rows (before
and after) and the head's weights (numpy .npz) to --out. With --api, every
rank checks the kvstore's table calls used directly instead.
"""

import argparse
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import psrt.mxnet

VOCAB, DIM, BATCH, BAG = 40, 8, 16, 3
OPTIMIZERS = {"adam": ("adam", {"learning_rate": 0.05, "beta1": 0.8, "beta2": 0.95, "epsilon": 1e-6,
                                "lazy_update": True}),
              "adagrad": ("adagrad", {"learning_rate": 0.3}),
              "sgd": ("sgd", {"learning_rate": 0.5}),
              "ftrl": ("ftrl", {"learning_rate": 0.2, "lamda1": 1e-3, "beta": 0.1, "wd": 0.02})}


def batch(step):
    """The global batch of `step`: ids (BATCH, BAG) and targets (BATCH, 1)."""
    rng = np.random.default_rng(step)
    ids = rng.integers(0, VOCAB, (BATCH, BAG))
    return ids, (ids % 3 == 0).mean(axis=1, keepdims=True).astype(np.float32)


def head_initial():
    rng = np.random.default_rng(7)
    return rng.standard_normal((1, DIM)).astype(np.float32) * 0.5, np.array([0.1], dtype=np.float32)


class Net(gluon.Block):
    """ids -> table -> mean over the bag -> Dense(1)."""

    def __init__(self, table, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.table = table
            self.head = gluon.nn.Dense(1, in_units=DIM)

    def forward(self, ids):
        return self.head(self.table(ids).mean(axis=1))


def pretrained():
    """Rows a table starts from (--pretrained)."""
    return np.random.default_rng(11).standard_normal((VOCAB, DIM)).astype(np.float32) * 0.5


def build_net(table):
    net = Net(table)
    net.initialize(mx.init.Normal(0.01))
    weight, bias = head_initial()
    net.head.weight.set_data(mx.nd.array(weight))
    net.head.bias.set_data(mx.nd.array(bias))
    return net


def trained_params(net, kind):
    """What the Trainer updates: the head too with sgd only."""
    return net.collect_params() if kind == "sgd" else net.table.collect_params()


def api_checks():
    """The kvstore's table API used directly: init, row_sparse_pull, pull,
    push and pushpull of row_sparse gradients (SGD, lr 1, two workers)."""
    kv = mx.kv.create("psrt")
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=1.0))
    psrt.mxnet.table_options("t", seed=3, init_std=1.0)
    kv.init("t", mx.nd.sparse.zeros("row_sparse", (6, 2)))  # the value gives only the shape
    out = mx.nd.sparse.zeros("row_sparse", (6, 2))
    kv.row_sparse_pull("t", out=out, row_ids=mx.nd.array([3, 1, 3], dtype="int64"))
    assert out.indices.asnumpy().tolist() == [1, 3], out.indices
    # Float row ids (MXNet's default dtype) as exact whole numbers only.
    kv.row_sparse_pull("t", out=out, row_ids=mx.nd.array([3, 1]))
    assert out.indices.asnumpy().tolist() == [1, 3], out.indices
    try:
        kv.row_sparse_pull("t", out=out, row_ids=mx.nd.array([1.5]))
        raise AssertionError("a float row id of 1.5 was taken")
    except psrt.PsrtError as e:
        assert "ids of dtype float32 must be whole numbers" in str(e) and "/t'" in str(e), e
    full = mx.nd.zeros((6, 2))
    kv.pull("t", out=full)  # dense: the whole table
    start = full.asnumpy()
    assert np.array_equal(out.asnumpy()[[1, 3]], start[[1, 3]]) and (np.abs(start) > 0).all(), start
    # Sync: the servers apply the mean over both workers; rank 0 pushes rows
    # 1 and 5 (ones), rank 1 rows 1 and 4 (twos).
    rows = [1, 4] if kv.rank else [1, 5]
    kv.push("t", mx.nd.sparse.row_sparse_array((np.full((2, 2), kv.rank + 1.0, np.float32), rows), shape=(6, 2)))
    kv.pull("t", out=full)
    want = start.copy()
    want[1] -= 1.5
    want[4] -= 1.0
    want[5] -= 0.5
    assert np.allclose(full.asnumpy(), want, rtol=0, atol=1e-6), (full, want)
    # pushpull: out gets the pushed rows' new values.
    kv.pushpull("t", mx.nd.sparse.row_sparse_array((np.ones((1, 2), np.float32), [0]), shape=(6, 2)), out=out)
    assert out.indices.asnumpy().tolist() == [0] and np.allclose(out.asnumpy()[0], want[0] - 1.0), out
    try:
        kv.push("t", mx.nd.ones((6, 2)))
        raise AssertionError("a dense gradient was pushed to a table")
    except psrt.PsrtError as e:
        assert "push a row_sparse gradient" in str(e), e
    print("rank %d: table checks passed" % kv.rank, flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--optimizer", default="adam")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--api", action="store_true", help="check the kvstore's table API instead")
    ap.add_argument("--out")
    ap.add_argument("--pretrained", action="store_true",
                    help="rank 0's table starts as pretrained(), the others' at random")
    args = ap.parse_args()
    if args.api:
        return api_checks()
    if not args.out:
        ap.error("--out is required (or --api)")
    if args.pretrained:
        psrt.mxnet.table_options(compression=psrt.Compression.none)
    else:
        psrt.mxnet.table_options(init_std=0.5, compression=psrt.Compression.none)
    net = build_net(gluon.contrib.nn.SparseEmbedding(VOCAB, DIM))
    if args.pretrained and os.environ["PSRT_RANK"] == "0":  # the kvstore starts psrt later
        net.table.weight.set_data(mx.nd.array(pretrained()).tostype("row_sparse"))
    name, params = OPTIMIZERS[args.optimizer]
    trainer = gluon.Trainer(trained_params(net, args.optimizer), name, params, kvstore="psrt")
    loss_fn = gluon.loss.L2Loss()
    every = mx.nd.arange(VOCAB)
    # The first row_sparse_pull creates the kvstore and registers the table.
    initial = net.table.weight.row_sparse_data(every).asnumpy()
    rank, size = trainer._kvstore.rank, trainer._kvstore.num_workers
    per = BATCH // size
    for step in range(args.steps):
        ids, y = batch(step)
        x, y = mx.nd.array(ids[rank * per:(rank + 1) * per]), mx.nd.array(y[rank * per:(rank + 1) * per])
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(per)
    np.save("%s.initial%d.npy" % (args.out, rank), initial)
    if rank == 0:
        final = net.table.weight.row_sparse_data(every).asnumpy()  # once every worker's last step is applied
        np.savez(args.out, initial=initial, final=final, head_kernel=net.head.weight.data().asnumpy(),
                 head_bias=net.head.bias.data().asnumpy())
    return 0


if __name__ == "__main__":
    sys.exit(main())
