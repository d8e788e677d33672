"""A training process of test_torch_worker_optimizer.py: optimizers the
servers do not run, on the workers, each case against one process on the
mean of the workers' gradients (the reference, computed here on every rank
from every rank's batches). Prints "rank R: case C passed" or why not."""

import argparse
import copy
import sys
import time

import torch
from torch import nn

import psrt.torch as psrt

WORKERS, STEPS, BATCH = 2, 4, 8


class Encoder(nn.Module):
    """torch's own Transformer layer under a classifier head."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.embed = nn.Linear(6, 16)
        self.layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, 3)
        self.to(dtype)

    def forward(self, x):
        return self.head(self.layer(self.embed(x)).mean(dim=1))


class ConvBN(nn.Module):
    """A convolution with BatchNorm: running statistics as buffers."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


def batch(case, rank, step, dtype):
    g = torch.Generator().manual_seed(1000 * step + rank)
    shape = (BATCH, 2, 5, 5) if case == "batchnorm" else (BATCH, 4, 6)
    return torch.randn(shape, generator=g).to(dtype), torch.randint(0, 3, (BATCH,), generator=g)


def build(case):
    dtype = torch.bfloat16 if case == "bf16" else torch.float32
    torch.manual_seed(0)
    model = ConvBN() if case == "batchnorm" else Encoder(dtype)
    params = list(model.parameters())
    if case == "rmsprop":
        opt = torch.optim.RMSprop(params, lr=0.01, momentum=0.9, centered=True)
    elif case == "nadam":
        opt = torch.optim.NAdam(params, lr=0.01, weight_decay=0.01)
    elif case == "lbfgs":
        opt = torch.optim.LBFGS(params, lr=0.5, max_iter=3, history_size=4)
    elif case == "adafactor":
        from transformers.optimization import Adafactor
        opt = Adafactor(params, lr=0.01, relative_step=False, scale_parameter=False, warmup_init=False)
    elif case == "groups":
        opt = torch.optim.RMSprop([{"params": params[:4], "lr": 0.02}, {"params": params[4:]}], lr=0.002)
    elif case == "amsgrad":
        opt = torch.optim.Adam(params, lr=0.01, amsgrad=True)
    elif case in ("bf16", "batchnorm"):
        opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return model, opt, dtype


def loss_of(model, x, y):
    return nn.functional.cross_entropy(model(x).float(), y)


def reference(case):
    """One process: each step, every rank's batch from the same weights and
    buffers, their mean gradient (clipped where the case clips) and the mean
    of the buffers they leave, then the optimizer's step."""
    model, opt, dtype = build(case)
    for step in range(STEPS):
        def mean_gradient():
            start = copy.deepcopy(list(model.buffers()))
            opt.zero_grad()
            total, ends = 0.0, []
            for rank in range(WORKERS):
                for b, s in zip(model.buffers(), start):
                    b.copy_(s)
                x, y = batch(case, rank, step, dtype)
                loss = loss_of(model, x, y) / WORKERS
                loss.backward()
                total += loss.item()
                ends.append([b.clone() for b in model.buffers()])
            with torch.no_grad():
                for i, b in enumerate(model.buffers()):
                    if b.dtype.is_floating_point:
                        b.copy_(sum(e[i] for e in ends) / WORKERS)
            if case == "batchnorm":
                nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            return torch.tensor(total)
        if case == "lbfgs":
            opt.step(mean_gradient)
        else:
            mean_gradient()
            opt.step()
    return model


def wrapped(case, on="auto"):
    """The case's model and its optimizer wrapped, the case's variables
    under their own names (the cases share one job)."""
    model, opt, dtype = build(case)
    opt = psrt.DistributedOptimizer(opt, named_parameters=[(case + "." + n, p) for n, p in model.named_parameters()],
                                    optimizer_on=on)
    assert type(opt).__name__ == "WorkerOptimizer", type(opt)
    return model, opt, dtype


def take_step(case, model, opt, x, y):
    def closure():
        opt.zero_grad()
        loss = loss_of(model, x, y)
        loss.backward()
        return loss
    if case == "lbfgs":
        opt.step(closure)
    else:
        closure()
        if case == "batchnorm":
            nn.utils.clip_grad_norm_(model.parameters(), 0.05)  # on the mean gradient
        opt.step()


