"""`make demo DEMO=mxnet`: a Gluon network learns handwritten digits through psrt.

The same task as torch_digits.py with MXNet: a gluon.Trainer whose kvstore is
"psrt" (the optimizer runs on the servers). Rank 0 prints progress and ends
with `demo: test accuracy 0.NNN`. The psrt-specific lines are marked "psrt:".
"""

import argparse
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import psrt.mxnet  # noqa: F401  psrt: registers kvstore "psrt"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threshold", type=float, default=0.93)
    args = p.parse_args()
    kv = mx.kv.create("psrt")  # psrt: join the job psrt-run started
    rank, size = kv.rank, kv.num_workers

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        (x / 16.0).astype(np.float32), y, test_size=0.25, random_state=0, stratify=y)
    steps_per_epoch = (len(x_train) // size) // args.batch
    mine_x, mine_y = x_train[rank::size], y_train[rank::size]

    mx.random.seed(rank)  # different on every rank: rank 0's values win
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(128, activation="relu", in_units=64), gluon.nn.Dense(128, activation="relu", in_units=128),
            gluon.nn.Dense(10, in_units=128))
    net.initialize(mx.init.Xavier())
    # psrt: Adam runs on the servers.
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": args.lr}, kvstore=kv,
                            update_on_kvstore=True)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    total = args.epochs * steps_per_epoch
    if rank == 0:
        print("demo: %d workers, %d steps of %d samples each" % (size, total, args.batch), flush=True)
    start = time.monotonic()
    for step in range(total):
        epoch, i = divmod(step, steps_per_epoch)
        order = np.random.default_rng(epoch * 1000 + rank).permutation(len(mine_x))
        idx = order[i * args.batch:(i + 1) * args.batch]
        xb, yb = mx.nd.array(mine_x[idx]), mx.nd.array(mine_y[idx])
        with autograd.record():
            loss = loss_fn(net(xb), yb)
        loss.backward()
        trainer.step(args.batch)
        if rank == 0 and (step + 1) % steps_per_epoch == 0:
            rate = (step + 1) * args.batch * size / (time.monotonic() - start)
            print("epoch %d loss %.4f samples/s %.0f" % (epoch + 1, loss.mean().asscalar(), rate), flush=True)
    if rank != 0:
        return 0
    predicted = net(mx.nd.array(x_test)).argmax(axis=1).asnumpy()
    accuracy = float(np.mean(predicted == y_test))
    print("demo: test accuracy %.3f" % accuracy, flush=True)
    return 0 if accuracy >= args.threshold else 1


if __name__ == "__main__":
    sys.exit(main())
