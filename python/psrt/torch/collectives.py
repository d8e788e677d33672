"""psrt.collectives for torch tensors: ``psrt.torch.allreduce(t)`` and the
rest, as Horovod's ``hvd.allreduce``. The tensors go through the CPU; the
results come back on the input's device and in its dtype."""

import torch

from psrt import collectives

# numpy has no bfloat16: such tensors travel as the int16 of their bits
# (allgather and broadcast move bytes) or as float32 (allreduce).
_BITS = {torch.bfloat16: torch.int16}


def _bits(tensor):
    t = tensor.detach().to("cpu").contiguous()
    return t.view(_BITS[t.dtype]) if t.dtype in _BITS else t


def _back(array, like):
    t = torch.from_numpy(array)
    if like.dtype in _BITS:
        t = t.view(like.dtype)
    return t.to(like.device)


def allreduce(tensor, op="average"):
    """The workers' mean ("average") or sum ("sum") of `tensor`."""
    values = tensor.detach().to("cpu", torch.float32).numpy()
    return torch.from_numpy(collectives.allreduce(values, op)).to(tensor.device, tensor.dtype)


def allgather(tensor):
    """Every worker's `tensor` stacked along a new first axis, by rank."""
    return _back(collectives.allgather(_bits(tensor).numpy()), tensor)


def broadcast(tensor, root_rank=0):
    """Rank `root_rank`'s `tensor`."""
    return _back(collectives.broadcast(_bits(tensor).numpy(), root_rank), tensor)


broadcast_object = collectives.broadcast_object
barrier = collectives.barrier
