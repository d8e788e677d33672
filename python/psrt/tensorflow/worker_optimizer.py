"""Keras's optimizer on the workers: the servers sum, every worker steps.

Where the servers cannot run the optimizer (Nadam, Lion, Adafactor, RMSprop,
Ftrl, amsgrad, use_ema, gradient_accumulation_steps, constraints, ...) or
where asked (``optimizer_on="workers"``), each worker's ``apply`` takes the
mean gradient over the workers (psrt_allreduce, the rule every plugin
shares) and runs the optimizer's own update on it, as the PyTorch plugin's
worker_optimizer.py does: every worker starts from rank 0's variables, the
moving statistics (BatchNormalization's) are averaged each step, and the
workers check now and then that their weights agree. The job's checkpoints
keep rank 0's variables and optimizer state once (worker/state_keys.h: at
the checkpoints' steps and the last one, as the process exits), and a job
restored from one gives them back to every worker as the optimizer is
built. Sync jobs only, and only where no running process must receive the
workers' state later (Client::StateOnWorkers).
"""

import atexit
import io
import itertools

import numpy as np
import tensorflow as tf
import keras

import psrt
from psrt import _host


# Each optimizer's state has a name, the same in every process of the job
# and in the job restored from its checkpoint: the order they were built in.
_made = itertools.count()


def refusal(optimizer):
    """None where `optimizer` may run on the workers in this job, else why not."""
    try:
        psrt.client().state_on_workers(saves_state=True)
    except psrt.PsrtError as e:
        return "%s cannot run on the workers: %s" % (type(optimizer).__name__, e)
    return None


