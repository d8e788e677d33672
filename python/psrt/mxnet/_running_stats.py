"""Arrays Gluon broadcasts but never pushes (BatchNorm's running_mean and
running_var): in sync mode every worker's become their mean with each step,
as one process on the whole batch would have them; in async and ssp each
worker keeps its own, as with MXNet's dist_async."""

import mxnet as mx
import numpy as np

from psrt import _host
from psrt.mxnet._arrays import _assign, _is_sparse, _outputs


class _RunningStats:
    """Which broadcast arrays are running statistics, and their averaging
    over the workers."""

    def __init__(self, client, keys):
        self._client = client
        self._keys = keys       # _registration._Registry, which holds the arrays
        self._averaged = None   # key -> its variable, for those averaged; decided once
        self._factor = None     # 1 if the servers average pushes, the worker count if they sum

    def found(self, keys, values, outs):
        """The keys a broadcast gives arrays without a gradient, each with
        this worker's mean of them. Gluon broadcasts each parameter from its
        own first array; those without a gradient (BatchNorm's running
        statistics) it never pushes. They become plain keys, which the
        averaging over the workers writes (so checkpoints hold it)."""
        own = {}
        for k, v, o in zip(keys, values, outs):
            arrays = [a for a in _outputs(o) if not _is_sparse(a)]
            if (arrays and _outputs(v)[0] is arrays[0] and all(a.grad is None for a in arrays)
                    and not self._keys.registered_or_pending(k)):
                self._keys.broadcast_only[k] = arrays
                own[k] = sum(a.asnumpy() for a in arrays) / len(arrays)
        return own

    def broadcast(self, own):
        """Gluon broadcasts rank 0's arrays (after the first forward pass
        where its store starts late, so that each worker's statistics moved
        already): each worker keeps its own until the step's end takes their
        mean, once a step, so that the keys' version is the step (a
        checkpoint of step T holds step T's statistics). A restored job
        takes the checkpoint's."""
        if own and self._client.is_sync() and not self._client.restored_step():
            with mx.autograd.pause():
                for k, value in own.items():
                    for dst in self._keys.broadcast_only[k]:
                        _assign(dst, value)

    def step_end(self):
        """Sync: every worker's running statistics become their mean. Which
        broadcast arrays are such is decided once, with every worker: those
        never pushed that changed on some worker since (frozen parameters
        do not change and are left alone)."""
        if not self._client.is_sync():
            return
        arrays, pushed = self._keys.broadcast_only, self._keys.pushed
        if self._averaged is None:
            candidates = [k for k in arrays if k not in pushed and k in self._keys.names]
            self._averaged = {}
            if not candidates:
                return
            self._averaged = self._changed(candidates)
        keys = [k for k in self._averaged if k in arrays and k not in pushed]
        if keys:
            # Several devices per worker: their mean first.
            self._average(keys, [sum(a.asnumpy() for a in arrays[k]) / len(arrays[k])
                                 for k in keys])

    def _changed(self, candidates):
        """Those of the keys whose arrays changed on some worker since they
        registered, each with its variable."""
        arrays = self._keys.broadcast_only
        start = {k: self._keys.pull(k) for k in candidates}
        changed = np.array([float(not np.array_equal(arrays[k][0].asnumpy().reshape(-1),
                                                     start[k].reshape(-1))) for k in candidates],
                           dtype=np.float32)
        (changed,), _ = _host.allreduce(self._client, [self._keys.name(".aux_changed")], [changed],
                                        [changed.shape])
        return {k: self._keys.names[k] for k, c in zip(candidates, changed) if c > 0}

    def _aggregation(self):
        """1 if the servers average a sync step's pushes, the number of
        workers if they sum them (the job's gradient_aggregation); counted
        once, with every worker, where they sum."""
        if self._factor is None:
            _, self._factor = _host.allreduce(self._client, [self._keys.name(".aggregation")],
                                              [np.ones(1)], [(1,)])
        return self._factor

    def _average(self, keys, values):
        """Writes the workers' mean of `values` into the keys' arrays. The
        servers hold the mean too (summing servers get each value divided by
        the worker count), so a checkpoint keeps it."""
        factor = np.float32(self._aggregation())
        values = [v / factor for v in values] if factor != 1 else values
        for k, mean in zip(keys, self._keys.push_pull(keys, values)):
            with mx.autograd.pause():
                for dst in self._keys.broadcast_only[k]:
                    _assign(dst, mean)
