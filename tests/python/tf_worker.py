"""A TensorFlow training process for the plugin's tests, started by psrt-run.

A small Keras model (--model: an MLP, self-attention, BatchNormalization, or a
frozen keras.applications backbone under a Dense head) on random regression
data, rank r's batch at step s drawn from seed (s, r), trained through
psrt.keras.DistributedOptimizer in a custom loop (tf.function by default, or
eager) or with model.fit (--fit). --clip sets one of Keras's clipping
arguments, --mixed trains under mixed_float16 with a LossScaleOptimizer,
--loss-scale-factor sets the optimizer's fixed loss scale.
Rank 0 writes the final variables (numpy .npz; see saved()) to --out; with
--fixed each rank prints its loss over the first and the last two steps.
--configs trains several argument lists one after the other in one job
(TensorFlow imported and the workers started once).
"""

import argparse
import contextlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import psrt.tensorflow as psrt  # noqa: E402

MODELS = ("mlp", "mha", "bn", "frozen", "unused", "nonneg")
# Under --mixed: a scale at which rank 1's gradients overflow float16 and
# rank 0's do not, and growth after two good steps, so that some steps are
# skipped, on one rank's account only, and the scale moves both ways.
MIXED_SCALE = 2.0 ** 15
MIXED_GROWTH = 2


def input_shape(model):
    return {"mlp": (8,), "bn": (8,), "mha": (4, 8), "frozen": (32, 32, 3), "unused": (8,), "nonneg": (8,)}[model]


class WithUnusedHead(keras.Model):
    """A model and a head it never calls: the head's gradient is None at
    every step (Keras's optimizer then leaves it alone, weight decay too)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.head = keras.layers.Dense(1, name="unused_head")
        self.head.build((None, 16))

    def call(self, x, training=False):
        return self.inner(x, training=training)


def build_model(seed, model="mlp", mixed=False, backbone_seed=0):
    """The model, its weights drawn from `seed`, the frozen backbone's from
    `backbone_seed`."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input(input_shape(model))
    if model in ("mlp", "unused", "nonneg"):
        # "unused": biases from ones, so that decaying them would show.
        hidden = keras.layers.Dense(16, activation="tanh",
                                    bias_initializer="ones" if model == "unused" else "zeros")(inputs)
    elif model == "bn":
        hidden = keras.layers.Dense(16)(inputs)
        hidden = keras.layers.Activation("tanh")(keras.layers.BatchNormalization(momentum=0.8)(hidden))
    elif model == "mha":
        hidden = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)(inputs, inputs)
        hidden = keras.layers.GlobalAveragePooling1D()(hidden)
    else:
        keras.utils.set_random_seed(backbone_seed)
        backbone = keras.applications.MobileNetV3Small(input_shape=input_shape(model), include_top=False,
                                                       weights=None, minimalistic=True)
        backbone.trainable = False
        keras.utils.set_random_seed(seed)
        hidden = keras.layers.GlobalAveragePooling2D()(backbone(inputs, training=False))
        # Random weights under BatchNormalization's initial statistics make
        # features of about 1e-8: bring them to length 3.
        hidden = keras.layers.LayerNormalization(epsilon=1e-24, center=False, scale=False)(hidden)
        hidden = keras.layers.Rescaling(3.0)(keras.layers.UnitNormalization()(hidden))
    # Under mixed_float16 the output stays float32, as Keras's guide has it.
    constraint = keras.constraints.NonNeg() if model == "nonneg" else None
    outputs = keras.layers.Dense(1, dtype="float32" if mixed else None, kernel_constraint=constraint)(hidden)
    net = keras.Model(inputs, outputs)
    return WithUnusedHead(net) if model == "unused" else net


def batch(step, rank, model="mlp", mixed=False, n=16):
    rng = np.random.default_rng(step * 1000 + rank)
    x = rng.standard_normal((n,) + input_shape(model)).astype(np.float32)
    y = np.sin(x.reshape(n, -1).sum(axis=1, keepdims=True))
    if mixed:
        y = y * (1.0 + 9.0 * rank)  # rank 1's gradients are 10 times larger
    return x, y.astype(np.float32)


def make_optimizer(kind, clip=None, mixed=False, loss_scale_factor=None):
    kwargs = {"loss_scale_factor": loss_scale_factor} if loss_scale_factor else {}
    if clip:
        name, value = clip.split("=")
        kwargs[name] = float(value)
    if kind == "sgd":
        opt = keras.optimizers.SGD(learning_rate=0.1, momentum=0.9, nesterov=True, **kwargs)
    elif kind == "adam":
        opt = keras.optimizers.Adam(learning_rate=1e-2, **kwargs)
    elif kind in ("adamw", "adamw-all"):
        opt = keras.optimizers.AdamW(learning_rate=1e-2, weight_decay=0.5, **kwargs)
        if kind == "adamw":
            opt.exclude_from_weight_decay(var_names=["bias"])  # as BERT's recipe has it
    else:
        raise ValueError(kind)
    if mixed:
        opt = keras.optimizers.LossScaleOptimizer(opt, initial_scale=MIXED_SCALE,
                                                  dynamic_growth_steps=MIXED_GROWTH)
    return opt


