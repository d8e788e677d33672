"""`make demo DEMO=recsys`: a DLRM-shaped click model whose embedding tables
live on psrt's servers.

Click data is generated with a known signal: a user's and an item's hidden
factors, a context token's bias (the context is a hashed 64-bit feature, as
production models hash their sparse features) and a few dense features set
the click probability. The model has one embedding table per sparse feature
(user and item: fixed vocabularies; context: an open hash table fed with the
hashed ids), a bottom MLP over the dense features, their pairwise dot
products and a top MLP. Every worker trains on its share of the data; rank 0
prints progress and, at the end, the test AUC next to the generator's own
(the best any model can do), and exits 1 below --threshold:

    demo: test AUC 0.849 (the generator's own: 0.881; threshold 0.80)

Run by psrt-run (see the Makefile's demo target). The only psrt-specific lines
are marked "psrt:".
"""

import argparse
import sys
import time

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

import psrt.torch as psrt

USERS, ITEMS, CONTEXTS, DENSE, FACTORS = 2000, 1000, 5000, 4, 4


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=200000, help="generated clicks (4/5 to train)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=256, help="samples per step and worker")
    p.add_argument("--dim", type=int, default=16, help="embedding size")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--log-every", type=int, default=50, help="steps between progress lines")
    p.add_argument("--threshold", type=float, default=0.8, help="exit 1 if the test AUC is below this")
    return p.parse_args()


def generate(n, seed=1):
    """Clicks from a known model: (users, items, hashed contexts, dense, clicks, true logits)."""
    rng = np.random.default_rng(seed)
    user_f = rng.normal(0, 1, (USERS, FACTORS))
    item_f = rng.normal(0, 1, (ITEMS, FACTORS))
    context_bias = rng.normal(0, 1, CONTEXTS)
    dense_w = rng.normal(0, 0.5, DENSE)
    # Popularity skew: a few users and items make most of the traffic.
    users = np.minimum(rng.zipf(1.3, n) - 1, USERS - 1)
    items = np.minimum(rng.zipf(1.2, n) - 1, ITEMS - 1)
    contexts = rng.integers(0, CONTEXTS, n)
    dense = rng.normal(0, 1, (n, DENSE)).astype(np.float32)
    logits = (user_f[users] * item_f[items]).sum(1) + context_bias[contexts] + dense @ dense_w - 0.5
    clicks = (rng.random(n) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    # The context's id as a production pipeline would see it: a 64-bit hash.
    hashed = (contexts.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(0x632BE5AB)).view(np.int64)
    return users, items, hashed, dense, clicks, logits


class DLRM(torch.nn.Module):
    def __init__(self, dim, lr):
        super().__init__()
        # psrt: the tables live on the servers, each with its row-wise optimizer.
        self.user = psrt.Embedding(USERS, dim, name="user", optimizer="adagrad", lr=lr * 5, init_std=0.05)
        self.item = psrt.Embedding(ITEMS, dim, name="item", optimizer="adagrad", lr=lr * 5, init_std=0.05)
        self.context = psrt.Embedding(None, dim, name="context", optimizer="adam", lr=lr, init_std=0.05)
        self.bottom = torch.nn.Sequential(torch.nn.Linear(DENSE, 32), torch.nn.ReLU(), torch.nn.Linear(32, dim))
        pairs = 4 * 3 // 2
        self.top = torch.nn.Sequential(torch.nn.Linear(dim + pairs, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def forward(self, users, items, contexts, dense):
        features = torch.stack([self.bottom(dense), self.user(users), self.item(items), self.context(contexts)], 1)
        dots = features @ features.transpose(1, 2)
        i, j = torch.triu_indices(4, 4, offset=1)
        return self.top(torch.cat([features[:, 0], dots[:, i, j]], 1)).squeeze(1)


def main():
    args = parse_args()
    psrt.init()  # psrt: join the job psrt-run started
    rank, size = psrt.rank(), psrt.size()
    users, items, contexts, dense, clicks, logits = generate(args.samples)
    tensors = [torch.from_numpy(a) for a in (users.astype(np.int64), items.astype(np.int64), contexts, dense, clicks)]
    split = args.samples * 4 // 5
    train = [t[:split] for t in tensors]
    test = [t[split:] for t in tensors]
    torch.manual_seed(0)
    model = DLRM(args.dim, args.lr)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    # psrt: the MLPs' updates run on the servers; step() also pushes the tables' rows.
    opt = psrt.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    loss_fn = torch.nn.BCEWithLogitsLoss()
    steps_per_epoch = split // (args.batch * size)
    start, samples = time.time(), 0
    for epoch in range(args.epochs):
        order = torch.randperm(split, generator=torch.Generator().manual_seed(epoch))
        for s in range(steps_per_epoch):
            # This worker's share of the step's global batch.
            at = (s * size + rank) * args.batch
            idx = order[at:at + args.batch]
            u, i, c, d, y = (t[idx] for t in train)
            opt.zero_grad()
            loss = loss_fn(model(u, i, c, d), y)
            loss.backward()
            opt.step()
            samples += len(idx) * size
            step = epoch * steps_per_epoch + s
            if rank == 0 and step % args.log_every == 0:
                print("demo: epoch %d step %d loss %.4f" % (epoch, step, loss.item()), flush=True)
    opt.synchronize()
    elapsed = time.time() - start
    if rank != 0:
        return 0
    model.eval()
    with torch.no_grad():
        scores = torch.cat([model(*(t[k:k + 4096] for t in test[:4])) for k in range(0, len(test[0]), 4096)])
    auc = roc_auc_score(test[4].numpy(), scores.numpy())
    best = roc_auc_score(test[4].numpy(), logits[split:])
    print("demo: %d samples/s over %d workers and %d servers" % (samples / elapsed, size, psrt.num_servers()),
          flush=True)
    print("demo: test AUC %.3f (the generator's own: %.3f; threshold %.2f)" % (auc, best, args.threshold),
          flush=True)
    return 0 if auc >= args.threshold else 1


if __name__ == "__main__":
    sys.exit(main())
