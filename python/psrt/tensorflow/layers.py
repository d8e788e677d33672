"""``psrt.keras.layers.Embedding``: a Keras 3 embedding whose rows live on
psrt's servers (docs/sparse.md).

The forward pass takes the batch's distinct ids (``tf.unique``), pulls their
rows in a ``tf.numpy_function`` and gathers. The rows are no Keras weights:
their gradient (one row per distinct id, duplicates summed) reaches Python
through the layer's ``tf.custom_gradient``, which keeps it for the push, and
``psrt.keras.DistributedOptimizer``'s ``apply`` pushes it, once per training
step, as ``psrt.torch.DistributedOptimizer.step()`` does. The optimizer, not
the gradient function, pushes because sync mode needs exactly one push per
worker, table and step: a layer called twice in a step has two gradient
calls, and a table the step's forward did not reach still pushes (no rows).
Train such a model with the psrt optimizer: ``model.compile(optimizer=
psrt.keras.DistributedOptimizer(...), jit_compile=False)``.

Keras's tape computes gradients only for trainable weights, so each layer has
one: a scalar that stays 0 and feeds the lookup, which lets the gradient
reach the layer and orders the push after it (the optimizer's round trip
takes that scalar's gradient as an input). The optimizer does not send it to
the servers.

The step to pull at and push for is kept in Python (psrt._tables.HostTable):
it starts where the table is on the servers (sync) or at
``psrt.restored_step()`` (async, ssp) and grows by one per push.
"""

import itertools

import numpy as np
import tensorflow as tf
import keras

import psrt
from psrt import _tables

_OPTIMIZERS = ("sgd", "adagrad", "adam", "ftrl")
# Keras's optimizers' defaults, with their names.
_DEFAULTS = {
    "sgd": {},
    "adam": {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7},
    "adagrad": {"initial_accumulator_value": 0.1, "epsilon": 1e-7},
    "ftrl": {"learning_rate_power": -0.5, "initial_accumulator_value": 0.1, "l1_regularization_strength": 0.0,
             "l2_regularization_strength": 0.0, "l2_shrinkage_regularization_strength": 0.0, "beta": 0.0},
}
_names = itertools.count()


def _optimizer_config(optimizer, lr, kwargs):
    """A row-wise optimizer with Keras's argument names, for the servers."""
    if optimizer not in _OPTIMIZERS:
        raise psrt.PsrtError("psrt.keras.layers.Embedding: optimizer %r is not row-wise; use one of %s"
                             % (optimizer, ", ".join(_OPTIMIZERS)))
    unknown = sorted(set(kwargs) - set(_DEFAULTS[optimizer]))
    if unknown:
        raise psrt.PsrtError("psrt.keras.layers.Embedding: %s takes no %s (it takes %s)"
                             % (optimizer, unknown, sorted(_DEFAULTS[optimizer]) or "only lr"))
    a = dict(_DEFAULTS[optimizer], **{k: float(v) for k, v in kwargs.items()})
    cfg = {"name": optimizer, "lr": float(lr)}
    if optimizer == "adam":
        # Keras's and TF's LazyAdam form: epsilon added to sqrt(v) before the
        # bias correction, which the servers' (SparseAdam's) form is too.
        cfg.update(beta1=a["beta_1"], beta2=a["beta_2"], eps=a["epsilon"])
    elif optimizer == "adagrad":
        # Keras divides by sqrt(accumulator + epsilon); the servers add eps
        # after the root, so epsilon goes into the accumulator's start.
        cfg.update(initial_accumulator_value=a["initial_accumulator_value"] + a["epsilon"], eps=0.0)
    elif optimizer == "ftrl":
        if a["learning_rate_power"] != -0.5 or a["l2_shrinkage_regularization_strength"] != 0.0:
            raise psrt.PsrtError("psrt.keras.layers.Embedding: ftrl runs with learning_rate_power=-0.5 "
                                 "and no l2_shrinkage_regularization_strength on the servers")
        cfg.update(initial_accumulator_value=a["initial_accumulator_value"],
                   l1=a["l1_regularization_strength"], l2=a["l2_regularization_strength"], ftrl_beta=a["beta"])
    return cfg


