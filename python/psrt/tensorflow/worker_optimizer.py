"""Keras's optimizer on the workers: the servers sum, every worker steps.

Where the servers cannot run the optimizer (Nadam, Lion, Adafactor, RMSprop,
Ftrl, amsgrad, use_ema, gradient_accumulation_steps, constraints, ...) or
where asked (``optimizer_on="workers"``), each worker's ``apply`` takes the
mean gradient over the workers (psrt_allreduce, the rule every plugin
shares) and runs the optimizer's own update on it, as the PyTorch plugin's
worker_optimizer.py does: every worker starts from rank 0's variables, the
moving statistics (BatchNormalization's) are averaged each step, and the
workers check now and then that their weights agree. Sync jobs only, and
only where no process must receive the workers' state later
(Client::StateOnWorkers).
"""

import numpy as np
import tensorflow as tf
import keras

import psrt
from psrt import _host


def refusal(optimizer):
    """None where `optimizer` may run on the workers in this job, else why not."""
    try:
        psrt.client().state_on_workers()
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

    def mean(self, grads):
        """The workers' mean gradients (None where no worker had one), as
        float32 tensors, through one numpy_function."""
        given = [i for i, g in enumerate(grads) if g is not None]
        shapes = [tuple(v.shape) for v in self.dense]
        names = self.names[:len(self.dense)]

        def reduce(*values):
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


def _digest(variables):
    """A sum of the variables' bits, with each variable's place mixed in."""
    total = tf.constant(0, tf.int64)
    for i, v in enumerate(variables):
        value = tf.reshape(v.value, [-1])
        bits = tf.bitcast(value, tf.int32 if value.dtype.size == 4 else tf.int16)
        total += tf.reduce_sum(tf.cast(bits, tf.int64)) * (2 * i + 1)
    return total
