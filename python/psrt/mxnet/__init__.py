"""MXNet plugin: a KVStore named "psrt" (MXNet's own parameter-server API).

    import psrt.mxnet  # registers it
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                            kvstore="psrt")     # or mx.kv.create("psrt")

The store is MXNet's ``dist_sync`` (or, in async and ssp jobs,
``dist_async``) kvstore to Gluon and Module: its ``type`` is
``dist_sync_psrt`` or ``dist_async_psrt``, so every branch MXNet takes on a
distributed store is taken here too (update_on_kvstore by default, async
refuses update_on_kvstore=False, ``Parameter.load`` after the first step is
refused, sparse gradients are pushed). The name "psrt" given as a string
makes a store as ``mx.kv.create("psrt")`` does (MXNet itself drops a store
whose name lacks "dist" in a process with one device).

With ``set_optimizer`` (update_on_kvstore=True) the optimizer runs on psrt's
servers: ``pushpull`` sends gradients and returns the updated weights.
Without it the store is a plain key-value store: a key's value becomes what
the workers push (sync: their aggregate, the job's gradient_aggregation,
mean by default), which is how Gluon's update_on_kvstore=False sums
gradients. ``set_optimizer`` after keys were used moves each key's current
value to a new server variable run by that optimizer (its state starts
fresh, as MXNet's servers start a new optimizer's). ``init`` registers a key
(rank 0's value becomes everyone's, or a restored checkpoint's).

Gluon's Trainer calls ``pushpull`` once per parameter. After the first step
(which shows which keys a step has) those calls only queue their gradients,
and the call for a step's last key sends them all as one push-pull (one
request per server) and writes every weight, before ``Trainer.step`` returns.

``clip_gradient`` clips what MXNet's own servers clip: the aggregated,
rescaled gradient (sync: pushed to a plain key first, its aggregate clipped
on every worker alike, then pushed to the optimizer's key; async and ssp:
each worker's own gradient). Arrays Gluon broadcasts but never pushes
(BatchNorm's running_mean and running_var) are averaged over the workers
with each step in sync mode; in async and ssp each worker keeps its own, as
with MXNet's dist_async.

Sparse tables (docs/sparse.md): a key initialised with a ``row_sparse``
NDArray of shape (vocab, dim), as MXNet's dist kvstore takes row-sparse
weights (Gluon's ``contrib.nn.SparseEmbedding`` with
``Trainer(..., kvstore="psrt")``), becomes a table whose rows live on the
servers. Its rows start as rank 0's init value, sent once before anyone
reads a row (``psrt._tables.start_from``; rows the value lacks start as
zeros), or as N(0, init_std^2) drawn from (seed, id) once ``table_options``
sets init_std (the init value then gives only the shape).
``row_sparse_pull`` reads the rows of given ids; ``push`` (or ``pushpull``)
of a ``row_sparse`` gradient sends its rows, which the servers
update with the optimizer's row-wise form (sgd, adam with ``lazy_update``,
adagrad, ftrl) on the mean over workers. In sync mode every worker pushes
each table once per step, as Gluon's Trainer does. The step a table is
pulled at and pushed for is counted here per table, from where the table is
on the servers (sync) or from ``psrt.restored_step()`` (async, ssp).

This module is MXNet's glue; each concern is a helper of its own:
_registration.py (the keys on the servers), _table_keys.py (the keys that
are tables), _updates.py (where a dense key's updates run),
_learning_rates.py, _gradients.py (the gradients on their way out) and
_running_stats.py (the arrays averaged instead of pushed).
"""

import json

import mxnet as mx
import mxnet.gluon.trainer
import mxnet.model
import mxnet.module.module
import numpy as np

