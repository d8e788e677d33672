"""MXNet plugin: a KVStore named "psrt" (MXNet's own parameter-server API).

    import psrt.mxnet  # registers it
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                            kvstore="psrt")     # or mx.kv.create("psrt")

The optimizer runs on psrt's servers (what ``update_on_kvstore`` means):
``set_optimizer`` sends its type and hyperparameters there, and ``pushpull``
sends gradients and returns the updated weights. ``init`` registers a key
(rank 0's value becomes everyone's, or a restored checkpoint's).

Gluon's Trainer calls ``pushpull`` once per parameter. After the first step
(which shows which keys a step has) those calls only queue their gradients,
and the call for a step's last key sends them all as one push-pull (one
request per server) and writes every weight, before ``Trainer.step`` returns.

Sparse tables (docs/sparse.md): a key initialised with a ``row_sparse``
NDArray of shape (vocab, dim), as MXNet's dist kvstore takes row-sparse
weights (Gluon's ``contrib.nn.SparseEmbedding`` with
``Trainer(..., kvstore="psrt")``), becomes a table whose rows live on the
servers. The init value is not sent: a new row starts as N(0, init_std^2)
drawn from (seed, id) on the servers (``table_options``), so every worker,
server count and restore agree on it. ``row_sparse_pull`` reads the rows of
given ids; ``push`` (or ``pushpull``) of a ``row_sparse`` gradient sends
its rows, which the servers update with the optimizer's row-wise form (sgd,
adam with ``lazy_update``, adagrad, ftrl) on the mean over workers. In sync
mode every worker pushes each table once per step, as Gluon's Trainer does.
The step a table is pulled at and pushed for is counted here per table,
from ``psrt.restored_step()``.
"""

import json

import mxnet as mx
import numpy as np

import psrt
from psrt import _host, _tables

_STATE_NOTE = "on the parameter servers; saved by psrt checkpoints"
_TABLE_DEFAULTS = {"seed": 0, "init_std": 0.01, "max_rows": 0, "evict_after_steps": 0, "evict_min_count": 0,
                   "compression": psrt.Compression.job_default}
_table_options = {}  # key (None: every table) -> settings given to table_options


def table_options(key=None, **options):
    """Settings of the table that `key` becomes at its init (None: of every
    table without its own); call before that init (Gluon: the first step).

    Options: seed and init_std (a new row is N(0, init_std^2) drawn from
    (seed, id); 0.01 is mx.init.Normal's default), max_rows,
    evict_after_steps, evict_min_count (docs/sparse.md) and compression
    (psrt.Compression). Gluon's Trainer uses a parameter's index in its
    parameter list as the key.
    """
    unknown = sorted(set(options) - set(_TABLE_DEFAULTS))
    if unknown:
        raise psrt.PsrtError("psrt kvstore: table_options takes no %s (it takes %s)"
                             % (unknown, sorted(_TABLE_DEFAULTS)))
    _table_options.setdefault(key, {}).update(options)


def _server_optimizer(opt):
    """Server-side settings equivalent to an MXNet optimizer, or a refusal."""
    if opt.clip_gradient is not None:
        raise psrt.PsrtError("psrt kvstore: clip_gradient is not supported; the servers apply the update")
    lr, wd = float(opt.learning_rate), float(opt.wd)
    if isinstance(opt, mx.optimizer.NAG):
        return {"name": "sgd", "lr": lr, "momentum": float(opt.momentum), "nesterov": True, "weight_decay": wd}
    if isinstance(opt, mx.optimizer.SGD):
        return {"name": "sgd", "lr": lr, "momentum": float(opt.momentum), "weight_decay": wd}
    if isinstance(opt, mx.optimizer.Adam):
        return {"name": "adam", "lr": lr, "beta1": float(opt.beta1), "beta2": float(opt.beta2),
                "eps": float(opt.epsilon), "weight_decay": wd}
    if isinstance(opt, mx.optimizer.AdaGrad):
        return {"name": "adagrad", "lr": lr, "eps": float(opt.float_stable_eps), "weight_decay": wd}
    raise psrt.PsrtError("psrt kvstore: %s cannot run on the parameter servers; use sgd, nag, adam or "
                         "adagrad" % type(opt).__name__)


