"""The MXNet plugin (kvstore "psrt") in real jobs; runs in .venv-mxnet."""

import os

import numpy as np
import pytest

from jobs import EXAMPLES, HERE, ONE_HOST, assert_trained_like, run_job, trained_arrays

# The one-process references run on MXNet's synchronous engine: with the
# threaded one, MXNet 1.9.1 (MKL-DNN) now and then crashes in the ResNet's
# reference. The engine starts at the first operation and keeps its type;
# the workers psrt-run starts get the environment back, so the default.
_engine = os.environ.get("MXNET_ENGINE_TYPE")
os.environ["MXNET_ENGINE_TYPE"] = "NaiveEngine"
mx = pytest.importorskip("mxnet", reason="mxnet is not installed (scripts/setup.sh frameworks makes .venv-mxnet)")
mx.nd.zeros(1).wait_to_read()
if _engine is None:
    del os.environ["MXNET_ENGINE_TYPE"]
else:
    os.environ["MXNET_ENGINE_TYPE"] = _engine
from mxnet import autograd, gluon  # noqa: E402
import mx_worker  # noqa: E402


def reference(kind, steps, workers):
    """One process, the same Gluon optimizer (no kvstore), on the mean of the
    workers' gradients at the same weights."""
    net = mx_worker.build_net(seed=0)
    name, params = mx_worker.OPTIMIZERS[kind]
    trainer = gluon.Trainer(net.collect_params(), name, params, kvstore=None)
    loss_fn = gluon.loss.L2Loss()
    for step in range(steps):
        grads = []
        for rank in range(workers):
            x, y = mx_worker.batch(step, rank)
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            grads.append([p.grad().copy() for p in net.collect_params().values()])
        for i, p in enumerate(net.collect_params().values()):
            p.grad()[:] = sum(g[i] for g in grads) / workers
        trainer.step(16)
    return [p.data().asnumpy() for p in net.collect_params().values()]


# MXNet's Adam, like Keras's, adds epsilon before bias correction.
@pytest.mark.parametrize("kind,atol", [("sgd", 1e-5), ("adam", 1e-4)])
def test_sync_two_workers_equal_one_process_on_the_mean_gradient(kind, atol):
    steps = 10
    got = trained_arrays(os.path.join(HERE, "mx_worker.py"), ["--optimizer", kind, "--steps", str(steps)])
    want = reference(kind, steps, 2)
    initial = [p.data().asnumpy() for p in mx_worker.build_net(seed=0).collect_params().values()]
    assert_trained_like(got, want, initial, atol)


def test_gluon_trains_the_digits_to_the_demo_accuracy():
    code, log = run_job(os.path.join(EXAMPLES, "gluon_digits.py"), ["--epochs", "12", "--threshold", "0.9"])
    assert code == 0, log
    assert "demo: test accuracy 0." in log, log


def test_unsupported_optimizers_and_foreign_states_are_refused_clearly():
    import psrt
    import psrt.mxnet as pmx
    from psrt.mxnet import _optimizers
    with pytest.raises(psrt.PsrtError, match="RMSProp cannot run on the parameter servers"):
        _optimizers._server_optimizer(mx.optimizer.RMSProp())
    # clip_gradient is applied by the plugin; tables refuse it.
    assert _optimizers._server_optimizer(mx.optimizer.SGD(clip_gradient=1.0))["name"] == "sgd"
    with pytest.raises(psrt.PsrtError, match="clip_gradient is not supported for tables"):
        _optimizers._table_optimizer(mx.optimizer.SGD(clip_gradient=1.0))
    assert _optimizers._server_optimizer(mx.optimizer.NAG(momentum=0.9))["nesterov"] is True
    # A row_sparse gradient of a dense weight: refused where MXNet's lazy
    # update would touch only its rows and the servers' update differs.
    with pytest.raises(psrt.PsrtError, match="lazy_update=False"):
        _optimizers._check_rows_of_dense(0, mx.optimizer.SGD(momentum=0.9))
    with pytest.raises(psrt.PsrtError, match="lazy_update=False"):
        _optimizers._check_rows_of_dense(0, mx.optimizer.Adam())
    for fine in (mx.optimizer.SGD(), mx.optimizer.Adam(lazy_update=False), mx.optimizer.NAG(momentum=0.9),
                 mx.optimizer.AdaGrad()):
        _optimizers._check_rows_of_dense(0, fine)


@pytest.fixture(scope="module")
def kv_job():
    """mx_kv_worker.py's checks, in one 2-worker job."""
    return run_job(os.path.join(HERE, "mx_kv_worker.py"), [])


def assert_both_ranks_passed(job, what):
    code, log = job
    assert code == 0, log
    for rank in (0, 1):
        assert "rank %d: %s passed" % (rank, what) in log, log