import psrt
from psrt import _host
from psrt.mxnet import _table_keys
from psrt.mxnet._arrays import _first, _is_sparse, _outputs, _write
from psrt.mxnet._gradients import _Gradients
from psrt.mxnet._learning_rates import _LearningRates
from psrt.mxnet._registration import _Registry
from psrt.mxnet._running_stats import _RunningStats
from psrt.mxnet._updates import _Updater, _Updates

_STATE_NOTE = "on the parameter servers; saved by psrt checkpoints"
_COMPRESSIONS = {"fp16": psrt.Compression.fp16, "bf16": psrt.Compression.bf16,
                 "none": psrt.Compression.none}


def table_options(key=None, **options):
    """Settings of the table that `key` becomes at its init (None: of every
    table without its own); call before that init (Gluon: the first step).

    Options: seed and init_std (a new row is N(0, init_std^2) drawn from
    (seed, id) instead of the init value, which then gives only the shape),
    max_rows, evict_after_steps, evict_min_count (docs/sparse.md) and
    compression (psrt.Compression). Gluon's Trainer uses a parameter's index
    in its parameter list as the key.
    """
    unknown = sorted(set(options) - set(_table_keys.DEFAULTS))
    if unknown:
        raise psrt.PsrtError("psrt kvstore: table_options takes no %s (it takes %s)"
                             % (unknown, sorted(_table_keys.DEFAULTS)))
    _table_keys.options.setdefault(key, {}).update(options)


class KeyNotInitialised(psrt.PsrtError, mx.base.MXNetError):
    """A key used before init: an MXNetError, as MXNet's own kvstore raises,
    and a PsrtError."""