class _Lookups:
    """A layer's table and the row gradients of its lookups this step; plain
    Python, out of Keras's attribute tracking."""

    def __init__(self, table):
        self.table = table
        self.pending = []  # (distinct ids, their rows' gradient) per lookup

    def pull(self, ids):
        if self.pending:
            raise psrt.PsrtError("table '%s': the row gradients of the last step were never pushed; train "
                                 "with psrt.keras.DistributedOptimizer, whose apply pushes them"
                                 % self.table.name)
        return self.table.pull(ids)

    def record(self, ids, grads):
        # numpy_function's arrays may share TensorFlow's buffers: copy.
        self.pending.append((np.array(ids, dtype=np.int64), np.array(grads, dtype=np.float32)))
        return np.float32(0.0)

    def push(self):
        pending, self.pending = self.pending, []
        self.table.push(pending)


# The magnitude up to which each float dtype holds every integer.
_EXACT = {tf.float16: 2 ** 11, tf.bfloat16: 2 ** 8, tf.float32: 2 ** 24, tf.float64: 2 ** 53}


def int64_ids(table, inputs):
    """`inputs` as int64 ids. Keras's Embedding casts float ids (Keras's
    inputs are float32 unless declared otherwise), truncating 2.5 to 2: here
    a float id must be a whole number its dtype holds exactly, or the step
    fails with InvalidArgumentError naming the table (as _tables.int_ids)."""
    inputs = tf.convert_to_tensor(inputs)
    if inputs.dtype.is_integer:
        return tf.cast(inputs, tf.int64)
    if inputs.dtype not in _EXACT:
        raise psrt.PsrtError("table '%s': ids of dtype %s; ids are integers" % (table, inputs.dtype.name))
    exact = _EXACT[inputs.dtype]
    whole = tf.reduce_all(tf.logical_and(tf.equal(tf.floor(inputs), inputs),
                                         tf.less_equal(tf.abs(inputs), tf.cast(exact, inputs.dtype))))
    # No quotes: a graph's assertion prints them escaped.
    check = tf.debugging.Assert(whole, ["table %s: ids of dtype %s must be whole numbers of magnitude at "
                                        "most %d (held exactly)" % (table, inputs.dtype.name, exact)])
    with tf.control_dependencies([check]):
        return tf.cast(inputs, tf.int64)


def table_of(variable):
    """The lookups behind a layer's push trigger; None for other variables."""
    return getattr(variable, "_psrt_lookups", None)


