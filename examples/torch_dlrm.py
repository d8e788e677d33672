"""A DLRM (Criteo-shaped: 13 dense features, 26 categorical) through psrt.

The model of Naumov et al.'s DLRM: a bottom MLP for the dense features, one
embedding table per categorical feature, every pair of the 27 vectors'
dot products, and a top MLP to the click's logit. The tables live on the
parameter servers (`psrt.Embedding`: rows made on first touch, Adagrad per
row), so they can be far larger than a worker's memory; the MLPs train with
Adam. The clicks are synthetic (a hidden logistic model of the features; no
download). Rank 0 prints the loss and samples/s.

    build/bin/psrt-run --local=2 --distribution='{"parameter_server": {"enabled": true}}' \\
      -- .venv/bin/python examples/torch_dlrm.py

The psrt-specific lines are marked "psrt:".
"""

import argparse
import sys
import time

import torch

import psrt.torch as psrt

DENSE = 13
TABLES = 26


class DLRM(torch.nn.Module):
    def __init__(self, rows, dim, lr):
        super().__init__()
        # psrt: one table per categorical feature, on the servers.
        self.tables = torch.nn.ModuleList(
            psrt.Embedding(rows, dim, name="table%d" % t, optimizer="adagrad", lr=lr * 10, init_std=0.05)
            for t in range(TABLES))
        self.bottom = torch.nn.Sequential(torch.nn.Linear(DENSE, 256), torch.nn.ReLU(),
                                          torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, dim))
        vectors = TABLES + 1
        pairs = vectors * (vectors - 1) // 2
        self.top = torch.nn.Sequential(torch.nn.Linear(dim + pairs, 512), torch.nn.ReLU(),
                                       torch.nn.Linear(512, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
        self.pairs = torch.triu_indices(vectors, vectors, offset=1)

    def forward(self, dense, ids):
        vectors = torch.stack([self.bottom(dense)] + [t(ids[:, i]) for i, t in enumerate(self.tables)], 1)
        dots = vectors @ vectors.transpose(1, 2)
        return self.top(torch.cat([vectors[:, 0], dots[:, self.pairs[0], self.pairs[1]]], 1)).squeeze(1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=512, help="samples per step and worker")
    p.add_argument("--rows", type=int, default=100000, help="rows of each table")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--log-every", type=int, default=20)
    args = p.parse_args()
    psrt.init()  # psrt: join the job psrt-run started
    rank, size = psrt.rank(), psrt.size()
    torch.set_num_threads(1)

    # The hidden model the clicks come from: a weight per dense feature and
    # per (table, row), ids drawn with a power law as Criteo's are.
    hidden = torch.Generator().manual_seed(0)
    dense_w = torch.randn(DENSE, generator=hidden) * 0.5
    row_w = torch.randn(TABLES, args.rows, generator=hidden) * 0.5
    data = torch.Generator().manual_seed(1 + rank)

    def batch():
        dense = torch.randn(args.batch, DENSE, generator=data)
        u = torch.rand(args.batch, TABLES, generator=data)
        ids = (args.rows * u.pow(3)).long().clamp(max=args.rows - 1)
        logit = dense @ dense_w + row_w.gather(1, ids.t()).t().sum(1) / TABLES ** 0.5 - 1.0
        clicks = (torch.rand(args.batch, generator=data) < torch.sigmoid(logit)).float()
        return dense, ids, clicks

    torch.manual_seed(rank)  # different on every rank: rank 0's values win
    model = DLRM(args.rows, args.dim, args.lr)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    # psrt: the MLPs' Adam runs on the servers; step() also pushes the tables' rows.
    opt = psrt.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    loss_fn = torch.nn.BCEWithLogitsLoss()
    if rank == 0:
        print("example: DLRM, %d tables of %d x %d, %d workers, %d servers, %d steps of %d samples each"
              % (TABLES, args.rows, args.dim, size, psrt.num_servers(), args.steps, args.batch), flush=True)
    start, first = time.monotonic(), None
    for step in range(args.steps):
        dense, ids, clicks = batch()
        opt.zero_grad()
        loss = loss_fn(model(dense, ids), clicks)
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
        if rank == 0 and ((step + 1) % args.log_every == 0 or step + 1 == args.steps):
            rate = (step + 1) * args.batch * size / (time.monotonic() - start)
            print("step %d/%d loss %.4f samples/s %.0f" % (step + 1, args.steps, loss.item(), rate), flush=True)
    opt.synchronize()
    if rank == 0:
        print("example: done: loss %.4f -> %.4f" % (first, loss.item()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
