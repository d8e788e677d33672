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
"""

import json

import mxnet as mx
import numpy as np

import psrt
from psrt import _host

_STATE_NOTE = "on the parameter servers; saved by psrt checkpoints"


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
        self._optimizer = None
        self._config = None
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
        self._config = _server_optimizer(optimizer)
        for key, value in list(self._pending.items()):
            self._register(key, value)
        self._pending.clear()

    def init(self, key, value):
        self._finish()
        for k, v in zip(*self._pairs(key, value)):
            if self._config is None:
                self._pending[k] = _first(v).copy()
            else:
                self._register(k, _first(v))

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
        """Sends gradients; the servers update the weights (pull reads them)."""
        self._finish()
        keys, values = self._pairs(key, value)
        scale = float(self._optimizer.rescale_grad) if self._optimizer is not None else 1.0
        self._sync_learning_rate()
        self._vars.push([self._name(k) for k in keys], [_scaled(v, scale) for v in values])

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        self._finish()
        keys = key if isinstance(key, (list, tuple)) else [key]
        outs = out if isinstance(key, (list, tuple)) else [out]
        for k, o in zip(keys, outs):
            if self._config is None:
                raise psrt.PsrtError("psrt kvstore: set_optimizer first; the optimizer runs on the servers")
            w = self._vars.pull(self._name(k))
            for dst in _outputs(o):
                dst[:] = w.reshape(dst.shape)

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
        if self._vars.registered(name):
            return
        host = self._vars.register(name, value.asnumpy(), self._config)
        value[:] = host

    def _sync_learning_rate(self):
        if self._optimizer is not None:
            self._vars.set_learning_rate(float(self._optimizer.learning_rate))