class Embedding(keras.layers.Layer):
    """``keras.layers.Embedding(input_dim, output_dim)`` with its rows on the servers.

    Args:
      input_dim: the vocabulary (ids in [0, input_dim)); 0 or None for an
        open hash table whose ids are any int64 (hashed features).
      output_dim: the row size.
      name: the layer's name and the table's on the servers (every worker
        the same); default "embedding<N>" in creation order.
      optimizer: "sgd", "adagrad", "adam" (LazyAdam: only the batch's rows
        and their moments change) or "ftrl", run by the servers on each row
        the step's batches touched, with the mean over workers of its
        gradient. ``optimizer_args`` take Keras's names and defaults
        (``beta_1``, ``beta_2``, ``epsilon``, ``initial_accumulator_value``;
        ftrl: ``l1_regularization_strength``, ``l2_regularization_strength``,
        ``beta``).
      lr: the table's learning rate (fixed; schedules of the Keras optimizer
        do not reach it).
      seed, init_std: a new row is N(0, init_std^2) drawn from (seed, id);
        0.05 is Keras's RandomNormal default.
      embeddings_initializer: instead, as Keras's Embedding takes it (a name,
        an Initializer, or keras.initializers.Constant(matrix) for pretrained
        rows): rank 0's initializer((input_dim, output_dim)) is every worker's
        table, sent once a job (psrt._tables.start_from), so a fixed
        input_dim is needed.
      max_rows, evict_after_steps, evict_min_count: open hash tables' cap per
        server and eviction (docs/sparse.md).
      compression: psrt.Compression for the rows and gradients on the wire.
      mask_zero: as Keras's Embedding.
    """

    def __init__(self, input_dim, output_dim, name=None, optimizer="adam", lr=1e-3, seed=0, init_std=None,
                 max_rows=0, evict_after_steps=0, evict_min_count=0, compression=psrt.Compression.job_default,
                 mask_zero=False, embeddings_initializer=None, **optimizer_args):
        if isinstance(compression, str):
            compression = psrt.Compression[compression]
        name = name if name is not None else "embedding%d" % next(_names)
        super().__init__(name=name)
        self.input_dim = int(input_dim or 0)
        self.output_dim = int(output_dim)
        self.mask_zero = bool(mask_zero)
        initializer = None
        if embeddings_initializer is not None:
            if init_std is not None or not self.input_dim:
                raise psrt.PsrtError(
                    "psrt.keras.layers.Embedding '%s': embeddings_initializer starts the rows of a fixed "
                    "vocabulary (input_dim > 0; got %d) and replaces init_std (got %s)"
                    % (name, self.input_dim, init_std))
            initializer = keras.initializers.get(embeddings_initializer)
            embeddings_initializer = keras.initializers.serialize(initializer)
        self._settings = dict(optimizer=optimizer, lr=lr, seed=seed, init_std=init_std, max_rows=max_rows,
                              evict_after_steps=evict_after_steps, evict_min_count=evict_min_count,
                              compression=compression.name, mask_zero=mask_zero,
                              embeddings_initializer=embeddings_initializer, **optimizer_args)
        table = _tables.HostTable("psrt.keras.layers.Embedding", name, self.output_dim, self.input_dim,
                                  _optimizer_config(optimizer, lr, optimizer_args), seed,
                                  0.0 if initializer else 0.05 if init_std is None else init_std, max_rows,
                                  evict_after_steps, evict_min_count, compression)
        if initializer is not None:
            shape = (self.input_dim, self.output_dim)
            _tables.start_from(psrt.client(), name, self.output_dim,
                               lambda: (np.arange(shape[0]), keras.ops.convert_to_numpy(initializer(shape, "float32"))))
        self._lookups = _Lookups(table)
        self.push_trigger = self.add_weight(shape=(), initializer="zeros", trainable=True, autocast=False,
                                            name="push_trigger")
        self.push_trigger._psrt_lookups = self._lookups
        self.built = True

    @property
    def table_name(self):
        return self._lookups.table.name

    def call(self, inputs):
        ids = int64_ids(self.table_name, inputs)
        distinct, index = tf.unique(tf.reshape(ids, [-1]))
        rows = self._lookup(distinct, tf.convert_to_tensor(self.push_trigger))
        out = tf.reshape(tf.gather(rows, index), tf.concat([tf.shape(ids), [self.output_dim]], 0))
        return tf.cast(out, self.compute_dtype)

    def _lookup(self, distinct, trigger):
        lookups, dim = self._lookups, self.output_dim

        @tf.custom_gradient
        def lookup(distinct, trigger):
            rows = tf.numpy_function(lookups.pull, [distinct], tf.float32, stateful=True)
            rows.set_shape([None, dim])

            def grad(dy):
                if isinstance(dy, tf.IndexedSlices):  # from tf.gather: one slice per lookup
                    dy = tf.math.unsorted_segment_sum(dy.values, dy.indices, tf.shape(distinct)[0])
                done = tf.numpy_function(lookups.record, [distinct, tf.cast(dy, tf.float32)], tf.float32,
                                         stateful=True)
                # The trigger's gradient (0) carries the dependency on record.
                return None, tf.reshape(done, tf.shape(trigger))

            return rows, grad

        return lookup(distinct, trigger)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.output_dim,)

    def compute_mask(self, inputs, mask=None):
        return tf.not_equal(inputs, 0) if self.mask_zero else None

    def rows(self, ids):
        """The rows (numpy) of `ids` at this worker's step (sync: once every
        worker's last pushed step is applied): to inspect or export."""
        return self._lookups.table.rows(ids)

    def get_config(self):
        return dict(name=self.name, input_dim=self.input_dim, output_dim=self.output_dim, **self._settings)
