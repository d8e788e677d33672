"""Keras 3 (TensorFlow backend): an optimizer whose updates run on psrt's servers.

``DistributedOptimizer(opt)`` returns an optimizer of the same class and
settings whose ``apply`` hands the gradients to the servers and assigns the
weights they send back; the optimizer's own update never runs. The round trip
happens in ``tf.numpy_function``, so it works eagerly, in ``model.fit`` and
in ``tf.function`` (not under XLA: compile with ``jit_compile=False``).

``layers.Embedding`` keeps its rows on the servers as a sparse table; this
optimizer's ``apply`` pushes the tables' row gradients of the step as well
(see psrt/tensorflow/layers.py).
"""

import numpy as np
import tensorflow as tf
import keras

import psrt
from psrt import _host
from psrt.tensorflow import layers


def _server_optimizer(opt):
    """The server-side settings equivalent to a Keras optimizer, or a refusal."""
    cfg = opt.get_config()
    for key in ("clipnorm", "clipvalue", "global_clipnorm", "loss_scale_factor",
                "gradient_accumulation_steps"):
        if cfg.get(key):
            raise psrt.PsrtError("psrt.keras.DistributedOptimizer: %s is not supported; the servers "
                                 "apply the update" % key)
    if cfg.get("use_ema") or cfg.get("amsgrad"):
        raise psrt.PsrtError("psrt.keras.DistributedOptimizer: use_ema and amsgrad are not supported")
    wd = float(cfg.get("weight_decay") or 0.0)
    lr = float(keras.ops.convert_to_numpy(opt.learning_rate))
    if isinstance(opt, keras.optimizers.SGD):
        momentum = float(cfg.get("momentum", 0.0))
        if wd and momentum:
            raise psrt.PsrtError("psrt.keras.DistributedOptimizer: SGD with momentum and weight_decay "
                                 "(Keras decays decoupled) has no server equivalent; use AdamW, or "
                                 "weight decay without momentum")
        return {"name": "sgd", "lr": lr, "momentum": momentum, "nesterov": bool(cfg.get("nesterov")),
                "weight_decay": wd}
    if isinstance(opt, (keras.optimizers.Adam, keras.optimizers.AdamW)):
        # Keras decays weights decoupled, as torch's AdamW does.
        return {"name": "adamw" if wd or isinstance(opt, keras.optimizers.AdamW) else "adam", "lr": lr,
                "beta1": float(cfg["beta_1"]), "beta2": float(cfg["beta_2"]), "eps": float(cfg["epsilon"]),
                "weight_decay": wd}
    if isinstance(opt, keras.optimizers.Adagrad):
        if wd:
            raise psrt.PsrtError("psrt.keras.DistributedOptimizer: Adagrad with weight_decay is not supported")
        return {"name": "adagrad", "lr": lr, "eps": float(cfg["epsilon"]),
                "initial_accumulator_value": float(cfg["initial_accumulator_value"])}
    raise psrt.PsrtError("psrt.keras.DistributedOptimizer: %s cannot run on the parameter servers; use "
                         "keras.optimizers.SGD, Adam, AdamW or Adagrad" % type(opt).__name__)


class _Distributed:
    """Mixed into the wrapped optimizer's class (see DistributedOptimizer)."""

    def build(self, variables):
        super().build(variables)
        if getattr(self, "_psrt_vars", None) is not None:
            return
        # Built while model.fit traces its first step: init_scope registers
        # eagerly all the same, once, before that step runs, so every worker
        # starts from rank 0's values.
        # Tables' push triggers stay here: their rows are on the servers already.
        dense = [v for v in variables if layers.table_of(v) is None]
        with tf.init_scope():
            names = _host.unique_names([v.path for v in dense])
            host = _host.HostVariables(psrt.client(), self._psrt_compression)
            for name, v in zip(names, dense):
                v.assign(host.register(name, keras.ops.convert_to_numpy(v), self._psrt_config))
        self._psrt_vars = host
        self._psrt_names = names

    def apply(self, grads, trainable_variables=None):
        variables = list(trainable_variables) if trainable_variables is not None else \
            list(self._trainable_variables)
        if getattr(self, "_psrt_vars", None) is None:
            self.build(variables)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g, tf.float32)
                 for g, v in zip(grads, variables)]
        lr = tf.cast(self.learning_rate, tf.float32)
        host = self._psrt_vars
        tables = [layers.table_of(v) for v in variables]
        dense = [(g, v) for g, v, t in zip(grads, variables, tables) if t is None]
        # A trigger's gradient is an input of the round trip, so the layer's
        # gradient function has kept the rows' gradient before it runs.
        triggers = [g for g, t in zip(grads, tables) if t is not None]
        tables = [t for t in tables if t is not None]

        def round_trip(lr_value, *gs):
            # Every table pushes once per step, rows or not (sync mode).
            for t in tables:
                t.push()
            if not dense:
                return [np.float32(0.0)]
            return host.push_pull(self._psrt_names, gs[:len(dense)], float(lr_value))

        out_types = [tf.float32] * max(len(dense), 1)
        new = tf.numpy_function(round_trip, [lr] + [g for g, _ in dense] + triggers, out_types, stateful=True)
        with tf.control_dependencies(new):
            for (_, v), value in zip(dense, new):
                v.assign(tf.reshape(value, v.shape))
            self.iterations.assign_add(1)


def DistributedOptimizer(optimizer, compression=psrt.Compression.job_default):
    """An optimizer of `optimizer`'s class and settings that runs on the servers.

    Args:
      optimizer: keras.optimizers.SGD (momentum, Nesterov), Adam, AdamW or
        Adagrad; learning-rate schedules work (the current rate reaches the
        servers each step).
      compression: psrt.Compression.fp16 or bf16 halves the bytes on the wire.
    """
    config = _server_optimizer(optimizer)
    cls = type("Distributed" + type(optimizer).__name__, (_Distributed, type(optimizer)), {})
    wrapped = cls.from_config(optimizer.get_config())
    wrapped._psrt_config = config
    wrapped._psrt_compression = compression
    wrapped._psrt_vars = None
    return wrapped