def train(case, rank):
    model, opt, dtype = wrapped(case, "workers" if case == "batchnorm" else "auto")
    for step in range(STEPS):
        take_step(case, model, opt, *batch(case, rank, step, dtype))
    return model


def compare(case, rank):
    got, want = train(case, rank), reference(case)
    start, _, _ = build(case)
    atol = 1e-2 if case == "bf16" else 1e-5
    worst = max((a.float() - b.float()).abs().max().item()
                for a, b in zip(got.state_dict().values(), want.state_dict().values()) if a.is_floating_point())
    moved = max((a.float() - b.float()).abs().max().item()
                for a, b in zip(start.state_dict().values(), want.state_dict().values()) if a.is_floating_point())
    if worst <= atol < moved:
        print("rank %d: case %s passed (%.2g off, moved %.2g)" % (rank, case, worst, moved), flush=True)
    else:
        print("rank %d: case %s FAILED: %.3g off (tolerance %g), moved %.3g" % (rank, case, worst, atol, moved),
              flush=True)


def tamper(rank):
    """A worker's weights changed behind psrt's back: the next check says so."""
    model, opt, dtype = build("rmsprop")
    opt = psrt.DistributedOptimizer(opt, named_parameters=[("tamper." + n, p) for n, p in model.named_parameters()],
                                    check_every=1)
    for step in range(3):
        x, y = batch("rmsprop", rank, step, dtype)
        opt.zero_grad()
        loss_of(model, x, y).backward()
        if step == 1 and rank == 1:
            with torch.no_grad():
                model.head.bias.add_(1e-3)
        try:
            opt.step()
        except psrt.PsrtError as e:
            print("rank %d: case tamper: step %d: %s" % (rank, step, e), flush=True)
            return


def resume(rank, out, stall_at=-1):
    """RMSprop on the Transformer, LBFGS (its history grows) and SGD with
    momentum on the BatchNorm CNN, each on the workers, trained from the
    job's restored step (0 when fresh) to STEPS, then evaluated once; rank 0
    writes every model's weights and buffers to `out`. With `stall_at`, the
    workers wait before that step until the job ends around them (a server
    killed)."""
    runs = [(case,) + wrapped(case, "workers") for case in ("rmsprop", "lbfgs", "batchnorm")]
    print("rank %d: from step %d" % (rank, psrt.restored_step()), flush=True)
    for step in range(psrt.restored_step(), STEPS):
        if step == stall_at:
            print("rank %d: stalls at step %d" % (rank, step), flush=True)
            time.sleep(120)
        for case, model, opt, dtype in runs:
            take_step(case, model, opt, *batch(case, rank, step, dtype))
    with torch.no_grad():  # an evaluation: where no step ran, buffers take their restored values here
        for case, model, _, dtype in runs:
            model.eval()
            model(batch(case, rank, 0, dtype)[0])
    if rank == 0:
        torch.save({case: model.state_dict() for case, model, _, _ in runs}, out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="")
    parser.add_argument("--refusal", default="")
    parser.add_argument("--resume", default="", help="resume(); rank 0 writes the weights there")
    parser.add_argument("--stall-at", type=int, default=-1, help="resume()'s stall_at")
    args = parser.parse_args()
    psrt.init()
    rank = psrt.rank()
    if args.resume:
        resume(rank, args.resume, args.stall_at)
        return 0
    if args.refusal:
        model, opt, _ = build("rmsprop")
        try:
            psrt.DistributedOptimizer(opt, named_parameters=model.named_parameters(), optimizer_on=args.refusal)
            print("rank %d: refusal: none" % rank, flush=True)
        except psrt.PsrtError as e:
            print("rank %d: refusal: %s" % (rank, e), flush=True)
        return 0
    for case in args.cases.split(","):
        if case == "tamper":
            tamper(rank)
        else:
            try:
                compare(case, rank)
            except Exception as e:  # the log says which case, and the job goes on
                print("rank %d: case %s FAILED: %s: %s" % (rank, case, type(e).__name__, e), flush=True)
                raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
