"""A ResNet from keras.applications on CIFAR-10-shaped data through psrt.

`keras.applications.ResNet50` (untrained: weights=None) on synthetic 32x32
RGB images in 10 classes (each class a fixed pattern plus noise; no
download), trained with `model.fit`: SGD with momentum on the servers,
BatchNormalization's moving statistics averaged over the workers every step.
Rank 0 prints the loss and samples/s per epoch.

    build/bin/psrt-run --local=2 --distribution='{"parameter_server": {"enabled": true}}' \\
      -- .venv/bin/python examples/keras_resnet.py

The psrt-specific lines are marked "psrt:".
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import numpy as np  # noqa: E402

import psrt.tensorflow as psrt  # noqa: E402


class Progress(keras.callbacks.Callback):
    def __init__(self, samples_per_step):
        super().__init__()
        self.samples_per_step = samples_per_step
        self.start = time.monotonic()
        self.steps = 0
        self.first = None

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.first is None:
            self.first = logs["loss"]

    def on_epoch_end(self, epoch, logs=None):
        rate = self.steps * self.samples_per_step / (time.monotonic() - self.start)
        print("epoch %d loss %.4f samples/s %.0f" % (epoch + 1, logs["loss"], rate), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="ResNet50", help="a ResNet of keras.applications")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="steps per epoch")
    p.add_argument("--batch", type=int, default=32, help="images per step and worker")
    p.add_argument("--lr", type=float, default=0.01)
    args = p.parse_args()
    psrt.init()  # psrt: join the job psrt-run started
    rank, size = psrt.rank(), psrt.size()

    # CIFAR-shaped data: every worker its own images around the same patterns.
    patterns = np.random.default_rng(0).normal(size=(10, 32, 32, 3)).astype(np.float32)
    rng = np.random.default_rng(1 + rank)
    n = args.steps * args.batch
    labels = rng.integers(0, 10, n)
    images = patterns[labels] + rng.normal(size=(n, 32, 32, 3)).astype(np.float32)

    keras.utils.set_random_seed(rank)  # different on every rank: rank 0's values win
    model = getattr(keras.applications, args.model)(weights=None, input_shape=(32, 32, 3), classes=10)
    # psrt: the servers run SGD with momentum.
    opt = psrt.keras.DistributedOptimizer(keras.optimizers.SGD(args.lr, momentum=0.9))
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(), jit_compile=False)
    if rank == 0:
        print("example: keras.applications.%s (%.1fM parameters), %d workers, %d steps of %d images each"
              % (args.model, model.count_params() / 1e6, size, args.epochs * args.steps, args.batch), flush=True)
    progress = Progress(args.batch * size)
    history = model.fit(images, labels, batch_size=args.batch, epochs=args.epochs, shuffle=True, verbose=0,
                        callbacks=[progress] if rank == 0 else [])
    if rank == 0:
        print("example: done: loss %.4f -> %.4f" % (progress.first, history.history["loss"][-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
