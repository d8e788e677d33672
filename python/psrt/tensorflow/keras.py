"""Keras 3 (TensorFlow backend): an optimizer whose updates run on psrt's servers.

``DistributedOptimizer(opt)`` returns an optimizer of the same class and
settings whose ``apply`` hands the gradients to the servers and assigns the
weights they send back; the optimizer's own update never runs. The round trip
happens in ``tf.numpy_function``, so it works eagerly, in ``model.fit`` and
in ``tf.function`` (not under XLA: compile with ``jit_compile=False``).

In sync mode a step equals one process on the mean gradient, Keras's
features included:

- Gradient clipping (``clipnorm``, ``global_clipnorm``, ``clipvalue``)
  clips the mean gradient: each variable has a companion key of kind
  ``assign`` (``<name>@grad``) whose value becomes the mean of the workers'
  pushes; every worker pulls that mean, clips it as Keras does and pushes
  the clipped gradient (the same on every worker) to the variable's key. That
  costs a second round trip, paid only when clipping is on. In async and ssp
  modes there is no step-wide mean: each worker clips its own gradient.
- ``keras.optimizers.LossScaleOptimizer`` (``mixed_float16``, also as
  ``model.compile`` adds it) decides on the mean of the scaled gradients,
  pulled the same way, so an overflow skips the step on every worker and the
  loss scale follows one schedule; the servers get unscaled gradients and
  nothing of a skipped step.
  ``loss_scale_factor`` (a fixed scale) divides before the push.
- The model's non-trainable variables are keys of kind ``assign`` too, so
  every worker starts from rank 0's values (frozen layers' weights) and
  checkpoints hold them. Those of trainable layers (BatchNormalization's
  moving mean and variance) change in the forward pass: every step pushes
  them and takes back the mean over the workers (async/ssp: the value the
  last worker pushed). Frozen weights are never pushed. ``model.fit`` finds
  the model by itself; custom loops pass ``model=``.

``layers.Embedding`` keeps its rows on the servers as a sparse table; this
optimizer's ``apply`` pushes the tables' row gradients of the step as well
(see psrt/tensorflow/layers.py).
"""

import sys

import numpy as np
import tensorflow as tf
import keras

import psrt
from psrt import _host
from psrt.tensorflow import layers, worker_optimizer
from psrt.tensorflow.tape import DistributedGradientTape, _fill, _given  # noqa: F401

_CLIPPING = ("clipnorm", "global_clipnorm", "clipvalue")
_ASSIGN = "assign"


def _refuse(what):
    return psrt.PsrtError("psrt.keras.DistributedOptimizer: " + what)


def _server_optimizer(opt):
    """The server-side settings equivalent to a Keras optimizer, or a refusal."""
    cfg = opt.get_config()
    if cfg.get("gradient_accumulation_steps"):
        raise _refuse("gradient_accumulation_steps is not supported; the servers apply the update "
                      "every step (accumulate in the training loop, or raise the batch size)")
    if cfg.get("use_ema") or cfg.get("amsgrad"):
        raise _refuse("use_ema and amsgrad are not supported")
    wd = float(cfg.get("weight_decay") or 0.0)
    lr = float(keras.ops.convert_to_numpy(opt.learning_rate))
    if isinstance(opt, keras.optimizers.SGD):
        momentum = float(cfg.get("momentum", 0.0))
        if wd and momentum:
            raise _refuse("SGD with momentum and weight_decay (Keras decays decoupled) has no server "
                          "equivalent; use AdamW, or weight decay without momentum")
        return {"name": "sgd", "lr": lr, "momentum": momentum, "nesterov": bool(cfg.get("nesterov")),
                "weight_decay": wd}
    if isinstance(opt, (keras.optimizers.Adam, keras.optimizers.AdamW)):
        # Keras decays weights decoupled, as torch's AdamW does.
        return {"name": "adamw" if wd or isinstance(opt, keras.optimizers.AdamW) else "adam", "lr": lr,
                "beta1": float(cfg["beta_1"]), "beta2": float(cfg["beta_2"]), "eps": float(cfg["epsilon"]),
                "weight_decay": wd}
    if isinstance(opt, keras.optimizers.Adagrad):
        if wd:
            raise _refuse("Adagrad with weight_decay is not supported")
        return {"name": "adagrad", "lr": lr, "eps": float(cfg["epsilon"]),
                "initial_accumulator_value": float(cfg["initial_accumulator_value"])}
    raise _refuse("%s cannot run on the parameter servers; use keras.optimizers.SGD, Adam, AdamW or "
                  "Adagrad, or run it on the workers (sync jobs: optimizer_on=\"workers\")" % type(opt).__name__)