def _table_optimizer(opt):
    """The row-wise form of an MXNet optimizer for a table, or a refusal."""
    if opt.clip_gradient is not None:
        raise psrt.PsrtError("psrt kvstore: clip_gradient is not supported; the servers apply the update")
    lr, wd = float(opt.learning_rate), float(opt.wd)
    if isinstance(opt, mx.optimizer.Ftrl):
        # MXNet's denominator (beta + sqrt(n)) / lr + wd is the servers' (TF's)
        # sqrt(n) / lr + 2 * (l2 + beta / (2 * lr)) with l2 = wd / 2.
        return {"name": "ftrl", "lr": lr, "l1": float(opt.lamda1), "l2": wd / 2, "ftrl_beta": float(opt.beta),
                "initial_accumulator_value": 0.0}
    if wd:
        raise psrt.PsrtError("psrt kvstore: weight decay (wd=%g) is not supported for tables: the servers' "
                             "row-wise optimizers have none (ftrl takes wd as its l2); use wd=0" % wd)
    if isinstance(opt, mx.optimizer.SGD) and not isinstance(opt, mx.optimizer.NAG) and not opt.momentum:
        return {"name": "sgd", "lr": lr}
    if isinstance(opt, mx.optimizer.Adam) and opt.lazy_update:
        return {"name": "adam", "lr": lr, "beta1": float(opt.beta1), "beta2": float(opt.beta2),
                "eps": float(opt.epsilon)}
    if isinstance(opt, mx.optimizer.AdaGrad):
        # MXNet divides by sqrt(history + eps) with history from 0; the
        # servers add eps after the root, so eps becomes the history's start.
        return {"name": "adagrad", "lr": lr, "initial_accumulator_value": float(opt.float_stable_eps),
                "eps": 0.0}
    raise psrt.PsrtError("psrt kvstore: %s%s is not row-wise, so it cannot update a table; use sgd without "
                         "momentum, adam with lazy_update=True, adagrad or ftrl"
                         % (type(opt).__name__, "(lazy_update=False)" if isinstance(opt, mx.optimizer.Adam)
                                                 else ""))


def _is_sparse(value):
    return getattr(value, "stype", "default") == "row_sparse"


def _row_pieces(key, value, scale):
    """(ids, rows) host copies of row_sparse gradient(s), times `scale`."""
    pieces = []
    for v in _outputs(value):
        if not _is_sparse(v):
            raise psrt.PsrtError("psrt kvstore: key %s is a table: push a row_sparse gradient (got a %s "
                                 "NDArray)" % (key, getattr(v, "stype", type(v).__name__)))
        rows = v.data.asnumpy().astype(np.float32, copy=False)
        if scale != 1.0:
            rows = rows * np.float32(scale)
        pieces.append((v.indices.asnumpy().astype(np.int64), rows))
    return pieces


def _write_rows(dst, ids, rows):
    """Rows of `ids` into `dst`: a row_sparse NDArray holds exactly them, a
    dense one has them overwritten. Gluon pulls inside autograd.record()
    (the forward pass); the copy is no part of the graph, as MXNet's own
    kvstore's is not."""
    with mx.autograd.pause():
        if _is_sparse(dst):
            mx.nd.sparse.row_sparse_array((rows, ids), shape=dst.shape, ctx=dst.context,
                                          dtype=dst.dtype).copyto(dst)
        else:
            full = dst.asnumpy()
            full[ids] = rows
            dst[:] = full