def saved(model, opt):
    """What rank 0 writes: the trainable variables, then the non-trainable
    floating ones, then (loss scaling) the loss scale and the number of
    applied steps."""
    arrays = [v.numpy() for v in model.trainable_variables]
    arrays += [v.numpy() for v in model.non_trainable_variables if "float" in str(v.dtype)]
    if isinstance(opt, keras.optimizers.LossScaleOptimizer):
        arrays += [np.array(float(opt.dynamic_scale.numpy())), np.array(float(opt.iterations.numpy()))]
    return arrays


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--model", default="mlp", choices=MODELS)
    p.add_argument("--clip", help="clipnorm=V, global_clipnorm=V or clipvalue=V")
    p.add_argument("--mixed", action="store_true", help="mixed_float16 with a LossScaleOptimizer")
    p.add_argument("--loss-scale-factor", type=float, help="the optimizer's fixed loss scale")
    p.add_argument("--fit", action="store_true", help="model.fit instead of a custom loop")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--eager", action="store_true")
    p.add_argument("--backbone-seed", type=int, default=0, help="-1: the rank")
    p.add_argument("--fixed", action="store_true", help="the same two batches over and over (to see learning)")
    p.add_argument("--tape-clip", type=float, help="custom loop: DistributedGradientTape, then "
                   "tf.clip_by_global_norm to this")
    p.add_argument("--configs", help="a JSON list of argument lists: one after the other in this "
                   "job, the i-th's variables under the name scope ci (its own servers' keys), its "
                   "--out OUT.ci.npz")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    psrt.init()
    rank = psrt.rank()
    if not args.configs:
        train(args, rank)
        return 0
    # psrt.keras knows the variables it registered by id(): a finished
    # case's variables, freed, could pass their ids on to a later case's.
    kept = []
    for i, config in enumerate(json.loads(args.configs)):
        case = p.parse_args(config + ["--out", "%s.c%d.npz" % (args.out, i)])
        kept.append(train(case, rank, "c%d" % i))
    return 0


@contextlib.contextmanager
def dtype_policy(mixed):
    """mixed_float16 for a --mixed case; float32, Keras's default, again
    after it, so that a next case in the same job does not inherit it."""
    keras.mixed_precision.set_global_policy("mixed_float16" if mixed else "float32")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


def train(args, rank, scope=None):
    """One run of main's arguments, the model built under the name scope
    `scope` (its variables' paths, so its servers' keys, begin with it);
    returns the model and the optimizer."""
    with dtype_policy(args.mixed):
        # Rank 0's initial values must win.
        with keras.name_scope(scope) if scope else contextlib.nullcontext():
            backbone_seed = rank if args.backbone_seed < 0 else args.backbone_seed
            model = build_model(seed=rank, model=args.model, mixed=args.mixed,
                                backbone_seed=backbone_seed)
        batches = [batch(step % 2 if args.fixed else step, rank, args.model, args.mixed)
                   for step in range(args.steps)]
        if args.fit:
            # model.compile adds the LossScaleOptimizer itself under mixed_float16.
            inner = make_optimizer(args.optimizer, args.clip)
            opt = psrt.keras.DistributedOptimizer(inner, compression=psrt.Compression.none)
            model.compile(optimizer=opt, loss="mse", jit_compile=False)
            model.fit(np.concatenate([x for x, _ in batches]), np.concatenate([y for _, y in batches]),
                      batch_size=len(batches[0][0]), epochs=1, shuffle=False, verbose=0)
            opt = model.optimizer
        else:
            opt = psrt.keras.DistributedOptimizer(
                make_optimizer(args.optimizer, args.clip, args.mixed, args.loss_scale_factor),
                compression=psrt.Compression.none, model=model)
            opt.build(model.trainable_variables)

            def train_step(x, y):
                with tf.GradientTape() as tape:
                    # The loss scale's (or loss_scale_factor's); else unchanged.
                    loss = opt.scale_loss(tf.reduce_mean(tf.square(model(x, training=True) - y)))
                if args.tape_clip:
                    tape = psrt.keras.DistributedGradientTape(tape)
                grads = tape.gradient(loss, model.trainable_variables)
                if args.tape_clip:
                    grads, _ = tf.clip_by_global_norm(grads, args.tape_clip)
                opt.apply_gradients(zip(grads, model.trainable_variables))
                return loss

            step_fn = train_step if args.eager else tf.function(train_step, jit_compile=False)
            losses = [float(step_fn(x, y)) for x, y in batches]
            if args.fixed:
                # The loss as the weights were before each step (scaled under --mixed).
                print("rank %d loss first %.5f last %.5f"
                      % (rank, np.mean(losses[:2]), np.mean(losses[-2:])), flush=True)
        if rank == 0:
            np.savez(args.out, *saved(model, opt))
        return model, opt


if __name__ == "__main__":
    sys.exit(main())