def _set(obj, name, value):
    """Sets a plain attribute: Keras would track a model or an optimizer
    assigned to an optimizer as part of its state."""
    object.__setattr__(obj, name, value)


def _callers(opt):
    """The LossScaleOptimizer and the keras.Model that called `opt`'s build,
    if any: model.fit builds the optimizer from the model (through the loss
    scale optimizer that model.compile adds under mixed_float16)."""
    wrapper = model = None
    frame = sys._getframe(2)
    for _ in range(12):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if (wrapper is None and isinstance(owner, keras.optimizers.LossScaleOptimizer)
                and owner.inner_optimizer is opt):
            wrapper = owner
        elif model is None and isinstance(owner, keras.Model):
            mine = getattr(owner, "optimizer", None)
            if mine is opt or (mine is not None and getattr(mine, "inner_optimizer", None) is opt):
                model = owner
        frame = frame.f_back
    return wrapper, model


def _non_trainable(model):
    """The model's float non-trainable variables, as (moving, fixed): those of
    trainable layers change in the forward pass (BatchNormalization's
    statistics); those of frozen layers do not (a frozen BatchNormalization
    runs in inference mode)."""
    owner = {}
    # Outer layers come first: the innermost layer holding a variable wins.
    for layer in model._flatten_layers(include_self=True, recursive=True):
        for v in layer.non_trainable_variables:
            owner[id(v)] = (v, layer.trainable)
    moving, fixed = [], []
    for v, trainable in owner.values():
        if v.trainable or not tf.as_dtype(v.dtype).is_floating:
            continue  # seed generators' states: each worker's own
        (moving if trainable else fixed).append(v)
    return moving, fixed


# Variables a DistributedOptimizer registered, by id: a second optimizer of
# the same model (a GAN's) leaves them to the first.
_claimed = set()


