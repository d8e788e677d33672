"""A training process for the plugin's tests, started by psrt-run.

A small MLP on random regression data; rank r's batch at step s is drawn from
seed (s, r), so the test can replay all ranks' batches in one process. Rank 0
writes the final parameters (torch.save) to --out.
"""

import argparse
import json
import sys
import time

import torch

import psrt.torch as psrt


def build_model():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def batch(step, rank, n=16):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(n, 8, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    return x, y


def make_optimizer(kind, model):
    """Param groups (the last layer with its own settings) and a scheduler for SGD."""
    first, last = list(model[0].parameters()), list(model[2].parameters())
    if kind == "sgd":
        opt = torch.optim.SGD([{"params": first}, {"params": last, "lr": 0.05, "nesterov": True}],
                              lr=0.1, momentum=0.9, weight_decay=1e-3)
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-3), None
    if kind == "adamw":
        return torch.optim.AdamW([{"params": first}, {"params": last, "weight_decay": 0.0}], lr=1e-2), None
    if kind == "adagrad":
        return torch.optim.Adagrad(model.parameters(), lr=0.1, lr_decay=0.01), None
    raise ValueError(kind)


class TwoHeads(torch.nn.Module):
    """A trunk with a main head and an auxiliary one that is used on some
    steps by some ranks only (its .grad is None on the others), as with a
    multi-task head or a mixture of experts' routing."""

    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh())
        self.main = torch.nn.Linear(16, 1)
        self.aux = torch.nn.Linear(16, 1)

    def forward(self, x, use_aux):
        h = self.trunk(x)
        return self.main(h), self.aux(h) if use_aux else None


def uses_aux(step, rank):
    """Every rank on steps 0, 3, ...; rank 0 alone on 1, 4, ...; none on 2, 5, ..."""
    return step % 3 == 0 or (step % 3 == 1 and rank == 0)


def two_heads_loss(model, step, rank):
    x, y = batch(step, rank)
    out, aux = model(x, uses_aux(step, rank))
    loss = torch.nn.functional.mse_loss(out, y)
    return loss if aux is None else loss + torch.nn.functional.mse_loss(aux, -y)


def make_two_heads_optimizer(kind, model):
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2)
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-3)
    if kind == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    raise ValueError(kind)


def train_two_heads(args, rank, prefix=""):
    """--unused-head: TwoHeads, the auxiliary head without a gradient on
    some steps; --clip: a clip of the global norm after backward()."""
    torch.manual_seed(rank)  # rank 0's initial values must win
    model = TwoHeads()
    opt = psrt.DistributedOptimizer(make_two_heads_optimizer(args.optimizer, model),
                                    named_parameters=[(prefix + n, q) for n, q in model.named_parameters()],
                                    compression=psrt.Compression.none)
    for step in range(args.steps):
        opt.zero_grad()
        two_heads_loss(model, step, rank).backward()
        if args.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)
    return 0


def check_overlap(model, opt):
    """step() has not waited: the layers still hold the old weights. The
    first layer's forward lands its own and only its own; synchronize()
    lands the rest."""
    first, last = model[0].weight.detach().clone(), model[2].weight.detach().clone()
    x = batch(0, 0)[0]
    model[0](x)
    assert not torch.equal(model[0].weight, first), "the first layer's forward did not land its weights"
    assert torch.equal(model[2].weight, last), "the last layer's weights landed before its forward"
    opt.synchronize()
    assert not torch.equal(model[2].weight, last), "synchronize() did not land the last layer's weights"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--passes", type=int, default=1, help="backward passes per step")
    p.add_argument("--out", required=True)
    p.add_argument("--skip-init", action="store_true", help="forget psrt.init() (a test of the error)")
    p.add_argument("--foreign-params", action="store_true",
                   help="name parameters that are not the optimizer's (a test of the error)")
    p.add_argument("--check-overlap", action="store_true",
                   help="after each step, check that each layer gets its new weights at its own forward")
    p.add_argument("--late", help="elastic jobs: the last rank joins once rank 0 made its first step "
                   "and wrote this file")
    p.add_argument("--step-sleep", type=float, default=0, help="seconds each step takes longer")
    p.add_argument("--device", default="cpu", help="where the model and its gradients live")
    p.add_argument("--unused-head", action="store_true",
                   help="TwoHeads: a head without a gradient on some steps and ranks")
    p.add_argument("--clip", type=float, default=0, help="--unused-head: clip_grad_norm_ to this")
    p.add_argument("--configs", help="a JSON list of argument lists: one after the other in this job (the "
                   "framework imported once), the i-th's parameters named ci/NAME, its --out OUT.ci")
    args = p.parse_args()
    # Outside psrt-run (no PSRT_RANK) psrt.init() makes a job of one.
    rank = int(__import__("os").environ.get("PSRT_RANK", "0"))
    if args.configs:
        for i, config in enumerate(json.loads(args.configs)):
            code = train(p.parse_args(config + ["--out", "%s.c%d" % (args.out, i)]), rank, "c%d/" % i)
            if code:
                return code
        return 0
    return train(args, rank)


def train(args, rank, prefix=""):
    """One run of main's arguments; `prefix` begins each parameter's name."""
    if args.unused_head:
        psrt.init()
        return train_two_heads(args, rank, prefix)
    if args.late and rank == int(__import__("os").environ["PSRT_WORLD_SIZE"]) - 1:
        while not __import__("os").path.exists(args.late):
            time.sleep(0.05)
    if not args.skip_init:
        psrt.init()
    torch.manual_seed(rank)  # rank 0's initial values must win
    model = build_model().to(args.device)
    opt, scheduler = make_optimizer(args.optimizer, model)
    named = build_model().named_parameters() if args.foreign_params else model.named_parameters()
    named = [(prefix + n, q) for n, q in named]
    def scale_lr(old, new):
        """The linear scaling rule: the learning rate follows the global batch."""
        for group in opt.param_groups:
            lr = group["lr"]
            group["lr"] = lr * new / old
            print("rank %d: workers %d -> %d, lr %g -> %g" % (rank, old, new, lr, group["lr"]), flush=True)

    opt = psrt.DistributedOptimizer(opt, named_parameters=named, compression=psrt.Compression.none,
                                    backward_passes_per_step=args.passes, on_workers_change=scale_lr)
    for step in range(opt.global_step, args.steps):
        opt.zero_grad()
        for k in range(args.passes):
            x, y = batch(step * args.passes + k, rank)
            torch.nn.functional.mse_loss(model(x.to(args.device)), y.to(args.device)).backward()
        opt.step()
        if args.late and rank == 0 and not __import__("os").path.exists(args.late):
            open(args.late, "w").close()  # the first step is made
        time.sleep(args.step_sleep)
        if args.check_overlap:
            check_overlap(model, opt)
        if scheduler is not None:
            scheduler.step()
    if rank == 0:
        torch.save({k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, args.out)
        # The wrapper's state is honest: hyperparameters here, the rest on the
        # servers; a local torch optimizer's per-parameter state is refused.
        state = opt.state_dict()
        assert "psrt" in state and "state" not in state, state
        opt.load_state_dict(state)
        local, _ = make_optimizer(args.optimizer, model)
        model(batch(0, 0)[0]).sum().backward()
        local.step()
        try:
            opt.load_state_dict(local.state_dict())
            raise AssertionError("a torch optimizer's state was taken")
        except psrt.PsrtError as e:
            assert "lives on the parameter servers" in str(e), e
    return 0


if __name__ == "__main__":
    sys.exit(main())
