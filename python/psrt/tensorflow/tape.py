"""DistributedGradientTape: ``tape.gradient`` returns the mean over the
workers, as Horovod's does, so that what a custom loop does with the
gradients after the tape (``tf.clip_by_global_norm``, a check, a log) sees
what one process on the global batch sees.

    with tf.GradientTape() as tape:
        loss = ...
    tape = psrt.keras.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)   # the mean
    grads, _ = tf.clip_by_global_norm(grads, 1.0)
    opt.apply_gradients(zip(grads, model.trainable_variables))

The mean is psrt_allreduce's (worker/reducer.h), the rule every plugin
shares: each worker pushes its gradients, the servers aggregate them once
every worker's are in, every worker pulls the same bytes. Sync jobs only:
async and ssp have no step-wide mean.
"""

import numpy as np
import tensorflow as tf

import psrt
from psrt import _host

_SUFFIX = "@tape"


def _given(values):
    """The positions of the tensors among `values` (None where a gradient is
    missing): tf.numpy_function takes tensors only."""
    return [i for i, v in enumerate(values) if v is not None]


def _fill(values, given, n):
    """`values` back at positions `given` of a list of n, None elsewhere."""
    out = [None] * n
    for i, value in zip(given, values):
        out[i] = value
    return out


class DistributedGradientTape:
    """Wraps a tf.GradientTape; everything but gradient() is the tape's."""

    def __init__(self, tape):
        client = psrt.client()
        if not client.is_sync():
            raise psrt.PsrtError("psrt.keras.DistributedGradientTape: the mean over the workers is a "
                                 "sync step's; this job's mode has none (each worker's gradient goes "
                                 "to the servers alone)")
        try:
            client.every_worker_each_step()
        except psrt.PsrtError as e:
            raise psrt.PsrtError("psrt.keras.DistributedGradientTape needs every worker: %s" % e) from None
        self._tape = tape
        self._client = client

    def __getattr__(self, name):
        return getattr(self._tape, name)

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients, **kwargs)
        flat_sources, flat = tf.nest.flatten(sources), tf.nest.flatten(grads)
        names = _host.unique_names([v.path + _SUFFIX for v in flat_sources])
        given = _given(flat)
        # A variable without a gradient here is pushed as such (the others'
        # mean counts it as zeros) and stays None, as the tape has it.
        tensors = [tf.cast(tf.convert_to_tensor(flat[i]), tf.float32) for i in given]
        shapes = [tuple(v.shape) for v in flat_sources]
        means = tf.numpy_function(lambda *a: self._mean(names, shapes, _fill(a, given, len(flat)), given),
                                  tensors, [tf.float32] * len(given), stateful=True)
        means = means if isinstance(means, (list, tuple)) else [means]
        out = [None] * len(flat)
        for i, mean, g in zip(given, means, tensors):
            out[i] = tf.cast(tf.ensure_shape(tf.reshape(mean, tf.shape(g)), g.shape), flat[i].dtype)
        return tf.nest.pack_sequence_as(grads, out)

    def _mean(self, names, shapes, grads, given):
        means, _ = _host.allreduce(self._client, names, grads, shapes)
        return [means[i] for i in given]
