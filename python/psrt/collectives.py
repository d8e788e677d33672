"""Collectives over the job's workers for the user's own values (a
validation metric's mean, rank 0's choice of early stop), as Horovod's
``hvd.allreduce``/``allgather``/``broadcast``/``broadcast_object``/``barrier``.

Written once here on numpy arrays through psrt_allreduce (worker/reducer.h);
psrt.torch and psrt.tensorflow convert their tensors. Every worker calls the
same collectives in the same order, as with torch.distributed. They need
every worker in each step (a sync job without backup workers, elastic
membership or "on_worker_failure": "continue"): where the membership can
change under a collective, the first call says so.

allreduce computes in float32 (float64 values lose their low bits: use it for
metrics, not for bit-exact state); allgather, broadcast and broadcast_object
move bytes and are exact for any dtype.
"""

import pickle

import numpy as np

import psrt
from psrt import _host

_CHUNK = 1 << 16  # floats a reduction key holds; longer values take several


def _client():
    client = psrt.client()
    try:
        client.every_worker_each_step()
    except psrt.PsrtError as e:
        raise psrt.PsrtError("psrt collectives need every worker: %s" % e) from None
    return client


def _sum(values):
    """The sum over workers of a float32 vector, in chunks of fixed keys."""
    client = _client()
    flat = np.ascontiguousarray(values, np.float32).reshape(-1)
    total = np.empty_like(flat)
    for at in range(0, max(1, flat.size), _CHUNK):
        n = min(_CHUNK, flat.size - at)
        size = 1 << max(0, int(np.ceil(np.log2(max(n, 1)))))  # a key per power of two
        part = np.zeros(size, np.float32)
        part[:n] = flat[at:at + n]
        (got,), _ = _host.allreduce(client, ["psrt.collective/%d" % size], [part], [part.shape], _host.SUM)
        total[at:at + n] = got[:n]
    return total


def allreduce(values, op="average"):
    """The workers' mean ("average") or sum ("sum") of `values` (an array of
    the same shape on every worker)."""
    if op not in ("average", "sum"):
        raise psrt.PsrtError("psrt.allreduce: op is \"average\" or \"sum\"; got %r" % (op,))
    values = np.asarray(values)
    total = _sum(values)
    if op == "average":
        total = total / np.float32(psrt.size())
    return total.reshape(values.shape).astype(values.dtype if values.dtype.kind == "f" else np.float32,
                                              copy=False)


def _bytes(data, slot, slots):
    """Every worker's `data` (bytes, the same length on each where slots > 1)
    in slot `slot` of `slots`, exactly: a byte through the servers' mean and
    back is the same byte once rounded."""
    raw = np.zeros((slots, len(data)), np.float32)
    raw[slot] = np.frombuffer(data, np.uint8)
    return np.rint(_sum(raw)).astype(np.uint8).reshape(slots, len(data))


def allgather(values):
    """Every worker's `values` (the same shape and dtype on each) stacked
    along a new first axis, by rank; exact."""
    values = np.ascontiguousarray(values)
    got = _bytes(values.tobytes(), psrt.rank(), psrt.size())
    return np.frombuffer(got.tobytes(), values.dtype).reshape((psrt.size(),) + values.shape)


def broadcast(values, root_rank=0):
    """Rank `root_rank`'s `values` (the same shape and dtype on every
    worker); exact."""
    _check_root(root_rank)
    values = np.ascontiguousarray(values)
    data = values.tobytes() if psrt.rank() == root_rank else bytes(values.nbytes)
    return np.frombuffer(_bytes(data, 0, 1).tobytes(), values.dtype).reshape(values.shape).copy()


def broadcast_object(obj, root_rank=0):
    """Rank `root_rank`'s picklable `obj`."""
    _check_root(root_rank)
    mine = psrt.rank() == root_rank
    data = pickle.dumps(obj) if mine else b""
    length = int(round(float(_sum(np.array([len(data)], np.float32))[0])))
    got = _bytes(data if mine else bytes(length), 0, 1)
    return obj if mine else pickle.loads(got.tobytes())


def barrier():
    """Returns once every worker has called it."""
    _sum(np.zeros(1, np.float32))


def _check_root(root_rank):
    if not 0 <= root_rank < psrt.size():
        raise psrt.PsrtError("psrt.broadcast: root_rank %r is not a rank of this job's %d workers"
                             % (root_rank, psrt.size()))
