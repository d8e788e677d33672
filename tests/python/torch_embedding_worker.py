"""A training process with psrt.torch.Embedding / EmbeddingBag, started by
psrt-run for tests/python/test_torch_embedding.py.

A table and a linear head trained on a fixed click-like target; rank r of w
takes the r-th slice of each step's global batch, so the test can replay the
global batch in one process. Rank 0 saves the table's rows (before and after)
and the head's final weights with torch.save to --out.
"""

import argparse
import json
import os

import torch

import psrt.torch as psrt

VOCAB, DIM, BATCH, BAG = 40, 8, 16, 3


def batch(step):
    """The global batch of `step`: ids (BATCH, BAG) and targets (BATCH,)."""
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, VOCAB, (BATCH, BAG), generator=g)
    y = (ids % 3 == 0).float().mean(dim=1)
    return ids, y


def table_args(kind):
    """The row-wise optimizer's settings, with torch's names."""
    if kind == "adam":
        return {"optimizer": "adam", "lr": 0.05, "betas": (0.8, 0.95), "eps": 1e-6}
    if kind == "adagrad":
        return {"optimizer": "adagrad", "lr": 0.3, "lr_decay": 0.01, "initial_accumulator_value": 0.1}
    return {"optimizer": "sgd", "lr": 0.5}


def forward(table, head, ids, bag, sit_out=False):
    """The model; with `sit_out` the step leaves the table out (its
    features are zeros), as a model whose branches differ per step does."""
    if sit_out:
        features = torch.zeros(ids.shape[0], DIM)
    else:
        features = table(ids) if bag else table(ids[:, 0])
    return head(features).squeeze(-1)


def pretrained():
    """Rows a table starts from (--pretrained)."""
    return torch.randn(VOCAB, DIM, generator=torch.Generator().manual_seed(7)) * 0.5


def steps_list(text):
    return [int(s) for s in text.split(",") if s]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--optimizer", default="adam")
    ap.add_argument("--bag", action="store_true")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sit-out", type=steps_list, default=[], help="steps whose forward leaves the table out")
    ap.add_argument("--scaler", action="store_true", help="a GradScaler (init_scale 1024) scales the loss")
    ap.add_argument("--unscale", action="store_true", help="with --scaler: scaler.unscale_(opt) before the step")
    ap.add_argument("--pretrained", action="store_true",
                    help="the table starts from pretrained() (rank 0's; the others pass zeros)")
    ap.add_argument("--crash-at", type=int, default=-1,
                    help="rank 0 fails at this step; restarted, it saves the rows it finds to --out.restarted "
                         "and goes on from the job's step")
    ap.add_argument("--configs", help="a JSON list of argument lists: one after the other in this job (torch "
                    "imported once), the i-th's table and head named ci/..., its --out OUT.ci")
    args = ap.parse_args()
    if args.configs:
        for i, config in enumerate(json.loads(args.configs)):
            train(ap.parse_args(config + ["--out", "%s.c%d" % (args.out, i)]), "c%d/" % i)
        return
    train(args)


def train(args, prefix=""):
    """One run of main's arguments; `prefix` begins the table's and the
    head's names."""
    psrt.init()
    restarted = os.environ.get("PSRT_RESTART_COUNT", "0") != "0"
    torch.manual_seed(0)
    head = torch.nn.Linear(DIM, 1)
    kind = psrt.EmbeddingBag if args.bag else psrt.Embedding
    options = dict(table_args(args.optimizer), name=prefix + "table", **({"mode": "sum"} if args.bag else {}))
    if args.pretrained:
        matrix = pretrained() if psrt.rank() == 0 else torch.zeros(VOCAB, DIM)
        table = kind.from_pretrained(matrix, **options)
    else:
        table = kind(VOCAB, DIM, **options)
    initial = table.rows(torch.arange(VOCAB))
    if restarted:
        torch.save(initial, args.out + ".restarted")
    else:
        torch.save(initial, "%s.initial%d" % (args.out, psrt.rank()))
    try:
        table(torch.tensor([[1.5, 2.0, 3.0]]))
    except psrt.PsrtError as e:
        print("float ids refused: %s" % e, flush=True)
    opt = psrt.DistributedOptimizer(torch.optim.SGD(head.parameters(), lr=0.1),
                                    named_parameters=[(prefix + n, q) for n, q in head.named_parameters()])
    rank, size = psrt.rank(), psrt.size()
    per = BATCH // size
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if args.scaler else None
    for step in range(opt.global_step, args.steps):
        if step == args.crash_at and rank == 0 and not restarted:
            os._exit(3)
        ids, y = batch(step)
        ids, y = ids[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(forward(table, head, ids, args.bag, step in args.sit_out), y)
        if scaler is None:
            loss.backward()
            opt.step()
            continue
        scaler.scale(loss).backward()
        if args.unscale:
            scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
    opt.synchronize()
    if rank == 0:
        final = table.rows(torch.arange(VOCAB))  # once every worker's last step is applied
        torch.save({"initial": initial, "final": final, "head": head.state_dict()}, args.out)


if __name__ == "__main__":
    main()
