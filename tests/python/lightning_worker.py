"""A Lightning job for test_lightning.py: a small CNN with BatchNorm, SGD
with momentum under a StepLR schedule, gradient clipping, optionally
gradient accumulation and bf16 autocast, on synthetic 8x8 images.

Under psrt-run it trains with PsrtStrategy and saves, per rank, the final
parameters, the samples it read in order and what Lightning thought of its
place. With --reference N it is one process with Lightning's own
single-device strategy on the global batch of N workers: each step's batch
is the N workers' batches together in rank order, as DistributedSampler
deals them, and each worker's part goes through the model on its own (its
BatchNorm statistics are its own), their losses averaged: one process on
the mean gradient.
"""

import argparse
import json
import os

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

SAMPLES, PER_DEVICE, CLASSES = 64, 4, 4


class Images(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(SAMPLES, 1, 8, 8, generator=g)
        self.y = torch.randint(0, CLASSES, (SAMPLES,), generator=g)
        self.read = []

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        self.read.append(int(i))
        return self.x[i], self.y[i]


class Net(L.LightningModule):
    def __init__(self, parts=1, optimizer="sgd", name="body"):
        super().__init__()
        torch.manual_seed(0)
        self.parts = parts  # the reference's workers, each through the model on its own
        self.optimizer = optimizer
        # The layers' name: the parameters' names are the servers' keys, each
        # model of a job of several (--configs) its own.
        self.layers_name = name
        self.add_module(name, torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, CLASSES)))

    def layers(self):
        return getattr(self, self.layers_name)

    def training_step(self, batch, i):
        x, y = batch
        losses = [torch.nn.functional.cross_entropy(self.layers()(xs), ys)
                  for xs, ys in zip(x.chunk(self.parts), y.chunk(self.parts))]
        loss = sum(losses) / self.parts
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        if self.optimizer == "rmsprop":  # one the servers do not run: on the workers
            opt = torch.optim.RMSprop(self.parameters(), lr=0.01, momentum=0.5)
        else:
            opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        g = torch.Generator().manual_seed(2)
        while True:
            yield torch.randn(1, 8, 8, generator=g), torch.randint(0, CLASSES, (), generator=g)


class Interleaved(Sampler):
    """The global batches of `workers` DistributedSamplers."""

    def __init__(self, dataset, workers):
        self.samplers = [DistributedSampler(dataset, workers, r, shuffle=True, seed=0) for r in range(workers)]
        self.epoch = 0

    def __len__(self):
        return sum(len(s) for s in self.samplers)

    def __iter__(self):
        for s in self.samplers:
            s.set_epoch(self.epoch)
        self.epoch += 1
        orders = [list(s) for s in self.samplers]
        for t in range(0, len(orders[0]), PER_DEVICE):
            for order in orders:
                yield from order[t:t + PER_DEVICE]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--accumulation", type=int, default=1)
    ap.add_argument("--precision", default="32-true")
    ap.add_argument("--reference", type=int, default=0)
    ap.add_argument("--iterable", action="store_true", help="the data as an IterableDataset")
    ap.add_argument("--resume", help="fit's ckpt_path")
    ap.add_argument("--optimizer", choices=["sgd", "rmsprop"], default="sgd")
    ap.add_argument("--name", default="body", help="the layers' name (Net)")
    ap.add_argument("--configs", help="a JSON list of argument lists: one after the other in this job, the "
                    "i-th with --name ci and its files under OUT.ci")
    ap.add_argument("--out", required=True)
    opts = ap.parse_args(argv)
    if opts.configs:
        for i, args in enumerate(json.loads(opts.configs)):
            main(args + ["--name", "c%d" % i, "--out", "%s.c%d" % (opts.out, i)])
        return
    L.seed_everything(0)
    data = Images()
    common = dict(max_steps=opts.steps, accumulate_grad_batches=opts.accumulation, gradient_clip_val=0.5,
                  accelerator="cpu", devices=1, enable_progress_bar=False, enable_model_summary=False,
                  log_every_n_steps=1)
    if opts.precision == "16-mixed-cpu-scaler":
        # fp16 autocast with a GradScaler on the CPU (Lightning gives a CPU
        # "16-mixed" no scaler): the path CUDA's AMP takes, with the clip.
        from lightning.pytorch.plugins.precision import MixedPrecision
        common["plugins"] = [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", init_scale=1024.0))]
    else:
        common["precision"] = opts.precision
    if opts.reference:
        model = Net(parts=opts.reference, optimizer=opts.optimizer, name=opts.name)
        loader = DataLoader(data, batch_size=PER_DEVICE * opts.reference, sampler=Interleaved(data, opts.reference))
        L.Trainer(default_root_dir=opts.out + ".reference", **common).fit(model, loader)
        torch.save({k: v.detach().clone() for k, v in model.named_parameters()}, opts.out + ".reference.pt")
        return
    from psrt.torch.lightning import PsrtStrategy
    import psrt.torch as psrt
    model = Net(optimizer=opts.optimizer, name=opts.name)
    psrt.init()
    root = "%s.rank%d" % (opts.out, psrt.rank())
    if opts.resume and opts.iterable:
        # Both refusals in one job: ckpt_path's, at fit's start before any
        # optimizer is made (printed), then the IterableDataset's.
        try:
            L.Trainer(strategy=PsrtStrategy(), default_root_dir=root, **common).fit(
                model, DataLoader(data, batch_size=PER_DEVICE, shuffle=True), ckpt_path=opts.resume)
        except psrt.PsrtError as e:
            print("rank %d: refused: %s" % (psrt.rank(), e), flush=True)
        opts.resume = None
    trainer = L.Trainer(strategy=PsrtStrategy(), default_root_dir=root, **common)
    if opts.iterable:
        loader = DataLoader(Stream(), batch_size=PER_DEVICE)
    else:
        loader = DataLoader(data, batch_size=PER_DEVICE, shuffle=True)
    trainer.fit(model, loader, ckpt_path=opts.resume)
    rank = psrt.rank()
    torch.save({k: v.detach().clone() for k, v in model.named_parameters()}, "%s.rank%d.pt" % (opts.out, rank))
    files = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
    with open("%s.rank%d.json" % (opts.out, rank), "w") as f:
        json.dump({"read": data.read, "global_rank": trainer.global_rank, "world_size": trainer.world_size,
                   "is_global_zero": trainer.is_global_zero, "files": files,
                   "logged": float(trainer.callback_metrics["train_loss"])}, f)


if __name__ == "__main__":
    main()
