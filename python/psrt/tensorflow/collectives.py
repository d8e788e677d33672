"""psrt.collectives for TensorFlow: ``psrt.tensorflow.allreduce(t)`` and the
rest, as Horovod's (eager tensors or anything numpy takes; results are
tensors of the input's dtype), and ``MetricAverageCallback``, which makes
the metrics Keras logs at the end of an epoch (``validation_data``'s
included) the workers' mean, as Horovod's callback does."""

import numpy as np
import tensorflow as tf
from tensorflow import keras

from psrt import collectives


def _numpy(values):
    return values.numpy() if hasattr(values, "numpy") else np.asarray(values)


def allreduce(values, op="average"):
    """The workers' mean ("average") or sum ("sum")."""
    values = _numpy(values)
    return tf.constant(collectives.allreduce(values, op).astype(values.dtype, copy=False))


def allgather(values):
    """Every worker's values stacked along a new first axis, by rank."""
    return tf.constant(collectives.allgather(_numpy(values)))


def broadcast(values, root_rank=0):
    """Rank `root_rank`'s values."""
    return tf.constant(collectives.broadcast(_numpy(values), root_rank))


broadcast_object = collectives.broadcast_object
barrier = collectives.barrier


class MetricAverageCallback(keras.callbacks.Callback):
    """At each epoch's end, every logged metric becomes the workers' mean
    (each worker evaluated its own share of the validation data), so that
    early stopping and checkpoint callbacks after it decide alike on every
    worker. Put it before them in ``callbacks``."""

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        names = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
        means = collectives.allreduce(np.array([float(logs[k]) for k in names], np.float64))
        for k, mean in zip(names, means):
            logs[k] = float(mean)