# optimizer_keys: init (rank 0's value), push then pull, pushpull (into the
# pushed value without out), the type MXNet's dist branches look for.
# plain_store: no set_optimizer, the servers keep the workers' mean; then
# set_optimizer runs on the values the keys hold. compression: fp16 as
# set_gradient_compression, 1-bit refused. two_bit: MXNet's 2-bit
# quantization with its residual. table_init: a row_sparse key starts as rank
# 0's value (rows it lacks as zeros). barrier: kv._barrier() waits for every
# worker. workers_optimizer: set_optimizer with the user's own optimizer and
# RMSProp, which run on every worker on the servers' aggregate.
# One host of two workers summing first: the kvstore's push then pull, and
# Gluon's Trainer with BatchNorm, train as before.
def test_one_host_summing_first_equals_one_process():
    got = trained_arrays(os.path.join(HERE, "mx_worker.py"), ["--optimizer", "sgd", "--steps", "10"], ONE_HOST,
                         hosts=1)
    initial = [p.data().asnumpy() for p in mx_worker.build_net(seed=0).collect_params().values()]
    assert_trained_like(got, reference("sgd", 10, 2), initial, 1e-5)
    job, got = gluon_job(["string", "resnet"], ONE_HOST, hosts=1)
    assert_both_ranks_passed(job, "case string")
    assert "each host summing first" in job[1], job[1]
    for case in ("string", "resnet"):
        assert_trained_like(got[case], gluon_reference(case), initial_arrays(case), 1e-5)


@pytest.mark.parametrize("check", ["optimizer_keys", "plain_store", "compression", "two_bit", "table_init",
                                   "barrier", "workers_optimizer"])
def test_kvstore_api(kv_job, check):
    assert_both_ranks_passed(kv_job, check)


def test_kvstore_api_barrier_is_refused_where_a_step_may_go_without_a_worker():
    code, log = run_job(os.path.join(HERE, "mx_kv_worker.py"), ["barrier"], {"backup_workers": 1})
    assert code == 0, log
    for rank in (0, 1):
        assert ("rank %d: barrier FAILED: PsrtError: psrt kvstore: _barrier() waits for every worker: "
                "FAILED_PRECONDITION: a sum over the job's workers needs every worker's push in each step; "
                "\"backup_workers\": 1" % rank) in log, log


def gluon_job(cases, ps=None, args=(), hosts=2):
    """Runs mx_gluon_worker.py's `cases` in one 2-worker job; returns
    ((exit code, log), {case: [arrays of rank 0]})."""
    import tempfile

    import numpy as np
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "final.npz")
        job = run_job(os.path.join(HERE, "mx_gluon_worker.py"),
                      ["--cases", ",".join(cases), "--out", out] + list(args), ps, hosts)
        got = {}
        if os.path.exists(out):
            saved = np.load(out)
            for case in cases:
                n = sum(1 for f in saved.files if f.startswith(case + "/"))
                got[case] = [saved["%s/%d" % (case, i)] for i in range(n)]
        return job, got


def gluon_reference(case, workers=2, aggregation="mean"):
    """One process with MXNet's own optimizer (no kvstore) on the mean of the
    workers' gradients, each computed from the same weights and running
    statistics; the running statistics become the workers' mean after
    every step."""
    import mx_gluon_worker as gw
    net, name, params, batch, loss_fn = gw.case_setup(case)
    if case == "sparse":
        net = gw.build_embedding_net(0, sparse_grad=False)  # a dense gradient, the same SGD step
    everything = list(net.collect_params().values())
    trained = [p for p in everything if p.grad_req != "null"]
    aux = [p for p in everything if p.grad_req == "null"]
    trainer = gluon.Trainer(trained, name, params, kvstore=None)
    for step in range(gw.STEPS[case]):
        start = [p.data().copy() for p in aux]
        grads, stats = [], []
        for rank in range(workers):
            for p, s in zip(aux, start):
                p.data()[:] = s
            x, y = batch(step, rank)
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            grads.append([p.grad().copy() for p in trained])
            stats.append([p.data().copy() for p in aux])
        for i, p in enumerate(aux):
            p.data()[:] = sum(s[i] for s in stats) / workers
        for i, p in enumerate(trained):
            p.grad()[:] = sum(g[i] for g in grads) / (workers if aggregation == "mean" else 1)
        trainer.step(x.shape[0])
    return [p.data().asnumpy() for p in everything]


def initial_arrays(case):
    import mx_gluon_worker as gw
    return [p.data().asnumpy() for p in gw.case_setup(case)[0].collect_params().values()]


