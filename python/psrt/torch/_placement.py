"""Where a torch optimizer runs: the servers' settings for one of theirs
(SGD, Adam, AdamW, Adagrad over float32), or the workers (any other, in sync
jobs; worker_optimizer.py)."""

import torch

import psrt


_SUPPORTED = {
    torch.optim.SGD: "sgd",
    torch.optim.Adam: "adam",
    torch.optim.AdamW: "adamw",
    torch.optim.Adagrad: "adagrad",
}


def _server_optimizer(optimizer, group):
    """The server-side settings for one param group, or a clear refusal."""
    kind = _SUPPORTED.get(type(optimizer))
    if kind is None:
        raise psrt.PsrtError(
            "psrt.DistributedOptimizer: %s cannot run on the parameter servers; use "
            "torch.optim.SGD, Adam, AdamW or Adagrad, or run it on the workers (sync jobs: "
            "optimizer_on=\"workers\")" % type(optimizer).__name__)
    for flag in ("maximize", "amsgrad", "differentiable"):
        if group.get(flag):
            raise psrt.PsrtError("psrt.DistributedOptimizer: %s with %s=True is not supported "
                                 "on the parameter servers" % (type(optimizer).__name__, flag))
    cfg = {"name": kind, "lr": float(group["lr"]),
           "weight_decay": float(group.get("weight_decay", 0.0))}
    if kind == "sgd":
        cfg.update(momentum=float(group.get("momentum", 0.0)),
                   dampening=float(group.get("dampening", 0.0)),
                   nesterov=bool(group.get("nesterov", False)))
    elif kind in ("adam", "adamw"):
        beta1, beta2 = group["betas"]
        cfg.update(beta1=float(beta1), beta2=float(beta2), eps=float(group["eps"]))
    else:
        cfg.update(lr_decay=float(group.get("lr_decay", 0.0)), eps=float(group["eps"]),
                   initial_accumulator_value=float(group.get("initial_accumulator_value", 0.0)))
    return cfg


def _on_workers(optimizer, optimizer_on):
    """Whether `optimizer` runs on the workers (worker_optimizer.py): where
    asked, or ("auto") in a sync job where the servers cannot run it (its
    kind, a setting, or parameters that are not float32)."""
    if optimizer_on not in ("auto", "servers", "workers"):
        raise psrt.PsrtError("psrt.DistributedOptimizer: optimizer_on is \"auto\", \"servers\" or "
                             "\"workers\"; got %r" % (optimizer_on,))
    if optimizer_on != "auto":
        return optimizer_on == "workers"
    if psrt._client is None or not psrt.client().is_sync():
        return False  # the servers' refusal, if any, says why
    try:
        for group in optimizer.param_groups:
            _server_optimizer(optimizer, group)
    except psrt.PsrtError:
        return True
    return any(p.dtype != torch.float32 for g in optimizer.param_groups for p in g["params"])