class _Keys:
    """One optimizer's keys on the servers and the host side of its step:
    the model's variables, the moving statistics and frozen weights (kind
    assign), the mean-gradient companions and a control key (sync with
    clipping or loss scaling)."""

    def __init__(self, opt, dense, model):
        client = psrt.client()
        self.sync = sync = client.is_sync()
        config = opt._psrt_config
        moving, fixed = _non_trainable(model) if model is not None else ([], [])
        moving = [v for v in moving if id(v) not in _claimed]
        fixed = [v for v in fixed if id(v) not in _claimed]
        self.moving = moving
        names = _host.unique_names([v.path for v in dense + moving + fixed])
        self.names = names[:len(dense)]
        self.moving_names = names[len(dense):len(dense) + len(moving)]
        self.clip = any(getattr(opt, k, None) for k in _CLIPPING)
        # The mean gradient comes back before the update (sync mode only:
        # async pushes apply at once, so no step-wide mean exists).
        self.averaged = sync and (self.clip or opt._psrt_loss_scale is not None)
        self.grad_names = [n + "@grad" for n in self.names] if self.averaged else []
        # Servers that sum (gradient_aggregation "sum"): each worker pushes 1
        # to the control key with the statistics, and their sum is the number
        # of workers that pushed, which makes the statistics a mean again.
        # Servers that average need no count.
        self.counted = sync and not client.averages() and bool(moving)
        self.control_name = (self.names[0] if self.names else "keras") + "@workers"
        # The servers' aggregate over the workers' mean, as the step's
        # reduction or control key said.
        self.count = 1.0
        self.client = client
        self.shapes = [tuple(v.shape) for v in dense]
        assign = {"name": _ASSIGN, "lr": config["lr"]}  # the rate is unused
        exact = psrt.Compression.none
        self.host = host = _host.HostVariables(client, opt._psrt_compression)
        for i, (name, v) in enumerate(zip(names, dense + moving + fixed)):
            value = keras.ops.convert_to_numpy(v).astype(np.float32)
            if i < len(dense):
                # exclude_from_weight_decay, per variable as Keras decides it.
                decays = not config.get("weight_decay") or opt._use_weight_decay(v)
                value = host.register(name, value, config if decays else dict(config, weight_decay=0.0))
            else:
                # Statistics and frozen weights travel exactly: every worker
                # holds the same bits. Frozen weights are never pushed.
                value = host.register(name, value, assign, exact)
            v.assign(tf.cast(value.reshape(v.shape), v.dtype))
        if self.counted:
            host.register(self.control_name, np.ones((1,), np.float32), assign, exact)
        _claimed.update(id(v) for v in dense + moving + fixed)

    def _counted(self, names, values, lr=None):
        """push_pull; where the servers sum, with the control key, whose
        aggregate (the number of workers that pushed) becomes self.count."""
        if self.counted:
            names, values = list(names) + [self.control_name], list(values) + [np.ones((1,), np.float32)]
        out = self.host.push_pull(names, values, lr)
        if self.counted:
            self.count = float(out.pop()[0])
        return out

    def _mean_stats(self, stats):
        """The statistics' aggregate as their mean over the workers."""
        return [s / np.float32(self.count) for s in stats] if self.counted else stats

    def mean(self, grads, stats):
        """Sync with companions: the workers' aggregated gradient (as the
        servers aggregate: their mean, or their sum under gradient_aggregation
        "sum"; psrt_allreduce) and the mean statistics. Otherwise the
        statistics only; the gradients stay this worker's."""
        if self.averaged:
            op = _host.MEAN if self.client.averages() else _host.SUM
            grads, self.count = _host.allreduce(self.client, self.grad_names, grads, self.shapes, op,
                                                self.host.compression)
        grads = [np.asarray(g if g is not None else (), np.float32) for g in grads]
        stats = self._mean_stats(self._counted(self.moving_names, stats)) if self.moving_names else []
        return grads + stats

    def update(self, lr, grads, stats):
        """Pushes the gradients (after `mean`, each worker its share of the
        aggregate, so that the servers' aggregate is the clipped aggregate)
        and `stats` if `mean` has not; returns the new weights and means."""
        if self.averaged and self.count != 1.0:
            grads = [None if g is None else np.asarray(g, np.float32) / np.float32(self.count)
                     for g in grads]
        if not len(stats):
            return self.host.push_pull(self.names, grads, float(lr)) if self.names else [np.float32(0.0)]
        out = self._counted(self.names + self.moving_names, list(grads) + list(stats), float(lr))
        return out[:len(self.names)] + self._mean_stats(out[len(self.names):])

    def skip(self, lr):
        """A step that the loss scale skips. Sync: every worker skips it, so
        nothing is pushed. Async and ssp: this worker pushes NaN, which the
        servers do not apply ("nonfinite": "skip") while its clock moves on,
        so that bounded staleness does not wait for it."""
        if self.sync or not self.names:
            return [np.float32(0.0)]
        self.host.push_pull(self.names, [np.full(s, np.nan, np.float32) for s in self.shapes], float(lr))
        return [np.float32(0.0)]


def _float_grads(grads):
    """float32 gradients; None stays None: the variable has no gradient this
    step, which the servers skip where no worker had one, as Keras does."""
    return [None if g is None else tf.cast(tf.convert_to_tensor(g), tf.float32) for g in grads]


def _assign(variables, values):
    for v, value in zip(variables, values):
        v.assign(tf.cast(tf.reshape(value, v.shape), v.dtype))


