"""Sparse tables through host (numpy) buffers, for the plugins whose tensors
reach Python as numpy arrays (TensorFlow, MXNet): registration, the step
counter, pulls of distinct rows and pushes of their gradients. The work
happens in C++ behind the C API (psrt._psrt); psrt.torch.Embedding does the
same on torch tensors (docs/sparse.md)."""

import os

import numpy as np

import psrt
from psrt import _host


def int_ids(table, ids):
    """`ids` as an int64 array. Float ids (MXNet's NDArrays and Keras's
    inputs are float32 unless asked otherwise; both frameworks cast them)
    pass only as whole numbers the dtype holds exactly: a cast would
    truncate 2.5 to 2, and a float32 past 2**24 may be another id rounded.
    Other dtypes are refused."""
    ids = np.asarray(ids)
    if ids.dtype.kind in "iu":
        return ids.astype(np.int64, copy=False)
    if ids.dtype.kind != "f":
        raise psrt.PsrtError("table '%s': ids of dtype %s; ids are integers" % (table, ids.dtype))
    exact = 2 ** (np.finfo(ids.dtype).nmant + 1)
    bad = ~((np.floor(ids) == ids) & (np.abs(ids) <= exact))
    if bad.any():
        raise psrt.PsrtError("table '%s': ids of dtype %s must be whole numbers of magnitude at most %d "
                             "(held exactly); got %r" % (table, ids.dtype, exact, ids[bad].flat[0].item()))
    return ids.astype(np.int64)


def merge(pieces):
    """One gradient per distinct id from several (ids, grads) pieces (one
    per lookup or device): the ids sorted, the gradients of an id summed."""
    pieces = [(np.asarray(i, dtype=np.int64).reshape(-1), np.asarray(g, dtype=np.float32))
              for i, g in pieces]
    if len(pieces) == 1 and np.all(np.diff(pieces[0][0]) > 0):
        return pieces[0]
    ids, inverse = np.unique(np.concatenate([i for i, _ in pieces]), return_inverse=True)
    grads = np.concatenate([g.reshape(-1, g.shape[-1]) for _, g in pieces])
    summed = np.zeros((ids.size, grads.shape[1]), dtype=np.float32)
    np.add.at(summed, inverse.reshape(-1), grads)
    return ids, summed


_ASSIGN = {"name": "assign", "lr": 0.0}


def start_from(client, table, dim, rows):
    """Starts `table`'s rows at rank 0's `rows()` (ids and their float32
    rows, computed on rank 0 only; other ids start as the table's options
    say), once per job; returns when every row is in, on every rank.

    Rank 0 sends the rows once (in messages of a few MiB) and only if the
    servers have never started the table: a rank 0 that restarts, a job
    restored from a checkpoint and a worker that joins later all find the
    rows there (and maybe trained). Two one-float variables beside the table
    decide it, through registration's own rule that rank 0's first value
    wins: "<table>@start", which rank 0 registers with a random value (the
    rows are rank 0's to send if its value won), and "<table>@started", which
    rank 0 registers once the rows are in and which every other rank's
    registration waits for (rank 0's value pulled, within the pull's
    deadline). Registration is not a step, so sync, async and ssp jobs alike
    start so; both variables are checkpointed with the table.
    """
    marks = _host.HostVariables(client, psrt.Compression.none)
    if client.rank() == 0:
        mine = np.frombuffer(os.urandom(4), np.uint32).astype(np.float32)
        if np.array_equal(marks.register(table + "@start", mine, _ASSIGN), mine):
            ids, values = rows()
            ids = np.ascontiguousarray(ids, dtype=np.int64)
            values = np.ascontiguousarray(values, dtype=np.float32)
            if values.shape != (ids.size, dim):
                raise psrt.PsrtError("table '%s': %d ids with starting rows of shape %s; rows have %d values"
                                     % (table, ids.size, values.shape, dim))
            if ids.size:
                client.assign_rows(table, ids.ctypes.data, ids.size, values.ctypes.data)
    marks.register(table + "@started", np.ones(1, np.float32), _ASSIGN)


class HostTable:
    """A table registered with the servers, pulled and pushed from numpy.

    Keeps the step to pull at and push for: the servers' version in sync mode
    (every worker pushes once per step; a worker restarted or joining a
    running job starts where the table is) or this worker's clock otherwise,
    counted from the restored step, as psrt.torch.Embedding does.
    """

    def __init__(self, what, name, dim, vocab, optimizer, seed, init_std, max_rows, evict_after_steps,
                 evict_min_count, compression):
        if vocab < 0 or dim <= 0:
            raise psrt.PsrtError("%s: the vocabulary must be >= 0 (0: an open hash table) and the row "
                                 "size > 0; got %s and %s" % (what, vocab, dim))
        self.name, self.dim, self.vocab = name, int(dim), int(vocab)
        self._client = psrt.client()
        self._client.register_table(name, self.dim, self.vocab, int(seed), float(init_std), int(max_rows),
                                    int(evict_after_steps), int(evict_min_count), optimizer,
                                    compression.value, compression.value)
        self.step = self._client.next_step(name)

    def pull(self, ids):
        """The rows (n, dim) of n distinct ids at this worker's step (sync:
        once every worker's pushes of the steps before are applied)."""
        ids = np.ascontiguousarray(int_ids(self.name, ids)).reshape(-1)
        out = np.empty((ids.size, self.dim), dtype=np.float32)
        if ids.size:
            self._client.wait(self._client.pull_rows(self.name, ids.ctypes.data, ids.size, out.ctypes.data,
                                                     self.step))
        return out

    def rows(self, ids):
        """The rows of any ids (repeats allowed), shaped ids.shape + (dim,)."""
        ids = int_ids(self.name, ids)
        distinct, inverse = np.unique(ids.reshape(-1), return_inverse=True)
        return self.pull(distinct)[inverse.reshape(-1)].reshape(ids.shape + (self.dim,))

    def push(self, pieces):
        """Pushes this step's gradients, (ids, grads) pieces merged per id,
        and waits until the servers have them. Sync mode needs one push per
        worker and step, with no rows (no pieces) if the step had none."""
        if pieces:
            ids, grads = merge(pieces)
        else:
            ids, grads = np.empty(0, dtype=np.int64), np.empty((0, self.dim), dtype=np.float32)
        ids, grads = np.ascontiguousarray(ids), np.ascontiguousarray(grads, dtype=np.float32)
        if grads.shape != (ids.size, self.dim):
            raise psrt.PsrtError("table '%s': %d ids with gradients of shape %s; rows have %d values"
                                 % (self.name, ids.size, grads.shape, self.dim))
        self._client.wait(self._client.push_rows(self.name, ids.ctypes.data, ids.size, grads.ctypes.data,
                                                 self.step))
        self.step += 1