@pytest.fixture(scope="module")
def trainer_job():
    return gluon_job(["string", "object", "devices", "local_update", "clip", "sparse", "mults", "load", "resnet",
                      "module"])


# string/object: kvstore="psrt" as a string and as the object; devices: two
# devices per worker (cpu(0) and cpu(1)), each with half the batch;
# local_update: update_on_kvstore=False (sync); clip: clip_gradient; sparse:
# an Embedding with sparse_grad=True (plain SGD); mults: lr_mult, wd_mult and
# an lr_scheduler; each equals one process on the mean gradient within 1e-5.
@pytest.mark.parametrize("case", ["string", "object", "devices", "local_update", "clip", "sparse", "mults"])
def test_gluon_trainer_equals_one_process_on_the_mean_gradient(trainer_job, case):
    job, got = trainer_job
    assert_both_ranks_passed(job, "case " + case)
    # Two devices' slices make the same gradient as the whole batch on one.
    want = gluon_reference("string" if case == "devices" else case)
    assert_trained_like(got[case], want, initial_arrays(case), 1e-5)
    if case == "clip":
        # clip_gradient clipped something: without it the step differs.
        import mx_gluon_worker as gw
        gw_clip, gw.CLIP = gw.CLIP, (gw.CLIP[0], dict(gw.CLIP[1], clip_gradient=None))
        try:
            want = gluon_reference("clip")
        finally:
            gw.CLIP = gw_clip
        assert max(abs(a - b).max() for a, b in zip(got["clip"], want)) > 1e-2


def test_gluon_parameter_load_after_the_first_step_is_refused(trainer_job):
    assert_both_ranks_passed(trainer_job[0], "case load")


def test_gluon_resnet_with_batchnorm_sync_equals_one_process(trainer_job):
    """model_zoo's resnet18_v1 (BatchNorm): two workers equal one process on
    the mean gradient with the workers' mean running statistics, within
    1e-5, and the running statistics moved."""
    job, got = trainer_job
    assert_both_ranks_passed(job, "case resnet")
    got = got["resnet"]
    initial = initial_arrays("resnet")
    assert_trained_like(got, gluon_reference("resnet"), initial, 1e-5)
    import mx_gluon_worker as gw
    names = list(gw.build_resnet(0).collect_params().keys())
    stats = [i for i, n in enumerate(names) if n.endswith("running_mean") or n.endswith("running_var")]
    assert stats and max(abs(got[i] - initial[i]).max() for i in stats) > 1e-3


def test_gluon_batchnorm_statistics_come_back_from_a_checkpoint():
    """The averaged running statistics live on the servers: a job restored
    from the first's final checkpoint starts from them and from its
    weights before its first step (the store starts as the Trainer is made,
    not in Gluon's first step() after that step's forward and backward): a
    restored job of no steps ends with the first's arrays."""
    import tempfile

    import mx_gluon_worker as gw
    names = list(gw.build_bn_net(0).collect_params().keys())
    stats = [i for i, n in enumerate(names) if n.endswith("running_mean") or n.endswith("running_var")]
    with tempfile.TemporaryDirectory() as d:
        ckpt = {"checkpoint": {"uri": "file://" + d}}
        job, first = gluon_job(["bn"], ckpt)
        assert_both_ranks_passed(job, "case bn")
        job, restored = gluon_job(["bn"], dict(ckpt, restore="latest"), ["--steps", "0"])
        assert_both_ranks_passed(job, "case bn")
    initial = initial_arrays("bn")
    assert stats and max(abs(first["bn"][i] - initial[i]).max() for i in stats) > 1e-3
    for i in range(len(first["bn"])):
        np.testing.assert_array_equal(restored["bn"][i], first["bn"][i], err_msg=names[i])


