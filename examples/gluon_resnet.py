"""A ResNet from Gluon's model zoo on CIFAR-10-shaped data through psrt.

`gluon.model_zoo.vision.resnet18_v1` (untrained) on synthetic 32x32 RGB
images in 10 classes (each class a fixed pattern plus noise; no download), a
`gluon.Trainer` whose kvstore is "psrt": SGD with momentum and weight decay
on the servers. Rank 0 prints the loss and samples/s. Run with the MXNet
environment's Python (`make` makes .venv-mxnet):

    build/bin/psrt-run --local=2 --distribution='{"parameter_server": {"enabled": true}}' \\
      -- .venv-mxnet/bin/python examples/gluon_resnet.py

The psrt-specific lines are marked "psrt:".
"""

import argparse
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import psrt.mxnet  # noqa: F401  psrt: registers kvstore "psrt"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18_v1", help="a model of gluon.model_zoo.vision")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=32, help="images per step and worker")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--log-every", type=int, default=10)
    args = p.parse_args()
    kv = mx.kv.create("psrt")  # psrt: join the job psrt-run started
    rank, size = kv.rank, kv.num_workers

    patterns = np.random.default_rng(0).normal(size=(10, 3, 32, 32)).astype(np.float32)
    rng = np.random.default_rng(1 + rank)

    mx.random.seed(rank)  # different on every rank: rank 0's values win
    net = gluon.model_zoo.vision.get_model(args.model, classes=10)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    # psrt: SGD runs on the servers.
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": args.lr, "momentum": 0.9, "wd": 5e-4},
                            kvstore=kv, update_on_kvstore=True)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    if rank == 0:
        print("example: Gluon %s, %d workers, %d steps of %d images each" % (args.model, size, args.steps, args.batch),
              flush=True)
    start, first = time.monotonic(), None
    for step in range(args.steps):
        labels = rng.integers(0, 10, args.batch)
        images = patterns[labels] + rng.normal(size=(args.batch, 3, 32, 32)).astype(np.float32)
        x, y = mx.nd.array(images), mx.nd.array(labels)
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(args.batch)
        value = float(loss.mean().asscalar())
        first = value if first is None else first
        if rank == 0 and ((step + 1) % args.log_every == 0 or step + 1 == args.steps):
            rate = (step + 1) * args.batch * size / (time.monotonic() - start)
            print("step %d/%d loss %.4f samples/s %.0f" % (step + 1, args.steps, value, rate), flush=True)
    if rank == 0:
        print("example: done: loss %.4f -> %.4f" % (first, value), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