class _Distributed:
    """Mixed into the wrapped optimizer's class (see DistributedOptimizer)."""

    def build(self, variables):
        super().build(variables)
        wrapper, model = _callers(self)
        if wrapper is not None and not isinstance(wrapper, _DistributedLossScale):
            # model.compile under mixed_float16 (or the user) wrapped this
            # optimizer in a plain LossScaleOptimizer, which would test each
            # worker's own gradient for overflow: make it decide on the mean.
            object.__setattr__(wrapper, "__class__", _loss_scale_class(type(wrapper)))
        keys = getattr(self, "_psrt_keys", None)
        if wrapper is not None and self._psrt_loss_scale is None:
            if keys is not None:
                raise _refuse("it was built before a LossScaleOptimizer wrapped it; wrap first "
                              "(DistributedOptimizer(keras.optimizers.LossScaleOptimizer(opt)))")
            _set(self, "_psrt_loss_scale", wrapper)
        if keys is not None:
            return
        dense = [v for v in variables if layers.table_of(v) is None]
        if self._psrt_on_workers:
            if len(dense) < len(variables):
                raise _refuse("psrt.keras.layers.Embedding's rows are updated by the servers' optimizer; "
                              "with the optimizer on the workers, train models without tables")
            with tf.init_scope():
                model = model if self._psrt_model is None else self._psrt_model
                moving, fixed = _non_trainable(model) if model is not None else ([], [])
                _set(self, "_psrt_keys", worker_optimizer.WorkerKeys(self, dense, moving, fixed,
                                                                     self._psrt_check_every))
            return
        overwritten = [v.path for v in dense if getattr(v, "overwrite_with_gradient", False)]
        if overwritten:
            # Float8 layers' scales take their "gradient" as the new value.
            raise _refuse("%s takes its gradient as its new value (overwrite_with_gradient, float8 "
                          "training), which the servers would apply as a gradient; train without "
                          "float8 layers" % ", ".join(overwritten))
        constrained = [v.path for v in dense if getattr(v, "constraint", None) is not None]
        if constrained:
            # Keras applies a constraint to the weights after each update;
            # the servers hold the weights and apply the update.
            raise _refuse("%s has a constraint (kernel_constraint, bias_constraint, ...), which Keras "
                          "applies to the weights after each update; the servers hold the weights and "
                          "apply the update, so it would not reach them. Train it without the "
                          "constraint, or run the optimizer on the workers (optimizer_on=\"workers\")"
                          % ", ".join(constrained))
        if len(dense) < len(variables) and (any(getattr(self, k, None) for k in _CLIPPING) or
                                            self._psrt_loss_scale is not None or self.loss_scale_factor):
            raise _refuse("clipnorm, global_clipnorm, clipvalue and loss scaling do not reach "
                          "psrt.keras.layers.Embedding's rows; train models with tables without them")
        # Built while model.fit traces its first step: init_scope registers
        # eagerly all the same, once, before that step runs, so every worker
        # starts from rank 0's values.
        # Tables' push triggers stay here: their rows are on the servers already.
        with tf.init_scope():
            _set(self, "_psrt_keys", _Keys(self, dense, model if self._psrt_model is None else self._psrt_model))

    def _psrt_mean(self, grads, variables):
        """The step's first round trip where it has one (clipping or loss
        scaling in sync mode, or a model with moving statistics under a loss
        scale optimizer): the gradients to clip and apply (sync: the
        aggregate over workers), the statistics' means assigned."""
        keys = self._psrt_keys
        if self._psrt_on_workers:
            return keys.mean(grads)
        dense = [g for g, v in zip(grads, variables) if layers.table_of(v) is None]
        if not keys.averaged and not keys.moving:
            return dense
        stats = [tf.cast(v.value, tf.float32) for v in keys.moving]
        given = _given(dense)
        out = tf.numpy_function(
            lambda *a: keys.mean(_fill(a[:len(given)], given, len(dense)), a[len(given):]),
            [dense[i] for i in given] + stats, [tf.float32] * (len(dense) + len(stats)), stateful=True)
        with tf.control_dependencies(out):
            _assign(keys.moving, out[len(dense):])
        return [None if d is None else tf.ensure_shape(tf.reshape(g, tf.shape(d)), d.shape)
                for g, d in zip(out, dense)]

    def _psrt_update(self, dense_grads, variables, grads, stats):
        """Pushes `dense_grads` (clipped here as Keras clips) with the
        tables' rows and `stats`; assigns what comes back."""
        keys = self._psrt_keys
        if keys.clip:
            dense_grads = self._clip_gradients(dense_grads)
        lr = tf.cast(self.learning_rate, tf.float32)
        tables = [layers.table_of(v) for v in variables]
        dense = [v for v, t in zip(variables, tables) if t is None]
        # A trigger's gradient is an input of the round trip, so the layer's
        # gradient function has kept the rows' gradient before it runs.
        triggers = [g for g, t in zip(grads, tables) if t is not None and g is not None]
        tables = [t for t in tables if t is not None]
        given = _given(dense_grads)

        def round_trip(lr_value, *values):
            # Every table pushes once per step, rows or not (sync mode).
            for t in tables:
                t.push()
            return keys.update(lr_value, _fill(values[:len(given)], given, len(dense)),
                               values[len(given):len(given) + len(stats)])

        new = tf.numpy_function(round_trip, [lr] + [dense_grads[i] for i in given] + stats + triggers,
                                [tf.float32] * max(len(dense) + len(stats), 1), stateful=True)
        with tf.control_dependencies(new):
            _assign(dense + keys.moving[:len(stats)], new)
            self.iterations.assign_add(1)

    def _psrt_skip(self):
        if self._psrt_on_workers:
            return  # every worker skips the same step: nothing to tell the servers
        keys = self._psrt_keys
        lr = tf.cast(self.learning_rate, tf.float32)
        tf.numpy_function(lambda lr_value: keys.skip(lr_value), [lr], [tf.float32], stateful=True)

    def apply(self, grads, trainable_variables=None):
        variables = list(trainable_variables) if trainable_variables is not None else \
            list(self._trainable_variables)
        if getattr(self, "_psrt_keys", None) is None:
            self.build(variables)
        grads = _float_grads(grads)
        if self._psrt_on_workers:
            # The optimizer's own update (clipping, loss_scale_factor,
            # constraints, EMA, accumulation) on the mean gradient; a loss
            # scale optimizer has averaged them already.
            if self._psrt_loss_scale is None:
                grads = self._psrt_keys.mean(grads)
            super().apply([None if g is None else tf.cast(g, v.dtype) for g, v in zip(grads, variables)],
                          trainable_variables)
            self._psrt_keys.after_step(self.iterations)
            if self._psrt_loss_scale is None:
                self._psrt_keys.save_if_due()
            return
        if self.loss_scale_factor:
            grads = [None if g is None else g / self.loss_scale_factor for g in grads]
        keys = self._psrt_keys
        if self._psrt_loss_scale is not None:
            # The loss scale optimizer has averaged and unscaled them, and
            # taken the statistics' means.
            dense = [g for g, v in zip(grads, variables) if layers.table_of(v) is None]
            self._psrt_update(dense, variables, grads, [])
        elif keys.averaged:
            self._psrt_update(self._psrt_mean(grads, variables), variables, grads, [])
        else:
            # One round trip: the statistics travel with the gradients.
            dense = [g for g, v in zip(grads, variables) if layers.table_of(v) is None]
            self._psrt_update(dense, variables, grads, [tf.cast(v.value, tf.float32) for v in keys.moving])


