"""Where a dense key's updates run: psrt's servers run the MXNet optimizer
set with set_optimizer, or, for one they cannot run in a sync job, every
worker steps MXNet's own updater on the plain keys' aggregate."""

import mxnet as mx

import psrt
from psrt.mxnet._optimizers import _scales_gradient, _server_optimizer

# A key with no optimizer: its value becomes the step's aggregated push.
_ASSIGN = {"name": "assign", "lr": 0.0}


class _Updater:
    """What Trainer.load_states reads after load_optimizer_states."""

    def __init__(self, optimizer):
        self.optimizer = optimizer


class _Updates:
    """The optimizer set with set_optimizer and what dense keys register
    with; the workers' updater and its weights where the servers cannot run
    it."""

    def __init__(self, client):
        self._client = client
        self.optimizer = None
        self._config = None
        self._config_error = None  # why the optimizer cannot update dense keys
        self._local = None         # mx.optimizer.Updater
        self._weights = {}         # dense key -> its weights (NDArray), the same on every worker

    @property
    def local(self):
        """Whether the workers' updater steps the dense keys."""
        return self._local is not None

    def set(self, optimizer):
        """Takes the optimizer; refusals wait for a dense key to register,
        as a table-only model may use a row-wise optimizer (ftrl) that dense
        keys cannot."""
        self.optimizer = optimizer
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
                    self._config_error = psrt.PsrtError(
                        "%s; and it cannot run on the workers: %s" % (e, why))

    def config(self, key, broadcast_only):
        """What a dense key registers with now: the optimizer (with the
        key's lr_mult and wd_mult, as MXNet's optimizer finds them), or
        plain."""
        if self.optimizer is None or broadcast_only or self._local is not None:
            return _ASSIGN
        if self._config is None:
            raise self._config_error
        lr = float(self.optimizer._get_lr(key))
        if _scales_gradient(self._config):
            # The base rate (times lr_mult), not the scheduled one: the
            # servers keep it, a restored job's too.
            now = float(self.optimizer.learning_rate)
            lr = float(self.optimizer.lr) * (lr / now if now else 1.0)
        return dict(self._config, lr=lr, weight_decay=float(self.optimizer._get_wd(key)))

    def start(self, key, pull):
        """The updater's weights of a key it has none of yet: what the key
        holds, `pull(key)`."""
        if self._local is not None and key not in self._weights:
            self._weights[key] = mx.nd.array(pull(key))

    def registered(self, key, value, broadcast_only):
        if self._local is not None and not broadcast_only:
            self._weights[key] = mx.nd.array(value)

    def weights(self, key):
        """The updater's weights of the key (host), or None where the
        servers hold them."""
        return self._weights[key].asnumpy() if key in self._weights else None

    def stepped(self, key, aggregate):
        """The key's new weights: the servers' (an optimizer's key, or a
        plain one's aggregate), or, with the optimizer on the workers, the
        updater's step on the aggregate."""
        if key not in self._weights:
            return aggregate
        weight = self._weights[key]
        self._local(key, mx.nd.array(aggregate.reshape(weight.shape)), weight)
        return weight.asnumpy()

    def rescale(self):
        return float(self.optimizer.rescale_grad) if self.optimizer is not None else 1.0
