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
from psrt.mxnet._arrays import _assign, _first, _is_sparse, _outputs, _scaled, _write
from psrt.mxnet._optimizers import _check_rows_of_dense, _scales_gradient, _server_optimizer, _without_lr

_STATE_NOTE = "on the parameter servers; saved by psrt checkpoints"
# A key with no optimizer: its value becomes the step's aggregated push.
_ASSIGN = {"name": "assign", "lr": 0.0}
_COMPRESSIONS = {"fp16": psrt.Compression.fp16, "bf16": psrt.Compression.bf16, "none": psrt.Compression.none}


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
        self._prefix = "kv" if Psrt._created == 0 else "kv%d" % Psrt._created
        Psrt._created += 1
        self._compression = psrt.Compression.job_default
        self._two_bit = None   # the 2bit compression's threshold, if set
        self._residuals = {}   # dense key -> what 2bit quantization has not sent yet
        self._vars = _host.HostVariables(self._client, self._compression)
        self._tables = _table_keys.TableKeys(self._name)  # the keys that are tables
        self._optimizer = None
        self._config = None
        self._config_error = None  # why the optimizer cannot update dense keys
        # An optimizer the servers cannot run, in a sync job: the servers
        # aggregate (plain keys) and every worker's updater steps on that.
        self._local = None          # mx.optimizer.Updater
        self._local_weights = {}    # dense key -> its weights (NDArray), the same on every worker
        self._pending = {}  # key -> value given to init, registered at first use or set_optimizer
        self._names = {}    # dense key -> its server variable
        self._configs = {}  # dense key -> the optimizer its variable has
        self._generation = {}  # dense key -> how often set_optimizer moved it
        self._pushed = set()   # dense keys ever pushed
        self._aux = {}         # key -> arrays Gluon broadcasts without a gradient (a plain key)
        self._aux_names = None  # key -> its variable, for those averaged; decided once
        self._factor = None    # 1 if the servers average pushes, the worker count if they sum
        self._lr_ref = {}      # SGD-with-momentum key -> the servers' (fixed) rate
        self._weights = {}     # such a key -> its current weights (for weight decay)
        # Pushpulls are queued and go out as one at the step's last key, when
        # a key comes again (a new step), and before any other operation.
        self._batch = []          # (key, gradient, out) queued
        self._round = []          # keys pushpulled in this step
        self._step_keys = None    # the keys of a whole step

    def __del__(self):
        pass  # no MXNet handle to free

    def _name(self, key):
        return "%s/%s" % (self._prefix, key)

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
        return _Updater(self._optimizer)

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
            raise psrt.PsrtError("psrt kvstore: gradient compression %r is not supported; use {'type': 'fp16'} "
                                 "or {'type': 'bf16'} (16-bit gradients and weights on the wire, float32 on "
                                 "the servers), {'type': '2bit', 'threshold': t}, or the job's 'compression' "
                                 "setting" % kind)
        if self._names or self._tables:
            raise psrt.PsrtError("psrt kvstore: set_gradient_compression must come before the first key is "
                                 "used (keys are registered with their compression)")
        if kind == "2bit":
            threshold = float(params.get("threshold", 0.5))
            if not threshold > 0:
                raise psrt.PsrtError("psrt kvstore: 2bit compression needs a threshold > 0; got %s" % threshold)
            self._two_bit = threshold
            return
        self._compression = _COMPRESSIONS[kind]
        self._vars = _host.HostVariables(self._client, self._compression)

    def set_optimizer(self, optimizer):
        self._finish()
        self._optimizer = optimizer
        # A table-only model may use a row-wise optimizer (ftrl) that dense
        # keys cannot: refuse it when a dense key registers.
        self._local = None
        try:
            self._config, self._config_error = _server_optimizer(optimizer), None
        except psrt.PsrtError as e:
            self._config, self._config_error = None, e
            if self._client.is_sync():
                try:
                    self._client.state_on_workers()
                    self._local, self._config_error = mx.optimizer.get_updater(optimizer), None
                except psrt.PsrtError as why:
                    self._config_error = psrt.PsrtError("%s; and it cannot run on the workers: %s" % (e, why))
        for key in list(self._names):
            if _without_lr(self._configs[key]) != _without_lr(self._dense_config(key)):
                self._move(key)
        for key, value in list(self._pending.items()):
            self._register(key, value)
        self._pending.clear()
        if self._local is not None:  # the updater starts from what the keys hold
            for key in self._names:
                if key not in self._aux and key not in self._local_weights:
                    self._local_weights[key] = mx.nd.array(self._vars.pull(self._names[key]))

    def init(self, key, value):
        self._finish()
        for k, v in zip(*self._pairs(key, value)):
            v = _outputs(v)[0] if _is_sparse(_outputs(v)[0]) else _first(v)
            if k in self._names or k in self._tables or k in self._pending:
                continue
            if self._optimizer is None:
                # Registered at its first use, with the optimizer if one
                # came by then (no move needed), else as a plain key.
                self._pending[k] = v.copy()
            else:
                self._register(k, v)

    def broadcast(self, key, value, out, priority=0):
        """Registers the key (rank 0's value wins) and writes the value every
        worker now holds into `out`."""
        own = {}
        for k, v, o in zip(*self._pairs(key, value), self._pairs(key, out)[1]):
            arrays = [a for a in _outputs(o) if not _is_sparse(a)]
            # Gluon broadcasts each parameter from its own first array; those
            # without a gradient (BatchNorm's running statistics) it never
            # pushes. They become plain keys, which the averaging over the
            # workers writes (so checkpoints hold it).
            if (arrays and _outputs(v)[0] is arrays[0] and all(a.grad is None for a in arrays)
                    and k not in self._names and k not in self._pending):
                self._aux[k] = arrays
                own[k] = sum(a.asnumpy() for a in arrays) / len(arrays)
        self.init(key, value)
        self.pull(key, out)
        if own and self._client.is_sync() and not self._client.restored_step():
            # Gluon broadcasts after the first forward pass, which moved each
            # worker's statistics: their mean, not rank 0's, as at every
            # later step. A restored job takes the checkpoint's.
            self._average(list(own), [own[k] for k in own])

    def pushpull(self, key, value, out=None, priority=0):
        """Pushes `value`, writes the key's new value into `out` (or, as
        MXNet does, into `value` when out is None)."""
        keys, values = self._pairs(key, value)
        if out is None:
            outs = values
        else:
            outs = [out] if not isinstance(key, (list, tuple)) else list(out)
        if any(self._is_table(k) for k in keys):
            for k, v, o in zip(keys, values, outs):
                if self._is_table(k):
                    self._tables.push_pull(k, v, o, self._rescale())
            rest = [(k, v, o) for k, v, o in zip(keys, values, outs) if k not in self._tables]
            if not rest:
                return
            keys, values, outs = (list(x) for x in zip(*rest))
        if any(k in self._round for k in keys):  # a new step
            self._finish()
            self._step_keys = set(self._round)
            self._round = []
        for k in keys:
            self._ensure(k)
        grads = self._gradients(keys, values)
        self._sync_learning_rate(keys)
        self._batch.extend(zip(keys, grads, outs))
        self._round.extend(keys)
        if self._step_keys is None:
            self._finish()
        elif self._step_keys.issubset(self._round):
            self._finish(step_end=True)

    def push(self, key, value, priority=0):
        """Sends gradients; the servers update the weights (pull reads them).
        A table's gradient is a row_sparse NDArray (or one per device)."""
        keys, values = self._pairs(key, value)
        for k, v in zip(keys, values):
            if self._is_table(k):
                self._tables.push(k, v, self._rescale())
        keys, values = [k for k in keys if k not in self._tables], [v for k, v in zip(keys, values)
                                                                     if k not in self._tables]
        if not keys:
            return
        self._finish()
        for k in keys:
            self._ensure(k)
        grads = self._gradients(keys, values)
        self._sync_learning_rate(keys)
        names, grads = [self._names[k] for k in keys], self._prepared(keys, grads)
        if self._local is not None:  # the aggregate now: the updater steps on it
            for k, w in zip(keys, self._vars.push_pull(names, grads)):
                self._stepped(k, w)
            return
        self._vars.push(names, grads)

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        self._finish()
        keys = key if isinstance(key, (list, tuple)) else [key]
        outs = out if isinstance(key, (list, tuple)) else [out]
        for k, o in zip(keys, outs):
            if self._is_table(k):
                self._tables.pull(k, o, ignore_sparse)
                continue
            self._ensure(k)
            w = self._local_weights[k].asnumpy() if k in self._local_weights else self._vars.pull(self._names[k])
            self._keep(k, w)
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
            if not self._is_table(k):
                raise psrt.PsrtError("psrt kvstore: key %s is no table; init it with a row_sparse NDArray of "
                                     "shape (vocab, dim)" % (k,))
            self._tables.row_sparse_pull(k, o, rid)

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

    def _set_updater(self, updater):
        raise psrt.PsrtError("psrt kvstore: a local updater cannot run on the parameter servers; use "
                             "set_optimizer (sgd, nag, adam or adagrad)")

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
                raise psrt.PsrtError("psrt kvstore: _barrier() waits for every worker: %s" % e) from None
            _host.allreduce(self._client, [self._name(".barrier")], [np.zeros(1)], [(1,)])

    def _send_command_to_servers(self, head, body):
        raise psrt.PsrtError("psrt kvstore: psrt's servers take no MXNet server commands")

    # --- internals ------------------------------------------------------------

    def _finish(self, step_end=False):
        """Sends the queued pushpulls as one (a request per server) and
        writes the new weights out; at a whole step's end also averages the
        arrays Gluon never pushes."""
        batch, self._batch = self._batch, []
        if batch:
            keys, grads, outs = zip(*batch)
            grads = self._prepared(keys, grads)
            for k, o, w in zip(keys, outs, self._vars.push_pull([self._names[k] for k in keys], grads)):
                w = self._stepped(k, w)
                self._keep(k, w)
                _write(o, w)
        if step_end:
            self._average_aux()

    @staticmethod
    def _pairs(key, value):
        if isinstance(key, (list, tuple)):
            return list(key), list(value)
        return [key], [value]

    def _dense_config(self, key):
        """What a dense key registers with now: the optimizer (with the
        key's lr_mult and wd_mult, as MXNet's optimizer finds them), or
        plain."""
        if self._optimizer is None or key in self._aux or self._local is not None:
            return _ASSIGN
        if self._config is None:
            raise self._config_error
        lr = float(self._optimizer._get_lr(key))
        if _scales_gradient(self._config):
            # The base rate (times lr_mult), not the scheduled one: the
            # servers keep it, a restored job's too.
            now = float(self._optimizer.learning_rate)
            lr = float(self._optimizer.lr) * (lr / now if now else 1.0)
        return dict(self._config, lr=lr, weight_decay=float(self._optimizer._get_wd(key)))

    def _is_table(self, key):
        """A table's key: registered, or given to init as a row_sparse value."""
        return key in self._tables or _is_sparse(self._pending.get(key))

    def _rescale(self):
        return float(self._optimizer.rescale_grad) if self._optimizer is not None else 1.0

    def _ensure(self, key):
        """Registers a dense key given to init at its first use."""
        if key in self._names:
            return
        if key not in self._pending:
            raise KeyNotInitialised("psrt kvstore: key %s was never initialised; call init first" % (key,))
        self._register(key, self._pending.pop(key))

    def _register(self, key, value):
        if _is_sparse(value):
            self._tables.register(key, value, self._optimizer, self._compression)
            return
        if key in self._names:
            return
        config = self._dense_config(key)
        name = self._name(key)
        host = self._vars.register(name, value.asnumpy(), config)
        _assign(value, host)
        self._registered(key, name, config, host)

    def _move(self, key):
        """Moves a dense key's current value to a new variable with the
        optimizer set now (set_optimizer after the key was used)."""
        value = self._vars.pull(self._names[key])
        config = self._dense_config(key)
        self._generation[key] = self._generation.get(key, 0) + 1
        name = "%s#%d" % (self._name(key), self._generation[key])
        self._vars.register(name, value, config)
        self._registered(key, name, config, value)

    def _registered(self, key, name, config, value):
        self._names[key], self._configs[key] = name, config
        self._lr_ref.pop(key, None)
        if _scales_gradient(config) and config["lr"] > 0:
            # The servers' rate stays; a changed one scales the gradient.
            self._lr_ref[key] = config["lr"]
        self._keep(key, value)
        if self._local is not None and key not in self._aux:
            self._local_weights[key] = mx.nd.array(value)

    def _stepped(self, key, aggregate):
        """The key's new weights: the servers' (an optimizer's key, or a
        plain one's aggregate), or, with the optimizer on the workers, the
        updater's step on the aggregate."""
        if key not in self._local_weights:
            return aggregate
        weight = self._local_weights[key]
        self._local(key, mx.nd.array(aggregate.reshape(weight.shape)), weight)
        return weight.asnumpy()

    def _keep(self, key, weights):
        """The key's current weights, where a changed rate needs them."""
        if key in self._lr_ref and self._configs[key].get("weight_decay"):
            self._weights[key] = weights

    def _gradients(self, keys, values):
        """Host copies of the pushed values: an optimizer's key gets them
        times rescale_grad, as MXNet's servers apply it; a plain key as is."""
        grads = []
        for k, v in zip(keys, values):
            if k in self._aux and self._optimizer is not None:
                # Pushed after all: the optimizer's key it would have been.
                del self._aux[k]
                self._move(k)
            plain = self._configs[k] is _ASSIGN
            if any(_is_sparse(x) for x in _outputs(v)):
                _check_rows_of_dense(k, None if plain else self._optimizer)
            scale = 1.0 if plain else float(self._optimizer.rescale_grad)
            if self._two_bit is not None:
                # MXNet quantizes what the worker computed; its servers
                # apply rescale_grad to the sum.
                grads.append(self._quantized(k, _scaled(v, 1.0)) * np.float32(scale))
            else:
                grads.append(_scaled(v, scale))
            if not plain:
                # MXNet's servers count each key's updates: the count drives
                # its lr_scheduler (num_update).
                self._optimizer._update_count(k)
            self._pushed.add(k)
        return grads

    def _quantized(self, key, grad):
        """MXNet's 2-bit quantization with error feedback: the residual
        takes the gradient; where it reaches +-threshold that is sent and
        taken off it, elsewhere 0 is sent."""
        residual = self._residuals.get(key)
        if residual is None:
            residual = self._residuals[key] = np.zeros_like(grad)
        residual += grad
        t = np.float32(self._two_bit)
        sent = np.where(residual >= t, t, np.where(residual <= -t, -t, np.float32(0))).astype(np.float32)
        residual -= sent
        return sent

    def _prepared(self, keys, grads):
        """The gradients to push to the optimizer's keys.

        clip_gradient: MXNet's servers clip the aggregated gradient. In sync
        mode it is found on a plain twin key, clipped on every worker alike,
        and pushed so that it aggregates to itself; async and ssp apply each
        worker's push alone, so each worker clips its own.

        SGD with momentum: MXNet's buffer takes each step's gradient times
        that step's rate (v = m v - lr (g + wd w)), the servers' (PyTorch's)
        takes the gradient and multiplies the whole buffer by the current
        rate. Keeping the servers' rate at the key's base rate r (the
        optimizer's lr times lr_mult) and pushing s g + (s - 1) wd w with
        s = lr / r makes the two equal under any schedule."""
        grads = list(grads)
        opt = self._optimizer
        idx = [i for i, k in enumerate(keys) if self._configs[k] is not _ASSIGN]
        if opt is None or not idx:
            return grads
        divide = 1.0
        if opt.clip_gradient is not None:
            clip = float(opt.clip_gradient)
            if self._client.is_sync():
                # The servers' aggregate, as they would apply it.
                op = _host.MEAN if self._client.averages() else _host.SUM
                totals, divide = _host.allreduce(self._client, [self._names[keys[i]] for i in idx],
                                                 [grads[i] for i in idx], [grads[i].shape for i in idx], op)
                for i, total in zip(idx, totals):
                    grads[i] = np.clip(total, -clip, clip)
            else:
                for i in idx:
                    grads[i] = np.clip(grads[i], -clip, clip)
        for i in idx:
            k = keys[i]
            if k in self._lr_ref:
                scale = float(opt._get_lr(k)) / self._lr_ref[k]
                if scale != 1.0:
                    g = grads[i] * np.float32(scale)
                    wd = self._configs[k]["weight_decay"]
                    if wd:
                        g += np.float32((scale - 1.0) * wd) * self._weights[k].reshape(g.shape)
                    grads[i] = g
            if divide != 1.0:
                grads[i] = grads[i] / np.float32(divide)
        return grads

    def _aggregation(self):
        """1 if the servers average a sync step's pushes, the number of
        workers if they sum them (the job's gradient_aggregation); counted
        once, with every worker, where they sum."""
        if self._factor is None:
            _, self._factor = _host.allreduce(self._client, [self._name(".aggregation")], [np.ones(1)], [(1,)])
        return self._factor

    def _average_aux(self):
        """Sync: every worker's running statistics become their mean. Which
        broadcast arrays are such is decided once, with every worker: those
        never pushed that changed on some worker since (frozen parameters
        do not change and are left alone)."""
        if not self._client.is_sync():
            return
        if self._aux_names is None:
            candidates = [k for k in self._aux if k not in self._pushed and k in self._names]
            self._aux_names = {}
            if not candidates:
                return
            start = {k: self._vars.pull(self._names[k]) for k in candidates}
            changed = np.array([float(not np.array_equal(self._aux[k][0].asnumpy().reshape(-1),
                                                         start[k].reshape(-1))) for k in candidates],
                               dtype=np.float32)
            (changed,), _ = _host.allreduce(self._client, [self._name(".aux_changed")], [changed],
                                            [changed.shape])
            self._aux_names = {k: self._names[k] for k, c in zip(candidates, changed) if c > 0}
        keys = [k for k in self._aux_names if k in self._aux and k not in self._pushed]
        if keys:
            # Several devices per worker: their mean first.
            self._average(keys, [sum(a.asnumpy() for a in self._aux[k]) / len(self._aux[k]) for k in keys])

    def _average(self, keys, values):
        """Writes the workers' mean of `values` into the keys' arrays. The
        servers hold the mean too (summing servers get each value divided by
        the worker count), so a checkpoint keeps it."""
        factor = np.float32(self._aggregation())
        values = [v / factor for v in values] if factor != 1 else values
        for k, mean in zip(keys, self._vars.push_pull([self._names[k] for k in keys], values)):
            with mx.autograd.pause():
                for dst in self._aux[k]:
                    _assign(dst, mean)

    def _sync_learning_rate(self, keys):
        """Sends changed learning rates (a scheduler's, set_learning_rate's,
        a key's lr_mult) before the keys' pushes: one call for every
        variable, and one per key whose rate differs from it."""
        if self._optimizer is None:
            return
        if not self._lr_ref:
            self._client.set_learning_rate(float(self._optimizer.learning_rate))
        for k in keys:
            if self._configs[k] is not _ASSIGN and k not in self._lr_ref:
                self._client.set_learning_rate(float(self._optimizer._get_lr(k)), self._names[k])


class _Updater:
    def __init__(self, optimizer):
        self.optimizer = optimizer


# Gluon and Module find the store through these (after Psrt: they name it).
from psrt.mxnet import _patches  # noqa: E402,F401