class _DistributedLossScale:
    """Mixed into keras.optimizers.LossScaleOptimizer: the overflow test and
    the loss scale's schedule run on the mean of the workers' scaled
    gradients (sync mode), so every worker skips the same steps (see
    _Keys.skip)."""

    def apply(self, grads, trainable_variables=None):
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        inner = self.inner_optimizer
        variables = list(trainable_variables) if trainable_variables is not None else \
            list(self._trainable_variables)
        grads = inner._psrt_mean(_float_grads(grads), variables)
        tf.cond(self.check_finite(grads),
                lambda: self._stateful_handle_finite_grads(grads, trainable_variables),
                self._stateful_handle_non_finite_grads)
        if inner._psrt_on_workers:
            inner._psrt_keys.save_if_due()

    def _stateful_handle_non_finite_grads(self):
        self.inner_optimizer._psrt_skip()
        super()._stateful_handle_non_finite_grads()


_loss_scale_classes = {}


def _loss_scale_class(cls):
    if cls not in _loss_scale_classes:
        _loss_scale_classes[cls] = type("Distributed" + cls.__name__, (_DistributedLossScale, cls), {})
    return _loss_scale_classes[cls]


def _on_workers(optimizer, optimizer_on):
    """Whether `optimizer` runs on the workers: where asked, or ("auto") in
    a sync job where the servers cannot run it."""
    if optimizer_on not in ("auto", "servers", "workers"):
        raise _refuse('optimizer_on is "auto", "servers" or "workers"; got %r' % (optimizer_on,))
    if optimizer_on == "servers":
        return False
    if optimizer_on == "auto":
        try:
            _server_optimizer(optimizer)
            return False
        except psrt.PsrtError as e:
            if psrt._client is None or not psrt.client().is_sync():
                raise  # no job yet, or one without a step-wide mean
            why = worker_optimizer.refusal(optimizer)
            if why is not None:
                raise _refuse("%s; and %s" % (str(e).split(": ", 1)[1], why)) from None
            return True
    why = worker_optimizer.refusal(optimizer)
    if why is not None:
        raise _refuse(why)
    return True


