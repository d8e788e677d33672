"""Gluon's Trainer on kvstore "psrt" as on MXNet's dist kvstores, for
tests/python/test_mxnet_plugin.py; started by psrt-run with 2 workers.

Runs the cases named by --cases one after another in one job, each with a
Trainer (and store) of its own; rank r's batch at step s comes from seed
(s, r). Rank 0 saves each case's final arrays (numpy .npz, "CASE/i" in
collect_params() order) to --out. The models and batches are defined here
and used by the test's one-process references too.
"""

import argparse
import os
import sys
import tempfile

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import psrt
import psrt.mxnet

import mx_worker

STEPS = {"string": 3, "object": 3, "devices": 3, "local_update": 3, "clip": 3, "sparse": 3, "mults": 4, "resnet": 2,
         "bn": 3}
SGD = ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3})
RESNET_SGD = ("sgd", {"learning_rate": 0.02, "momentum": 0.9})
CLIP = ("sgd", {"learning_rate": 0.5, "clip_gradient": 0.02})
VOCAB, DIM, BAG = 20, 4, 3


def build_embedding_net(seed, sparse_grad):
    mx.random.seed(seed)
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Embedding(VOCAB, DIM, sparse_grad=sparse_grad), gluon.nn.Flatten(),
            gluon.nn.Dense(1, in_units=DIM * BAG))
    net.initialize(mx.init.Normal(0.5))
    return net


def embedding_batch(step, rank, n=8):
    rng = np.random.default_rng(step * 1000 + rank + 77)
    ids = rng.integers(0, VOCAB, (n, BAG))
    return mx.nd.array(ids), mx.nd.array((ids % 2).mean(axis=1, keepdims=True))


def build_resnet(seed):
    mx.random.seed(seed)
    net = gluon.model_zoo.vision.resnet18_v1(classes=10)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 3, 32, 32)))  # shapes (deferred init), outside training: no statistics move
    return net


def build_bn_net(seed):
    """A small net with BatchNorm (running statistics), for the restore test."""
    mx.random.seed(seed)
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(16, in_units=8), gluon.nn.BatchNorm(in_channels=16), gluon.nn.Activation("tanh"),
            gluon.nn.Dense(1, in_units=16))
    net.initialize(mx.init.Xavier())
    return net


def resnet_batch(step, rank, n=4):
    rng = np.random.default_rng(step * 1000 + rank + 5)
    x = rng.standard_normal((n, 3, 32, 32)).astype(np.float32)
    return mx.nd.array(x), mx.nd.array(rng.integers(0, 10, n).astype(np.float32))


def case_setup(case):
    """(net, optimizer name, params, batch function, loss) of a case."""
    if case == "sparse":
        return (build_embedding_net(0, sparse_grad=True), "sgd", {"learning_rate": 0.5}, embedding_batch,
                gluon.loss.L2Loss())
    if case == "bn":
        return build_bn_net(0), SGD[0], SGD[1], mx_worker.batch, gluon.loss.L2Loss()
    if case == "resnet":
        return (build_resnet(0), RESNET_SGD[0], RESNET_SGD[1], resnet_batch,
                gluon.loss.SoftmaxCrossEntropyLoss())
    net = mx_worker.build_net(seed=0)
    name, params = CLIP if case == "clip" else SGD
    if case == "mults":
        # A parameter's lr_mult and wd_mult, and a schedule over the updates
        # (with SGD's momentum, which MXNet applies to each step's rate).
        net[0].weight.lr_mult = 0.5
        for p in net.collect_params(".*bias").values():
            p.wd_mult = 0.0
        params = dict(params, wd=0.05, lr_scheduler=mx.lr_scheduler.FactorScheduler(step=1, factor=0.7))
    return net, name, params, mx_worker.batch, gluon.loss.L2Loss()


def train(case, kv, rank, out, steps=None):
    net, name, params, batch, loss_fn = case_setup(case)
    kvstore = kv if case == "object" else "psrt"
    devices = [mx.cpu(0), mx.cpu(1)] if case == "devices" else [mx.cpu()]
    if len(devices) > 1:
        net.collect_params().reset_ctx(devices)
    trainer = gluon.Trainer(net.collect_params(), name, params, kvstore=kvstore,
                            update_on_kvstore=(case != "local_update"))
    for step in range(STEPS[case] if steps is None else steps):
        x, y = batch(step, rank)
        # Each device takes a slice of the worker's batch.
        xs, ys = gluon.utils.split_and_load(x, devices), gluon.utils.split_and_load(y, devices)
        with autograd.record():
            losses = [loss_fn(net(a), b) for a, b in zip(xs, ys)]
        autograd.backward(losses)
        trainer.step(x.shape[0])
        if step == 0:
            # The Trainer took the psrt store as MXNet's own dist store.
            assert isinstance(trainer._kvstore, psrt.mxnet.Psrt), trainer._kvstore
            assert trainer._distributed and trainer._update_on_kvstore == (case != "local_update")
    for i, p in enumerate(net.collect_params().values()):
        out["%s/%d" % (case, i)] = p.data().asnumpy()
    return net


def module_data(rank):
    """Rank r's linear-regression data for the Module case: 4 batches of 16."""
    rng = np.random.default_rng(rank + 31)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    return x, (x @ np.arange(1, 9, dtype=np.float32)[:, None] * 0.1 + 0.3).astype(np.float32)


MODULE_SGD = {"learning_rate": 0.05, "momentum": 0.9}


