"""torch.amp.GradScaler's hand-off to DistributedOptimizer.step(): its
scale and found-inf flag, which step() takes instead of letting the scaler
unscale .grad (its in-place unscale bumps no version counter, so step()
could not tell otherwise that a scaler is at work)."""

import torch

import psrt
from psrt.torch import embedding


def scale_and_found_inf(optimizer):
    """(scale, found_inf) when torch.amp.GradScaler.step() called step():
    scale is None where scaler.unscale_(opt) ran already; found_inf says
    whether the (unscaled) gradients hold Inf or NaN. (None, None) without
    a scaler."""
    found_inf = getattr(optimizer, "found_inf", None)
    if found_inf is None:
        return None, None
    return getattr(optimizer, "grad_scale", None), bool(found_inf.item())


def refuse_unreachable(scale, found_inf, hold):
    """Refuses a scaler whose gradients step() cannot unscale: sent during
    backward() (`hold` False), or table rows scaler.unscale_ missed."""
    if found_inf is not None and not hold:
        raise psrt.PsrtError(
            "psrt.DistributedOptimizer: GradScaler.step() on gradients that went to the servers "
            "during backward(), still scaled (mean_grads=False, or a first step without the "
            "scaler). Pass mean_grads=True (or leave it None and use the scaler from the first "
            "step on)")
    if found_inf is not None and scale is None and embedding.tables_have_gradients():
        raise psrt.PsrtError(
            "psrt.DistributedOptimizer: scaler.unscale_(opt) does not reach psrt.torch.Embedding's "
            "rows (they are not in the optimizer), so their gradients are still scaled. Call "
            "scaler.step(opt) without unscale_ first, and step() unscales them all")


def unscale(variables, scale):
    """Divides the gradients by the loss scale as GradScaler.unscale_ does
    (its kernel, its float64 reciprocal), so the bits are one process's.
    Returns the reciprocal, for the tables' rows."""
    inv_scale = scale.double().reciprocal().float()
    by_device = {}
    for v in variables:
        if v.param.grad is not None:
            by_device.setdefault(v.param.grad.device, []).append(v.param.grad)
    for device, grads in by_device.items():
        torch._amp_foreach_non_finite_check_and_unscale_(grads, torch.zeros((), device=device),
                                                         inv_scale.to(device))
    return inv_scale