def DistributedOptimizer(optimizer, compression=psrt.Compression.job_default, model=None, optimizer_on="auto",
                         check_every=100):
    """An optimizer of `optimizer`'s class and settings that runs on the
    servers, or on every worker on the mean gradient.

    Args:
      optimizer: on the servers: keras.optimizers.SGD (momentum, Nesterov),
        Adam, AdamW or Adagrad, with clipnorm, global_clipnorm or clipvalue
        if wanted; learning-rate schedules work (the current rate reaches the
        servers each step). On the workers: any Keras optimizer. Or a
        keras.optimizers.LossScaleOptimizer around one.
      compression: psrt.Compression.fp16 or bf16 halves the bytes on the wire.
      model: the keras.Model trained, so that its frozen weights start from
        rank 0's values and BatchNormalization's statistics are averaged
        every step. model.fit finds it without this; custom training loops
        pass it.
      optimizer_on: "servers", "workers" (sync jobs: every worker applies
        the optimizer's own update to the mean gradient; worker_optimizer.py)
        or "auto" (the default): the servers where they can run it, else
        the workers.
      check_every: on the workers, they check that their weights agree at
        the first step and every this many steps; a worker that differs is
        an error naming it.
    """
    if isinstance(optimizer, (_Distributed, _DistributedLossScale)):
        raise _refuse("the optimizer is distributed already")
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        inner = DistributedOptimizer(optimizer.inner_optimizer, compression, model, optimizer_on, check_every)
        cfg = optimizer.get_config()
        wrapped = _loss_scale_class(type(optimizer))(inner, initial_scale=cfg["initial_scale"],
                                                      dynamic_growth_steps=cfg["dynamic_growth_steps"],
                                                      name=cfg["name"])
        _set(inner, "_psrt_loss_scale", wrapped)
        return wrapped
    on_workers = _on_workers(optimizer, optimizer_on)
    config = None if on_workers else _server_optimizer(optimizer)
    cls = type("Distributed" + type(optimizer).__name__, (_Distributed, type(optimizer)), {})
    wrapped = cls.from_config(optimizer.get_config())
    # exclude_from_weight_decay(), called on `optimizer`, is no part of its
    # config.
    for attr in ("_exclude_from_weight_decay", "_exclude_from_weight_decay_pattern"):
        if hasattr(optimizer, attr):
            _set(wrapped, attr, getattr(optimizer, attr))
    wrapped._psrt_config = config
    wrapped._psrt_compression = compression
    _set(wrapped, "_psrt_model", model)
    _set(wrapped, "_psrt_loss_scale", None)
    _set(wrapped, "_psrt_keys", None)
    _set(wrapped, "_psrt_on_workers", on_workers)
    _set(wrapped, "_psrt_check_every", check_every)
    return wrapped