class WorkerKeys:
    """One optimizer's variables on every worker, kept alike."""

    def __init__(self, opt, dense, moving, fixed, check_every):
        self.client = psrt.client()
        self.dense, self.moving = dense, moving
        self.names = _host.unique_names([v.path for v in dense + moving + fixed])
        self.check_every = check_every
        self.compression = opt._psrt_compression
        # Rank 0's values become everyone's (registration's rule).
        start = _host.HostVariables(self.client, psrt.Compression.none)
        for name, v in zip(self.names, dense + moving + fixed):
            value = keras.ops.convert_to_numpy(v).astype(np.float32)
            v.assign(tf.cast(start.register(name + "@start", value, {"name": "assign", "lr": 0.0}), v.dtype))
        # What a checkpoint keeps: the model's variables and the optimizer's
        # (a loss scale optimizer's around it too), each once; with those a
        # variable held in an attribute, which `variables` may not list
        # (Nadam's u_product inside a LossScaleOptimizer).
        kept = dense + moving + fixed
        for o in (opt._psrt_loss_scale, opt):
            if o is not None:
                kept += list(o.variables) + [v for v in vars(o).values() if isinstance(v, keras.Variable)]
        self.kept = list({id(v): v for v in kept}.values())
        self.state_name = "keras.optimizer%d" % next(_made)
        self.start = self.saved = self.client.restored_step()
        self.steps = 0  # the job's steps since the start: mean gradients taken
        self._load_state()
        if self.client.rank() == 0:
            atexit.register(self._save_last)

    def _load_state(self):
        """Every worker takes the state the job restored (rank 0's, saved once)."""
        blob = _host.load_state(self.client, self.state_name, "psrt.keras.DistributedOptimizer")
        if not blob:
            return
        saved = np.load(io.BytesIO(blob))
        values = [saved["v%d" % i] for i in range(len(saved.files) - 1)]
        shapes = [tuple(v.shape) for v in self.kept]
        if int(saved["step"]) != self.start or [v.shape for v in values] != shapes:
            raise psrt.PsrtError(
                "psrt.keras.DistributedOptimizer: the checkpoint's state '%s' is of step %d and shapes %s; "
                "this job restored step %d and holds %s" % (self.state_name, int(saved["step"]),
                                                            [v.shape for v in values], self.start, shapes))
        for v, value in zip(self.kept, values):
            v.assign(value)

    def _save(self, *values):
        """Rank 0: the state of this step, for the job's checkpoints."""
        step = self.start + self.steps
        f = io.BytesIO()
        np.savez(f, step=np.int64(step), **{"v%d" % i: np.asarray(v) for i, v in enumerate(values)})
        self.client.save_state(self.state_name, f.getvalue(), step)
        self.saved = step
        return np.int64(step)

    def _save_last(self):
        """At exit: the last step's state, which the final checkpoint saves."""
        step = self.start + self.steps
        if step > self.saved and self.client.state_due(step, True):
            self._save(*[keras.ops.convert_to_numpy(v) for v in self.kept])

    def mean(self, grads):
        """The workers' mean gradients (None where no worker had one), as
        float32 tensors, through one numpy_function."""
        given = [i for i, g in enumerate(grads) if g is not None]
        shapes = [tuple(v.shape) for v in self.dense]
        names = self.names[:len(self.dense)]

        def reduce(*values):
            self.steps += 1
            full = [None] * len(grads)
            for i, value in zip(given, values):
                full[i] = value
            out, _ = _host.allreduce(self.client, names, full, shapes, _host.MEAN, self.compression)
            return [out[i] if out[i] is not None else np.zeros(shapes[i], np.float32) for i in given]

        means = tf.numpy_function(reduce, [grads[i] for i in given], [tf.float32] * len(given), stateful=True)
        means = means if isinstance(means, (list, tuple)) else [means]
        out = [None] * len(grads)
        for i, mean in zip(given, means):
            out[i] = tf.ensure_shape(tf.reshape(mean, tf.shape(grads[i])), grads[i].shape)
        return out

    def after_step(self, iterations):
        """The moving statistics' mean; the weights' check at the first step
        and every check_every (`iterations`: the optimizer's, after this
        update). The digest is taken in the graph, after the update, so every
        worker sums the same values (a read inside the numpy function could
        come before the update's writes)."""
        check = tf.logical_or(tf.equal(iterations, 1), tf.equal(tf.math.floormod(iterations, self.check_every), 0))
        digest = tf.cond(check, lambda: _digest(self.dense), lambda: tf.constant(0, tf.int64))

        def host_side(checking, value, *stats):
            out = []
            if stats:
                names = [n + "@moving" for n in self.names[len(self.dense):len(self.dense) + len(stats)]]
                out, _ = _host.allreduce(self.client, names, list(stats), [s.shape for s in stats])
            if checking:
                self.client.check_same("weights", int(value) & 0xffffffff)
            return [np.asarray(o, np.float32) for o in out] or [np.float32(0.0)]

        stats = [tf.cast(v.value, tf.float32) for v in self.moving]
        means = tf.numpy_function(host_side, [check, digest] + stats, [tf.float32] * max(len(stats), 1),
                                  stateful=True)
        means = means if isinstance(means, (list, tuple)) else [means]
        for v, mean in zip(self.moving, means):
            v.assign(tf.cast(tf.reshape(mean, v.shape), v.dtype))

    def save_if_due(self):
        """Rank 0, at the end of the step (a loss scale optimizer's too, which
        counts its steps after the inner update): the state, where the
        job's checkpoints keep this step. Read after the step's writes:
        automatic control dependencies keep the order written."""
        if self.client.rank() == 0:
            due = tf.numpy_function(lambda: np.bool_(self.client.state_due(self.start + self.steps)), [],
                                    tf.bool, stateful=True)
            tf.cond(tf.reshape(due, []),
                    lambda: tf.reshape(tf.numpy_function(self._save, [v.value for v in self.kept], tf.int64,
                                                         stateful=True), []),
                    lambda: tf.constant(0, tf.int64))


def _digest(variables):
    """A sum of the variables' bits, with each variable's place mixed in."""
    total = tf.constant(0, tf.int64)
    for i, v in enumerate(variables):
        value = tf.reshape(v.value, [-1])
        bits = tf.bitcast(value, tf.int32 if value.dtype.size == 4 else tf.int16)
        total += tf.reduce_sum(tf.cast(bits, tf.int64)) * (2 * i + 1)
    return total
