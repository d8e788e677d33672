"""TensorFlow plugin: ``import psrt.tensorflow as psrt``.

    psrt.init()
    model.compile(optimizer=psrt.keras.DistributedOptimizer(keras.optimizers.Adam(1e-3)),
                  loss=..., jit_compile=False)
    model.fit(x, y)          # every worker on its own share of the data

Custom training loops, eagerly or inside ``tf.function``, use the same
optimizer: ``opt.apply_gradients(zip(tape.gradient(loss, vars), vars))``
after ``opt.build(vars)`` (which registers the variables with the servers,
eagerly: rank 0's values become everyone's).

``psrt.keras.DistributedGradientTape(tape)`` makes ``tape.gradient`` return
the mean over the workers (sync), so that a clip in the loop after it clips
what one process would.

Collectives for the user's own values, as Horovod's: ``psrt.allreduce``,
``allgather``, ``broadcast``, ``broadcast_object``, ``barrier``, and
``psrt.MetricAverageCallback()`` for the metrics ``fit`` logs.

Embedding tables whose rows live on the servers (docs/sparse.md):

    emb = psrt.keras.layers.Embedding(vocab, 16, name="user", optimizer="adam", lr=1e-3)

the DistributedOptimizer's apply pushes their row gradients every step.
"""

from psrt import (Compression, PsrtError, init, is_sync, local_rank, rank,
                  restored_step, size)
from psrt.tensorflow import keras
from psrt.tensorflow.collectives import (MetricAverageCallback, allgather, allreduce, barrier, broadcast,
                                         broadcast_object)

__all__ = ["Compression", "MetricAverageCallback", "PsrtError", "allgather", "allreduce", "barrier",
           "broadcast", "broadcast_object", "init", "is_sync", "keras", "local_rank", "rank", "restored_step",
           "size"]
