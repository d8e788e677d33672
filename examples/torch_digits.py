"""`make demo`: a PyTorch network learns handwritten digits through psrt.

scikit-learn's digits (1797 8x8 images, shipped inside the package) are split
into a training and a test set; every worker trains on its share of the
training set, the parameter servers apply Adam, and rank 0 prints progress
and, at the end, the test accuracy:

    demo: test accuracy 0.972

Run by psrt-run (see the Makefile's demo target). The only psrt-specific
lines are marked "psrt:". On a machine with a GPU the model trains there.
sagemaker_digits.py runs the same training as a SageMaker script.
"""

import argparse
import sys
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import psrt.torch as psrt


def add_arguments(p):
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch", type=int, default=32, help="samples per step and worker")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--log-every", type=int, default=40, help="steps between progress lines")
    p.add_argument("--threshold", type=float, default=0.93,
                   help="exit 1 if the test accuracy is below this")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return p.parse_args()


def split(x, y):
    """Training and test sets of images `x` (pixels 0-16, 64 per row) and
    labels `y`: x_train, x_test, y_train, y_test."""
    return train_test_split(np.asarray(x) / 16.0, np.asarray(y), test_size=0.25, random_state=0, stratify=y)


def device():
    # psrt-run gives each training process its own GPU (CUDA_VISIBLE_DEVICES);
    # with --bind-gpus=false every process sees all of them.
    return (torch.device("cuda", psrt.local_rank() % torch.cuda.device_count()) if torch.cuda.is_available()
            else torch.device("cpu"))


def build_model(hidden):
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10))


def train(args, x_train, y_train):
    """Trains on this worker's share of the training set through the job's
    servers (psrt.init() done); returns the model."""
    rank, size = psrt.rank(), psrt.size()
    dev = device()
    torch.set_num_threads(1)
    to = lambda a, dtype: torch.tensor(a, dtype=dtype, device=dev)
    # Every worker takes every size-th sample, and as many steps as the
    # smallest share allows (sync mode: all workers take the same steps).
    mine_x, mine_y = to(x_train[rank::size], torch.float32), to(y_train[rank::size], torch.long)
    steps_per_epoch = (len(x_train) // size) // args.batch
    total = args.epochs * steps_per_epoch

    torch.manual_seed(rank)  # different on every rank: rank 0's values win
    model = build_model(args.hidden).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    # psrt: the servers run Adam; gradients travel as fp16.
    opt = psrt.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                    compression=psrt.Compression.fp16)
    loss_fn = torch.nn.CrossEntropyLoss()

    start_step = opt.global_step  # > 0 when the job was restored
    if rank == 0:
        print("demo: %d workers, %d steps of %d samples each, from step %d"
              % (size, total, args.batch, start_step), flush=True)
    started = time.monotonic()
    for step in range(start_step, total):
        epoch, i = divmod(step, steps_per_epoch)
        order = torch.randperm(len(mine_x), generator=torch.Generator().manual_seed(epoch * 1000 + rank))
        idx = order[i * args.batch:(i + 1) * args.batch].to(dev)
        opt.zero_grad()
        loss = loss_fn(model(mine_x[idx]), mine_y[idx])
        loss.backward()
        opt.step()
        if rank == 0 and ((step + 1) % args.log_every == 0 or step + 1 == total):
            rate = (step + 1 - start_step) * args.batch * size / (time.monotonic() - started)
            print("step %d/%d loss %.4f samples/s %.0f" % (step + 1, total, loss.item(), rate), flush=True)
    return model


def evaluate(args, model, x_test, y_test):
    """Prints the model's accuracy on the test set; 1 if it is below
    --threshold, else 0."""
    with torch.no_grad():
        x = torch.tensor(x_test, dtype=torch.float32, device=device())
        predicted = model(x).argmax(dim=1).cpu().numpy()
    accuracy = float(np.mean(predicted == y_test))
    print("demo: test accuracy %.3f" % accuracy, flush=True)
    if accuracy < args.threshold:
        print("demo: below the threshold %.2f" % args.threshold, file=sys.stderr)
        return 1
    return 0


def main():
    args = parse_args()
    psrt.init()  # psrt: join the job psrt-run started
    x_train, x_test, y_train, y_test = split(*load_digits(return_X_y=True))
    model = train(args, x_train, y_train)
    if psrt.rank() != 0:
        return 0
    return evaluate(args, model, x_test, y_test)


if __name__ == "__main__":
    sys.exit(main())