def _first(value):
    """MXNet passes one NDArray or a list (one per device); psrt keeps one."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise psrt.PsrtError("psrt kvstore: an empty list of arrays")
        # Gradients of several devices are summed, as MXNet's local kvstore does.
        total = value[0].copyto(mx.cpu())
        for v in value[1:]:
            total += v.as_in_context(mx.cpu())
        return total
    return value


def _scaled(value, scale):
    """A host copy of the gradient(s) in `value`, times `scale`."""
    grad = _first(value).asnumpy()
    if scale != 1.0:
        np.multiply(grad, scale, out=grad)
    return grad


def _outputs(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


@mx.kvstore.KVStoreBase.register
class Psrt(mx.kvstore.KVStoreBase):
    """mx.kv.create("psrt"): keys live on psrt's parameter servers."""

    def __init__(self):
        self._client = psrt.init()
        self._vars = _host.HostVariables(self._client, psrt.Compression.job_default)
        self._tables = {}  # key -> _tables.HostTable
        self._optimizer = None
        self._config = None
        self._config_error = None  # why the optimizer cannot update dense keys
        self._pending = {}  # key -> value given to init before set_optimizer
        # Pushpulls are queued and go out as one at the step's last key, when
        # a key comes again (a new step), and before any other operation.
        self._batch = []          # (key, gradient, out) queued
        self._round = []          # keys pushpulled in this step
        self._step_keys = None    # the keys of a whole step

    @staticmethod
    def _name(key):
        return "kv/%s" % key

    # --- the KVStore API ---------------------------------------------------

    @property
    def type(self):
        return "psrt"

    @property
    def rank(self):
        return self._client.rank()

    @property
    def num_workers(self):
        return self._client.num_workers()

    def is_capable(self, capability):
        return capability == mx.kvstore.KVStoreBase.OPTIMIZER

    def set_optimizer(self, optimizer):
        self._finish()
        self._optimizer = optimizer
        # A table-only model may use a row-wise optimizer (ftrl) that dense
        # keys cannot: refuse it when a dense key registers.
        try:
            self._config, self._config_error = _server_optimizer(optimizer), None
        except psrt.PsrtError as e:
            self._config, self._config_error = None, e
        for key, value in list(self._pending.items()):
            self._register(key, value)
        self._pending.clear()

    def init(self, key, value):
        self._finish()
        for k, v in zip(*self._pairs(key, value)):
            # A table's init value only gives its shape.
            v = _outputs(v)[0] if _is_sparse(_outputs(v)[0]) else _first(v)
            if self._optimizer is None:
                self._pending[k] = v.copy()
            else:
                self._register(k, v)

    def broadcast(self, key, value, out, priority=0):
        """Registers the key (rank 0's value wins) and writes the value every
        worker now holds into `out`."""
        self.init(key, value)
        self.pull(key, out)

    def pushpull(self, key, value, out=None, priority=0):
        if out is None:
            raise psrt.PsrtError("psrt kvstore: the optimizer runs on the servers, so pushpull returns "
                                 "weights: create the Trainer with update_on_kvstore=True")
        keys, values = self._pairs(key, value)
        outs = [out] if not isinstance(key, (list, tuple)) else list(out)
        if any(k in self._tables for k in keys):
            # Tables: push the rows, then read the pushed ids' new rows.
            for k, v, o in zip(keys, values, outs):
                if k in self._tables:
                    ids, _ = _tables.merge(self._push_rows(k, v))
                    rows = self._tables[k].pull(ids)
                    for dst in _outputs(o):
                        _write_rows(dst, ids, rows)
            rest = [(k, v, o) for k, v, o in zip(keys, values, outs) if k not in self._tables]
            if not rest:
                return
            keys, values, outs = (list(x) for x in zip(*rest))
        if any(k in self._round for k in keys):  # a new step
            self._finish()
            self._step_keys = set(self._round)
            self._round = []
        scale = float(self._optimizer.rescale_grad) if self._optimizer is not None else 1.0
        self._sync_learning_rate()
        self._batch.extend(zip(keys, (_scaled(v, scale) for v in values), outs))
        self._round.extend(keys)
        if self._step_keys is None or self._step_keys.issubset(self._round):
            self._finish()

    def push(self, key, value, priority=0):
        """Sends gradients; the servers update the weights (pull reads them).
        A table's gradient is a row_sparse NDArray (or one per device)."""
        keys, values = self._pairs(key, value)
        for k, v in zip(keys, values):
            if k in self._tables:
                self._push_rows(k, v)
        keys, values = [k for k in keys if k not in self._tables], [v for k, v in zip(keys, values)
                                                                     if k not in self._tables]
        if not keys:
            return
        self._finish()
        scale = float(self._optimizer.rescale_grad) if self._optimizer is not None else 1.0
        self._sync_learning_rate()
        self._vars.push([self._name(k) for k in keys], [_scaled(v, scale) for v in values])

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        self._finish()
        keys = key if isinstance(key, (list, tuple)) else [key]
        outs = out if isinstance(key, (list, tuple)) else [out]
        for k, o in zip(keys, outs):
            if self._optimizer is None:
                raise psrt.PsrtError("psrt kvstore: set_optimizer first; the optimizer runs on the servers")
            if k in self._tables:
                # The whole table, into dense outputs (and row_sparse ones
                # unless ignore_sparse, as MXNet's kvstore does).
                dsts = [d for d in _outputs(o) if not (ignore_sparse and _is_sparse(d))]
                if dsts:
                    ids = np.arange(self._tables[k].vocab, dtype=np.int64)
                    rows = self._tables[k].pull(ids)
                    for dst in dsts:
                        _write_rows(dst, ids, rows)
                continue
            w = self._vars.pull(self._name(k))
            for dst in _outputs(o):
                dst[:] = w.reshape(dst.shape)

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
            table = self._tables.get(k)
            if table is None:
                raise psrt.PsrtError("psrt kvstore: key %s is no table; init it with a row_sparse NDArray of "
                                     "shape (vocab, dim)" % (k,))
            dsts = _outputs(o)
            rids = list(rid) if isinstance(rid, (list, tuple)) else [rid] * len(dsts)
            if len(rids) != len(dsts):
                raise psrt.PsrtError("psrt kvstore: row_sparse_pull of key %s: %d outputs but %d row_ids"
                                     % (k, len(dsts), len(rids)))
            for dst, r in zip(dsts, rids):
                ids = np.unique(r.asnumpy().astype(np.int64))
                _write_rows(dst, ids, table.pull(ids))

    def save_optimizer_states(self, fname, dump_optimizer=False):
        """Writes where the state is: on the servers (psrt checkpoints save it)."""
        self._finish()
        with open(fname, "w") as f:
            json.dump({"psrt": {"state": _STATE_NOTE, "step": self._vars.step}}, f)

    def load_optimizer_states(self, fname):
        try:
            with open(fname) as f:
                saved = json.load(f)
        except (UnicodeDecodeError, ValueError):
            saved = None
        if not isinstance(saved, dict) or "psrt" not in saved:
            raise psrt.PsrtError("psrt kvstore: %s holds MXNet optimizer states; on psrt they live on the "
                                 "parameter servers. Restore a psrt checkpoint (the 'restore' setting) "
                                 "instead" % fname)

    # --- internals ------------------------------------------------------------

    def _finish(self):
        """Sends the queued pushpulls as one (a request per server) and
        writes the new weights out."""
        batch, self._batch = self._batch, []
        if not batch:
            return
        keys, grads, outs = zip(*batch)
        for o, w in zip(outs, self._vars.push_pull([self._name(k) for k in keys], grads)):
            for dst in _outputs(o):
                dst[:] = w.reshape(dst.shape)

    @staticmethod
    def _pairs(key, value):
        if isinstance(key, (list, tuple)):
            return list(key), list(value)
        return [key], [value]

    def _register(self, key, value):
        name = self._name(key)
        if _is_sparse(value):
            if key not in self._tables:
                if len(value.shape) != 2:
                    raise psrt.PsrtError("psrt kvstore: a table's value has shape (vocab, dim); key %s has %s"
                                         % (key, value.shape))
                opts = dict(_TABLE_DEFAULTS, **_table_options.get(None, {}))
                opts.update(_table_options.get(key, {}))
                self._tables[key] = _tables.HostTable(
                    "psrt kvstore", name, value.shape[1], value.shape[0], _table_optimizer(self._optimizer),
                    **opts)
            return
        if self._vars.registered(name):
            return
        if self._config is None:
            raise self._config_error
        host = self._vars.register(name, value.asnumpy(), self._config)
        value[:] = host

    def _push_rows(self, key, value):
        """Pushes a table's row gradient(s); returns the (ids, rows) pieces."""
        scale = float(self._optimizer.rescale_grad) if self._optimizer is not None else 1.0
        pieces = _row_pieces(key, value, scale)
        self._tables[key].push(pieces)
        return pieces

    def _sync_learning_rate(self):
        if self._optimizer is not None:
            self._vars.set_learning_rate(float(self._optimizer.learning_rate))
