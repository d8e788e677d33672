"""torchvision's ResNet-18 on CIFAR-10-shaped data through psrt.

Synthetic 32x32 RGB images in 10 classes (each class a fixed pattern plus
noise, so the loss falls; no download), SGD with momentum, weight decay and a
cosine learning-rate schedule, BatchNorm's running statistics averaged over
the workers every step. Rank 0 prints the loss and samples/s.

    build/bin/psrt-run --local=2 --distribution='{"parameter_server": {"enabled": true}}' \\
      -- .venv/bin/python examples/torch_resnet18.py

The psrt-specific lines are marked "psrt:".
"""

import argparse
import sys
import time

import torch
import torchvision

import psrt.torch as psrt


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32, help="images per step and worker")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--log-every", type=int, default=20)
    args = p.parse_args()
    psrt.init()  # psrt: join the job psrt-run started
    rank, size = psrt.rank(), psrt.size()
    torch.set_num_threads(1)

    # CIFAR-shaped data: every worker draws its own batches around the same
    # class patterns.
    patterns = torch.randn(10, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    data = torch.Generator().manual_seed(1 + rank)

    torch.manual_seed(rank)  # different on every rank: rank 0's values win
    model = torchvision.models.resnet18(num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    # psrt: the servers run SGD with momentum; BatchNorm statistics are averaged.
    opt = psrt.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    loss_fn = torch.nn.CrossEntropyLoss()
    if rank == 0:
        print("example: ResNet-18, %d workers, %d steps of %d images each" % (size, args.steps, args.batch), flush=True)
    start, first = time.monotonic(), None
    for step in range(args.steps):
        labels = torch.randint(0, 10, (args.batch,), generator=data)
        images = patterns[labels] + torch.randn(args.batch, 3, 32, 32, generator=data)
        opt.zero_grad()
        loss = loss_fn(model(images), labels)
        loss.backward()
        opt.step()
        schedule.step()
        first = loss.item() if first is None else first
        if rank == 0 and ((step + 1) % args.log_every == 0 or step + 1 == args.steps):
            rate = (step + 1) * args.batch * size / (time.monotonic() - start)
            print("step %d/%d loss %.4f samples/s %.0f" % (step + 1, args.steps, loss.item(), rate), flush=True)
    if rank == 0:
        print("example: done: loss %.4f -> %.4f" % (first, loss.item()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