@mx.kvstore.KVStoreBase.register
class Psrt(mx.kvstore.KVStore):
    """mx.kv.create("psrt"): keys live on psrt's parameter servers.

    A KVStore (not only a KVStoreBase) because Gluon trains sparse gradients
    only through one; it holds no MXNet handle, and overrides every method.
    Each store created in a process has keys of its own (as two Trainers
    given "psrt" need): the first's are named kv/KEY on the servers, the
    n-th's kvN/KEY, so every worker creates its stores in the same order."""

    _created = 0

    def __init__(self):  # pylint: disable=super-init-not-called
        self._client = psrt.init()
        prefix = "kv" if Psrt._created == 0 else "kv%d" % Psrt._created
        Psrt._created += 1
        self._updates = _Updates(self._client, lambda: self._keys.vars.step)
        self._rates = _LearningRates(self._client, self._updates)
        self._keys = _Registry(self._client, prefix, psrt.Compression.job_default, self._updates,
                               self._rates, KeyNotInitialised)
        self._grads = _Gradients(self._client, self._keys, self._updates, self._rates)
        self._stats = _RunningStats(self._client, self._keys)
        # Pushpulls are queued and go out as one at the step's last key, when
        # a key comes again (a new step), and before any other operation.
        self._batch = []          # (key, gradient, out) queued
        self._round = []          # keys pushpulled in this step
        self._step_keys = None    # the keys of a whole step

    def __del__(self):
        pass  # no MXNet handle to free

    # --- the KVStore API ---------------------------------------------------

    @property
    def type(self):
        return "dist_sync_psrt" if self._client.is_sync() else "dist_async_psrt"

    @property
    def rank(self):
        return self._client.rank()

    @property
    def num_workers(self):
        return self._client.num_workers()

    @property
    def _updater(self):
        """What Trainer.load_states reads after load_optimizer_states."""
        return _Updater(self._updates.optimizer)

    def is_capable(self, capability):
        return capability.lower() == mx.kvstore.KVStoreBase.OPTIMIZER

    def set_gradient_compression(self, compression_params):
        """{'type': 'fp16'} or {'type': 'bf16'}: gradients (and weights)
        travel as 16-bit floats, the servers keep float32. {'type': '2bit',
        'threshold': t}: MXNet's 2-bit quantization (each dense gradient
        becomes t, 0 or -t, the rest is carried to the next push), the
        values then travel as the job's compression says. Call it before
        init (Gluon's Trainer does, from compression_params)."""
        params = dict(compression_params)
        kind = str(params.get("type", "")).lower()
        if kind not in _COMPRESSIONS and kind != "2bit":
            raise psrt.PsrtError("psrt kvstore: gradient compression %r is not supported; use "
                                 "{'type': 'fp16'} or {'type': 'bf16'} (16-bit gradients and "
                                 "weights on the wire, float32 on the servers), {'type': '2bit', "
                                 "'threshold': t}, or the job's 'compression' setting" % kind)
        if self._keys.used():
            raise psrt.PsrtError("psrt kvstore: set_gradient_compression must come before the "
                                 "first key is used (keys are registered with their compression)")
        if kind != "2bit":
            self._keys.compress(_COMPRESSIONS[kind])
            return
        threshold = float(params.get("threshold", 0.5))
        if not threshold > 0:
            raise psrt.PsrtError("psrt kvstore: 2bit compression needs a threshold > 0; got %s"
                                 % threshold)
        self._grads.quantize(threshold)

    def set_optimizer(self, optimizer):
        self._finish()
        self._updates.set(optimizer)
        self._keys.follow_optimizer()

    def init(self, key, value):
        self._finish()
        for k, v in zip(*self._pairs(key, value)):
            v = _outputs(v)[0] if _is_sparse(_outputs(v)[0]) else _first(v)
            self._keys.init(k, v)

    def broadcast(self, key, value, out, priority=0):
        """Registers the key (rank 0's value wins) and writes the value every
        worker now holds into `out`."""
        keys, values = self._pairs(key, value)
        own = self._stats.found(keys, values, self._pairs(key, out)[1])
        self.init(key, value)
        self.pull(key, out)
        self._stats.broadcast(own)

    def pushpull(self, key, value, out=None, priority=0):
        """Pushes `value`, writes the key's new value into `out` (or, as
        MXNet does, into `value` when out is None)."""
        keys, values = self._pairs(key, value)
        outs = values if out is None else self._pairs(key, out)[1]
        scale = self._updates.rescale()
        dense, values, outs = self._keys.tables_first(
            lambda k, v, o: self._keys.tables.push_pull(k, v, o, scale), keys, values, outs)
        if keys and not dense:  # tables only
            return
        keys = dense
        if any(k in self._round for k in keys):  # a new step
            self._finish()
            self._step_keys = set(self._round)
            self._round = []
        self._batch.extend(zip(keys, self._outgoing(keys, values), outs))
        self._round.extend(keys)
        if self._step_keys is None:
            self._finish()
        elif self._step_keys.issubset(self._round):
            self._finish(step_end=True)

    def _end_step(self):
        """Gluon's Trainer has pushpulled every key of a step: the step ends
        here. Its first step shows which keys a step has, so without this
        that step's end (the statistics' mean, the state a checkpoint
        keeps) would wait for the next step's first key."""
        self._finish(step_end=self._step_keys is None and bool(self._round))

    def push(self, key, value, priority=0):
        """Sends gradients; the servers update the weights (pull reads them).
        A table's gradient is a row_sparse NDArray (or one per device)."""
        scale = self._updates.rescale()
        keys, values = self._keys.tables_first(
            lambda k, v: self._keys.tables.push(k, v, scale), *self._pairs(key, value))
        if not keys:
            return
        self._finish()
        grads = self._grads.prepared(keys, self._outgoing(keys, values))
        if self._updates.local:  # the aggregate now: the updater steps on it
            for k, w in zip(keys, self._keys.push_pull(keys, grads)):
                self._updates.stepped(k, w)
            self._updates.save_if_due()
            return
        self._keys.push(keys, grads)

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        self._finish()
        for k, o in zip(*self._pairs(key, out)):
            if self._keys.is_table(k):
                self._keys.tables.pull(k, o, ignore_sparse)
                continue
            w = self._keys.current(k)
            self._rates.keep(k, w)
            _write(o, w)

    def row_sparse_pull(self, key, out=None, priority=0, row_ids=None):
        """Writes the rows of `row_ids` (an NDArray of ids, repeats and any
        order allowed; one per output or one for all) into `out`, a
        row_sparse NDArray (or one per device) that then holds just those
        rows; in sync mode once every worker's pushes of the steps before are
        applied."""
        if out is None or row_ids is None:
            raise psrt.PsrtError("psrt kvstore: row_sparse_pull needs out and row_ids")
        keys = list(key) if isinstance(key, (list, tuple)) else [key]
        outs = list(out) if isinstance(key, (list, tuple)) else [out]
        ids_per_key = list(row_ids) if isinstance(key, (list, tuple)) else [row_ids]
        for k, o, rid in zip(keys, outs, ids_per_key):
            self._keys.row_sparse_pull(k, o, rid)

    def save_optimizer_states(self, fname, dump_optimizer=False):
        """Writes where the state is: on the servers (psrt checkpoints save it)."""
        self._finish()
        with open(fname, "w") as f:
            json.dump({"psrt": {"state": _STATE_NOTE, "step": self._keys.vars.step}}, f)

    def load_optimizer_states(self, fname):
        try:
            with open(fname) as f:
                saved = json.load(f)
        except (UnicodeDecodeError, ValueError):
            saved = None
        if not isinstance(saved, dict) or "psrt" not in saved:
            raise psrt.PsrtError("psrt kvstore: %s holds MXNet optimizer states; on psrt they live "
                                 "on the parameter servers. Restore a psrt checkpoint (the "
                                 "'restore' setting) instead" % fname)

    def _set_updater(self, updater):
        raise psrt.PsrtError("psrt kvstore: a local updater cannot run on the parameter servers; "
                             "use set_optimizer (sgd, nag, adam or adagrad)")

    def _barrier(self):
        """Sync: returns once every worker reached it (a push-pull of a plain
        key waits for every worker's push), refused where a step may go
        without some (backup workers, elastic). Async and ssp have no such
        wait: it only sends what is queued."""
        self._finish()
        if self._client.is_sync():
            try:
                self._client.every_worker_each_step()
            except psrt.PsrtError as e:
                raise psrt.PsrtError("psrt kvstore: _barrier() waits for every worker: %s"
                                     % e) from None
            _host.allreduce(self._client, [self._keys.name(".barrier")], [np.zeros(1)], [(1,)])

    def _send_command_to_servers(self, head, body):
        raise psrt.PsrtError("psrt kvstore: psrt's servers take no MXNet server commands")

    # --- internals ------------------------------------------------------------

    def _outgoing(self, keys, values):
        """Host copies of dense keys' gradients, their keys registered and
        their learning rates sent."""
        for k in keys:
            self._keys.ensure(k)
        grads = self._grads.host(keys, values)
        self._rates.sync(keys)
        return grads

    def _finish(self, step_end=False):
        """Sends the queued pushpulls as one (a request per server) and
        writes the new weights out; at a whole step's end also averages the
        arrays Gluon never pushes."""
        batch, self._batch = self._batch, []
        if batch:
            keys, grads, outs = zip(*batch)
            grads = self._grads.prepared(keys, grads)
            for k, o, w in zip(keys, outs, self._keys.push_pull(keys, grads)):
                w = self._updates.stepped(k, w)
                self._rates.keep(k, w)
                _write(o, w)
        if step_end:
            self._stats.step_end()
        # Once every key took the step (the statistics' too: the step is the
        # least over the keys).
        self._updates.save_if_due()

    @staticmethod
    def _pairs(key, value):
        if isinstance(key, (list, tuple)):
            return list(key), list(value)
        return [key], [value]


# Gluon and Module find the store through these (after Psrt: they name it).
from psrt.mxnet import _patches  # noqa: E402,F401
