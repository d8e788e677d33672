#!/usr/bin/env python3
"""Samples/s of the demo model through psrt's TensorFlow and MXNet plugins
against each framework's own distributed training, in the same run.

The demo's network (64-128-128-10) on random inputs shaped like the digits,
2 workers, batch 32 per worker, SGD with momentum:

  tensorflow  psrt.keras.DistributedOptimizer under psrt-run --local=2 (2
              servers) against tf.distribute.MultiWorkerMirroredStrategy
              (2 workers from TF_CONFIG on loopback), both with model.fit
  mxnet       gluon.Trainer(kvstore="psrt") under psrt-run against MXNet's
              own kvstore "dist_sync" (ps-lite from the wheel: a scheduler,
              2 servers, 2 workers on loopback)

Run with .venv's python; the MXNet part runs its workers with .venv-mxnet's
(skipped without it). Writes OUT/frameworks.json and prints the ratios.
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def data(rank, n=2048):
    import numpy as np
    rng = np.random.default_rng(rank)
    return rng.random((n, 64), dtype=np.float32), rng.integers(0, 10, n)


# ---- workers -------------------------------------------------------------------

def tf_worker(args, strategy_kind):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf
    if strategy_kind == "psrt":
        import psrt.tensorflow as psrt
        psrt.init()
        rank, scope = psrt.rank(), None
        optimizer = psrt.keras.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9))
        batch = args.batch
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        rank, scope = strategy.cluster_resolver.task_id, strategy.scope()
        optimizer = None
        batch = args.batch * 2  # global batch, split over the 2 workers
    x, y = data(rank)

    def build():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                                  keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
        model.compile(optimizer=optimizer or keras.optimizers.SGD(0.01, momentum=0.9), jit_compile=False,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    if scope is not None:
        with scope:
            model = build()
    else:
        model = build()
    # Each worker reads its own data: with the strategy, the dataset's batch
    # is the global one and each worker takes its half.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat().with_options(options)
    steps = len(x) // args.batch
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)  # warm-up: tracing, registration
    start = time.monotonic()
    model.fit(dataset, steps_per_epoch=steps, epochs=args.epochs, verbose=0)
    seconds = time.monotonic() - start
    if rank == 0:
        print("RESULT %f" % (args.epochs * steps * args.batch * 2 / seconds), flush=True)


def mx_worker(args, kvstore):
    import mxnet as mx
    from mxnet import autograd, gluon
    if kvstore == "psrt":
        import psrt.mxnet  # noqa: F401
    kv = mx.kv.create(kvstore)
    x, y = data(kv.rank)
    mx.random.seed(0)
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(128, activation="relu", in_units=64), gluon.nn.Dense(128, activation="relu", in_units=128),
            gluon.nn.Dense(10, in_units=128))
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9}, kvstore=kv,
                            update_on_kvstore=True)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    steps = len(x) // args.batch
    start = None
    for epoch in range(args.epochs + 1):
        if epoch == 1:
            start = time.monotonic()
        for i in range(steps):
            xb = mx.nd.array(x[i * args.batch:(i + 1) * args.batch])
            yb = mx.nd.array(y[i * args.batch:(i + 1) * args.batch])
            with autograd.record():
                loss = loss_fn(net(xb), yb)
            loss.backward()
            trainer.step(args.batch)
        mx.nd.waitall()
    seconds = time.monotonic() - start
    if kv.rank == 0:
        print("RESULT %f" % (args.epochs * steps * args.batch * 2 / seconds), flush=True)


# ---- driver ---------------------------------------------------------------------

class Failed(Exception):
    pass


def result(out, what):
    m = re.search(r"RESULT ([0-9.]+)", out)
    if not m:
        errors = [l for l in out.splitlines() if "Error" in l]
        raise Failed("%s failed: %s" % (what, errors[-1] if errors else out[-300:]))
    return float(m.group(1))


def run_psrt(build, python, role, args):
    dist = {"parameter_server": {"enabled": True}}
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"))
    p = subprocess.run([os.path.join(build, "bin", "psrt-run"), "--local=2", "--distribution=" + json.dumps(dist),
                        "--", python, os.path.abspath(__file__), "--role", role] + args,
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    return result(p.stdout, role + " through psrt")


def run_group(procs, what):
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=900)
        outs.append(out)
    return result("".join(outs), what)


def run_mwms(python, args):
    ports = [free_port(), free_port()]
    procs = []
    for i in range(2):
        tf_config = {"cluster": {"worker": ["127.0.0.1:%d" % p for p in ports]}, "task": {"type": "worker", "index": i}}
        env = dict(os.environ, TF_CONFIG=json.dumps(tf_config))
        procs.append(subprocess.Popen([python, os.path.abspath(__file__), "--role", "tf-mwms"] + args, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return run_group(procs, "MultiWorkerMirroredStrategy")


class DistSync:
    """MXNet's own parameter server on loopback (ps-lite from the wheel): a
    scheduler and 2 servers for `workers` workers, stopped on exit. Workers
    run with `worker_env`."""

    def __init__(self, python, workers):
        self.worker_env = dict(os.environ, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(free_port()),
                               DMLC_NUM_SERVER="2", DMLC_NUM_WORKER=str(workers), DMLC_ROLE="worker")
        self._daemons = [subprocess.Popen([python, "-c", "import mxnet"], env=dict(self.worker_env, DMLC_ROLE=role),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                         for role in ("scheduler", "server", "server")]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for d in self._daemons:
            try:
                d.wait(timeout=30)
            except subprocess.TimeoutExpired:
                d.kill()


def run_dist_sync(python, args):
    with DistSync(python, 2) as ps:
        workers = [subprocess.Popen([python, os.path.abspath(__file__), "--role", "mx-dist"] + args,
                                    env=ps.worker_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True) for _ in range(2)]
        return run_group(workers, "dist_sync")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--out", default=None)
    p.add_argument("--role", default="driver")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    common = ["--batch", str(args.batch), "--epochs", str(args.epochs)]
    if args.role == "tf-psrt":
        return tf_worker(args, "psrt")
    if args.role == "tf-mwms":
        return tf_worker(args, "mwms")
    if args.role in ("mx-psrt", "mx-dist"):
        return mx_worker(args, "psrt" if args.role == "mx-psrt" else "dist_sync")

    build = os.path.abspath(args.build)
    out = args.out or os.path.join(build, "bench")
    os.makedirs(out, exist_ok=True)
    results = {}
    def measure(name, own, run_own, psrt_python, psrt_role):
        r = {"psrt": run_psrt(build, psrt_python, psrt_role, common)}
        try:
            r[own] = run_own()
            r["psrt_vs_own"] = r["psrt"] / r[own]
        except Failed as e:  # the framework's own way did not run here
            r[own + "_error"] = str(e)
        results[name] = r

    measure("tensorflow", "mwms", lambda: run_mwms(sys.executable, common), sys.executable, "tf-psrt")
    mx_python = os.path.join(ROOT, ".venv-mxnet", "bin", "python")
    if os.access(mx_python, os.X_OK):
        measure("mxnet", "dist_sync", lambda: run_dist_sync(mx_python, common), mx_python, "mx-psrt")
    else:
        results["mxnet"] = {"skipped": "no " + mx_python + " (scripts/setup.sh frameworks)"}
    print("%-11s %16s %14s %10s" % ("framework", "own samples/s", "psrt samples/s", "psrt/own"))
    for name, own in (("tensorflow", "mwms"), ("mxnet", "dist_sync")):
        r = results[name]
        if "psrt_vs_own" in r:
            print("%-11s %16.0f %14.0f %9.2fx" % (name, r[own], r["psrt"], r["psrt_vs_own"]))
        elif "psrt" in r:
            print("%-11s %16s %14.0f %10s  (%s)" % (name, "-", r["psrt"], "-", r[own + "_error"][:200]))
        else:
            print("%-11s %s" % (name, r["skipped"]))
    with open(os.path.join(out, "frameworks.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("frameworks_bench: wrote", os.path.join(out, "frameworks.json"))


if __name__ == "__main__":
    main()