def module_fit(rank, out):
    """The Module API: Module.fit(kvstore="psrt") for 2 epochs."""
    x, y = module_data(rank)
    it = mx.io.NDArrayIter(x, y, batch_size=16, label_name="lin_label")
    sym = mx.sym.LinearRegressionOutput(mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=1, name="fc"),
                                        name="lin")
    mod = mx.mod.Module(sym, label_names=["lin_label"])
    mod.fit(it, num_epoch=2, kvstore="psrt", optimizer="sgd", optimizer_params=dict(MODULE_SGD),
            initializer=mx.init.Zero())
    assert isinstance(mod._kvstore, psrt.mxnet.Psrt) and mod._update_on_kvstore, mod._kvstore
    arg, _ = mod.get_params()
    out["module/0"], out["module/1"] = arg["fc_weight"].asnumpy(), arg["fc_bias"].asnumpy()


def load_is_refused(rank):
    """Trainer.save_states and load_states work; Parameter.load after the
    first step is refused as for MXNet's dist stores (the servers' copy
    would be out of step)."""
    net = mx_worker.build_net(seed=0)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore="psrt")
    x, y = mx_worker.batch(0, rank)
    with autograd.record():
        loss = gluon.loss.L2Loss()(net(x), y)
    loss.backward()
    trainer.step(x.shape[0])
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "net.params")
        # The trainer's states say where they are (the servers) and come back.
        trainer.save_states(path + ".states")
        trainer.load_states(path + ".states")
        net.save_parameters(path)
        try:
            net.load_parameters(path)
        except RuntimeError as e:
            assert "Cannot reset distributed KVStore" in str(e), e
            return
    raise AssertionError("load_parameters after a step was taken")


def async_cases(rank):
    """Async (and ssp): update_on_kvstore=False is refused as on dist_async,
    and the model learns: the loss on fixed data falls below half."""
    net = mx_worker.build_net(seed=0)
    x, y = mx_worker.batch(0, rank)
    with autograd.record():
        loss = gluon.loss.L2Loss()(net(x), y)
    loss.backward()
    try:
        # The store starts as the Trainer is made (its parameters are
        # initialised): the refusal comes there.
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore="psrt",
                                update_on_kvstore=False)
        trainer.step(x.shape[0])
        raise AssertionError("update_on_kvstore=False in async mode was taken")
    except ValueError as e:
        assert "update_on_kvstore=True" in str(e), e
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01}, kvstore="psrt")
    loss_fn = gluon.loss.L2Loss()
    fixed = [mx_worker.batch(100 + i, rank) for i in range(4)]
    losses = []
    for step in range(120):
        x, y = fixed[step % 4]
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(x.shape[0])
        losses.append(float(loss.mean().asscalar()))
    first, last = np.mean(losses[:4]), np.mean(losses[-4:])
    print("rank %d: async loss %.4f -> %.4f" % (rank, first, last), flush=True)
    assert trainer._kvstore.type == "dist_async_psrt", trainer._kvstore.type
    assert last < 0.5 * first, (first, last)


RESUME_STEPS = 4


RESUME_OPTIMIZERS = {
    # The servers cannot run it: every worker's updater does.
    "rmsprop": {"learning_rate": 0.01, "centered": True},
    # On the servers, its rate kept and the schedule carried by the gradient.
    "sgd": {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3},
}


def resume(rank, out, optimizer):
    """`optimizer` (RESUME_OPTIMIZERS) under a FactorScheduler on the
    BatchNorm net, from the job's restored step (0 when fresh) to
    RESUME_STEPS; rank 0 writes the net's arrays (the running statistics
    among them) to `out` (.npz, collect_params() order)."""
    net = build_bn_net(0)
    schedule = mx.lr_scheduler.FactorScheduler(step=1, factor=0.8)
    trainer = gluon.Trainer(net.collect_params(), optimizer,
                            dict(RESUME_OPTIMIZERS[optimizer], lr_scheduler=schedule), kvstore="psrt")
    start = psrt.restored_step()
    print("rank %d: from step %d" % (rank, start), flush=True)
    for step in range(start, RESUME_STEPS):
        x, y = mx_worker.batch(step, rank)
        with autograd.record():
            loss = gluon.loss.L2Loss()(net(x), y)
        loss.backward()
        trainer.step(x.shape[0])
    if rank == 0:
        np.savez(out, *[p.data().asnumpy() for p in net.collect_params().values()])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cases")
    p.add_argument("--resume", help="resume(); rank 0 writes the arrays there")
    p.add_argument("--optimizer", default="rmsprop", help="resume()'s")
    p.add_argument("--out")
    p.add_argument("--steps", type=int, help="steps of every training case (default: STEPS)")
    args = p.parse_args()
    kv = mx.kv.create("psrt")
    rank = kv.rank
    if args.resume:
        resume(rank, args.resume, args.optimizer)
        return 0
    out = {}
    for case in args.cases.split(","):
        # Each case reports on its own, so that a test names what failed.
        try:
            if case == "load":
                load_is_refused(rank)
            elif case == "async":
                async_cases(rank)
            elif case == "module":
                module_fit(rank, out)
            else:
                train(case, kv, rank, out, args.steps)
            print("rank %d: case %s passed" % (rank, case), flush=True)
        except Exception as e:  # noqa: BLE001
            print("rank %d: case %s FAILED: %s: %s" % (rank, case, type(e).__name__, e), flush=True)
    if rank == 0 and args.out:
        np.savez(args.out, **out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