def test_gluon_local_updates_in_a_job_that_checkpoints_are_refused_saying_why():
    """update_on_kvstore=False leaves the weights and the optimizer's state
    on the workers: a checkpoint would keep the last step's aggregated
    gradients as the weights, and a restore would start from them. The first
    push says so, naming the option, before any update."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        (code, log), _ = gluon_job(["local_update"], {"checkpoint": {"uri": "file://" + d}})
    assert code == 0, log
    for rank in (0, 1):
        line = [text for text in log.splitlines() if text.startswith("rank %d: case local_update" % rank)]
        assert line and "FAILED" in line[0] and "update_on_kvstore=False" in line[0], log
        assert '"checkpoint" and "restore" keep what the servers hold' in line[0], log


@pytest.mark.parametrize("optimizer", ["rmsprop", "sgd"])
def test_gluon_restored_from_a_checkpoint_goes_on_as_if_uninterrupted(optimizer):
    """Under a FactorScheduler, RMSProp on every worker (the servers cannot
    run it: the checkpoints keep rank 0's weights, updater states and update
    counts once) or SGD with momentum on the servers (the worker's update
    counts, which drive the schedule, go on from the restored step), with
    BatchNorm's averaged statistics: a job of 4 steps checkpoints step 3
    and its final step 4; jobs restored from each end where it did, bit
    for bit (the statistics from the final checkpoint)."""
    import tempfile

    import mx_gluon_worker as gw
    names = list(gw.build_bn_net(0).collect_params().keys())
    stats = [i for i, n in enumerate(names) if "running" in n]
    assert stats
    script = os.path.join(HERE, "mx_gluon_worker.py")
    with tempfile.TemporaryDirectory() as d:
        ckpt = {"uri": "file://" + d + "/ckpt", "every_steps": 3}
        code, log = run_job(script, ["--resume", d + "/whole.npz", "--optimizer", optimizer], {"checkpoint": ckpt})
        assert code == 0, log
        whole = np.load(d + "/whole.npz")
        for step in (3, 4):
            out = "%s/from%d.npz" % (d, step)
            code, log = run_job(script, ["--resume", out, "--optimizer", optimizer],
                                {"restore": "file://%s/ckpt/step-%012d" % (d, step)})
            assert code == 0, log
            assert "rank 1: from step %d" % step in log, log
            resumed = np.load(out)
            assert sorted(resumed.files) == sorted(whole.files)
            for name in whole.files:
                if step < 4 and int(name[len("arr_"):]) in stats:
                    # A periodic checkpoint copies assign keys as they are
                    # when it is written (docs/checkpoints.md): training may
                    # have averaged the next step's statistics by then.
                    continue
                np.testing.assert_array_equal(resumed[name], whole[name], err_msg="step %d: %s" % (step, name))


def module_reference(workers=2, epochs=2, batch=16):
    """MXNet's dist_sync with Module: the servers sum the workers'
    gradients, Module rescales by the global batch (batch x workers); SGD
    with momentum (v = m v - lr g, w += v) from zeros."""
    import numpy as np
    import mx_gluon_worker as gw
    data = [gw.module_data(r) for r in range(workers)]
    w, b = np.zeros((1, 8), np.float32), np.zeros(1, np.float32)
    vw, vb = np.zeros_like(w), np.zeros_like(b)
    lr, m = gw.MODULE_SGD["learning_rate"], gw.MODULE_SGD["momentum"]
    for _ in range(epochs):
        for i in range(0, 64, batch):
            gw_sum, gb_sum = np.zeros_like(w), np.zeros_like(b)
            for x, y in data:
                err = x[i:i + batch] @ w.T + b - y[i:i + batch]
                gw_sum += err.T @ x[i:i + batch]
                gb_sum += err.sum(axis=0)
            vw = m * vw - lr * gw_sum / (batch * workers)
            vb = m * vb - lr * gb_sum / (batch * workers)
            w, b = w + vw, b + vb
    return [w, b]


def test_module_fit_with_averaging_servers_ends_where_dist_sync_does(trainer_job):
    """Module divides by the global batch, as for servers that sum; with the
    default mean the plugin scales it back, so the steps are not
    num_workers times smaller."""
    job, got = trainer_job
    assert_both_ranks_passed(job, "case module")
    want = module_reference()
    assert_trained_like(got["module"], want, [0 * a for a in want], 1e-5)


def test_gluon_with_summed_gradients_equals_one_process_on_their_sum():
    """gradient_aggregation "sum" (MXNet's servers sum): clip_gradient clips
    the sum, BatchNorm's statistics are still the workers' mean, and
    Module.fit(kvstore="psrt") ends where MXNet's dist_sync does."""
    job, got = gluon_job(["clip", "resnet", "module"], {"gradient_aggregation": "sum"})
    for case in ("clip", "resnet"):
        assert_both_ranks_passed(job, "case " + case)
        assert_trained_like(got[case], gluon_reference(case, aggregation="sum"), initial_arrays(case), 1e-5)
    assert_both_ranks_passed(job, "case module")
    want = module_reference()
    assert_trained_like(got["module"], want, [0 * a for a in want], 1e-5)


@pytest.mark.parametrize("mode", ["async", "ssp"])
def test_gluon_async_and_ssp_learn_and_refuse_local_updates(mode):
    """update_on_kvstore=False refused as on dist_async; the loss on fixed
    data falls below half within 120 steps."""
    ps = {"mode": mode, "staleness": 1} if mode == "ssp" else {"mode": mode}
    assert_both_ranks_passed(run_job(os.path.join(HERE, "mx_gluon_worker.py"), ["--cases", "async"], ps),
                             "case async")
