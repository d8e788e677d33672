"""Where a dense key's updates run: psrt's servers run the MXNet optimizer
set with set_optimizer, or, for one they cannot run in a sync job, every
worker steps MXNet's own updater on the plain keys' aggregate. Then the
job's checkpoints keep rank 0's weights, updater states and optimizer
counters once (worker/state_keys.h), and a restore gives them back."""

import atexit
import io
import itertools
import pickle

import mxnet as mx
import numpy as np

import psrt
from psrt import _host
from psrt.mxnet._optimizers import _scales_gradient, _server_optimizer

# A key with no optimizer: its value becomes the step's aggregated push.
_ASSIGN = {"name": "assign", "lr": 0.0}
# Each updater's state has a name, the same in every process of the job and
# in the job restored from its checkpoint: the order they were made in.
_made = itertools.count()


class _Updater:
    """What Trainer.load_states reads after load_optimizer_states."""

    def __init__(self, optimizer):
        self.optimizer = optimizer


class _Updates:
    """The optimizer set with set_optimizer and what dense keys register
    with; the workers' updater and its weights where the servers cannot run
    it."""

    def __init__(self, client, step):
        self._client = client
        self._step = step          # () -> the steps every dense key has taken
        self.optimizer = None
        self._config = None
        self._config_error = None  # why the optimizer cannot update dense keys
        self._local = None         # mx.optimizer.Updater
        self._weights = {}         # dense key -> its weights (NDArray), the same on every worker
        self._state_name = None    # the updater's state in the job's checkpoints
        self._restored = {}        # dense key -> its weights from the restored state
        self._saved = 0            # the step whose state rank 0 saved last
        # At exit, the last step's state for the final checkpoint (a store
        # whose updates run on the servers saves nothing).
        atexit.register(self.save_if_due, True)

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
                    self._client.state_on_workers(saves_state=True)
                    self._local, self._config_error = mx.optimizer.get_updater(optimizer), None
                except psrt.PsrtError as why:
                    self._config_error = psrt.PsrtError(
                        "%s; and it cannot run on the workers: %s" % (e, why))
            if self._local is not None:
                self._load_state()
        start = self._client.restored_step()
        if self._config is not None and start > 0:
            # The servers' keys come back at step `start`; the worker counts
            # each key's updates (which drive its lr_scheduler), and goes on
            # from there as MXNet's servers, which keep the count, would.
            optimizer.begin_num_update = max(optimizer.begin_num_update, start)
            optimizer.num_update = max(optimizer.num_update, start)

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
        """The updater's weights of a key it has none of yet: the restored
        state's, else what the key holds, `pull(key)`."""
        if self._local is not None and key not in self._weights:
            self._weights[key] = mx.nd.array(self._restored.pop(key) if key in self._restored else pull(key))

    def registered(self, key, value, broadcast_only):
        if self._local is not None and not broadcast_only:
            self._weights[key] = mx.nd.array(self._restored.pop(key, value))

    # --- the state a checkpoint keeps ------------------------------------------

    def _load_state(self):
        """Every worker takes the state the job restored (rank 0's, saved
        once): the updater's states and the optimizer's counters now, each
        key's weights as it starts (its server key holds the last aggregate,
        not the weights)."""
        self._state_name = "mxnet.updater%d" % next(_made)
        start = self._saved = self._client.restored_step()
        blob = _host.load_state(self._client, self._state_name, "psrt kvstore")
        if not blob:
            return
        saved = np.load(io.BytesIO(blob))
        if int(saved["step"]) != start:
            raise psrt.PsrtError("psrt kvstore: the checkpoint's state '%s' is of step %d; this job restored "
                                 "step %d" % (self._state_name, int(saved["step"]), start))
        # MXNet's own format for its updater (as its load_optimizer_states
        # reads); the bytes are rank 0's, from the job's own checkpoint.
        self._local.set_states(saved["updater"].tobytes())
        counters = pickle.loads(saved["optimizer"].tobytes())
        opt = self.optimizer
        opt.num_update = counters["num_update"]
        # Each device's update counts; _index_update_count is the current
        # device's, rebound by the updater at each update.
        opt._all_index_update_counts = counters["index_update_counts"]
        opt._index_update_count = opt._all_index_update_counts[0]
        opt.lr_scheduler = counters["lr_scheduler"]
        keys = pickle.loads(saved["keys"].tobytes())
        self._restored = {k: saved["w%d" % i] for i, k in enumerate(keys)}

    def save_if_due(self, last=False):
        """Rank 0, once every dense key took the step: the state, where the
        job's checkpoints keep this step (`last`: the final one's, at exit)."""
        if self._local is None or self._client.rank() != 0:
            return
        step = self._step()
        if step <= self._saved:
            return
        if not self._client.state_due(step, last):
            return
        keys = sorted(self._weights, key=repr)
        blob = lambda obj: np.frombuffer(pickle.dumps(obj), np.uint8)  # noqa: E731
        f = io.BytesIO()
        np.savez(f, step=np.int64(step), updater=np.frombuffer(self._local.get_states(False), np.uint8),
                 optimizer=blob({"num_update": self.optimizer.num_update,
                                 "index_update_counts": self.optimizer._all_index_update_counts,
                                 "lr_scheduler": self.optimizer.lr_scheduler}),
                 keys=blob(keys), **{"w%d" % i: self._weights[k].asnumpy() for i, k in enumerate(keys)})
        self._client.save_state(self._state_name, f.getvalue(), step)
        self._saved = step

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
