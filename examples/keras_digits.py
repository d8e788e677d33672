"""`make demo DEMO=tensorflow`: a Keras network learns handwritten digits through psrt.

The same task as torch_digits.py (scikit-learn's digits, each worker on its
share of the training set, Adam on the servers, fp16 gradients) with
`model.fit`. Rank 0 prints progress and ends with `demo: test accuracy 0.NNN`.
The psrt-specific lines are marked "psrt:".
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import keras  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import psrt.tensorflow as psrt  # noqa: E402


class Progress(keras.callbacks.Callback):
    def __init__(self, samples_per_step):
        super().__init__()
        self.samples_per_step = samples_per_step
        self.start = time.monotonic()
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1

    def on_epoch_end(self, epoch, logs=None):
        rate = self.steps * self.samples_per_step / (time.monotonic() - self.start)
        print("epoch %d loss %.4f samples/s %.0f" % (epoch + 1, logs["loss"], rate), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threshold", type=float, default=0.93)
    args = p.parse_args()
    psrt.init()  # psrt: join the job psrt-run started
    rank, size = psrt.rank(), psrt.size()

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        (x / 16.0).astype(np.float32), y, test_size=0.25, random_state=0, stratify=y)
    steps_per_epoch = (len(x_train) // size) // args.batch  # the same on every worker
    n = steps_per_epoch * args.batch
    mine_x, mine_y = x_train[rank::size][:n], y_train[rank::size][:n]

    keras.utils.set_random_seed(rank)  # different on every rank: rank 0's values win
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
    # psrt: the servers run Adam; gradients travel as fp16.
    opt = psrt.keras.DistributedOptimizer(keras.optimizers.Adam(args.lr), compression=psrt.Compression.fp16)
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    if rank == 0:
        print("demo: %d workers, %d steps of %d samples each" % (size, args.epochs * steps_per_epoch, args.batch),
              flush=True)
    model.fit(mine_x, mine_y, batch_size=args.batch, epochs=args.epochs, shuffle=True, verbose=0,
              callbacks=[Progress(args.batch * size)] if rank == 0 else [])
    if rank != 0:
        return 0
    accuracy = float(np.mean(np.argmax(model.predict(x_test, verbose=0), axis=1) == y_test))
    print("demo: test accuracy %.3f" % accuracy, flush=True)
    return 0 if accuracy >= args.threshold else 1


if __name__ == "__main__":
    sys.exit(main())
