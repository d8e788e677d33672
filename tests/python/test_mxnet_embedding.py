"""Tables through the MXNet plugin (kvstore "psrt": row_sparse_pull and
row_sparse pushes) in real jobs: two workers in sync mode, Gluon's
SparseEmbedding with Trainer(kvstore="psrt"), against one process with
gluon.nn.Embedding(sparse_grad=True) and MXNet's own sparse updates (Adam with
lazy_update, AdaGrad, SGD; Ftrl on a row_sparse copy of the table) on the
mean gradient. Runs in .venv-mxnet."""

import os
import tempfile

import numpy as np
import pytest

from jobs import HERE, ONE_HOST, run_job, run_table_job

mx = pytest.importorskip("mxnet", reason="mxnet is not installed (scripts/setup.sh frameworks makes .venv-mxnet)")
from mxnet import autograd, gluon  # noqa: E402
import mx_embedding_worker as w  # noqa: E402


def reference(kind, initial, steps):
    """One process: the same model on the global batch (batch size 16, so
    the mean of the workers' halves), the table updated by MXNet."""
    table = gluon.nn.Embedding(w.VOCAB, w.DIM, sparse_grad=True)
    net = w.build_net(table)
    table.weight.set_data(mx.nd.array(initial))
    name, params = w.OPTIMIZERS[kind]
    if kind == "ftrl":
        # MXNet's Ftrl is lazy only on a row_sparse weight (on a dense one it
        # falls back to the dense update, which rewrites every row): update a
        # row_sparse copy of the table (the head stays fixed).
        opt = mx.optimizer.create(name, rescale_grad=1.0 / w.BATCH, **params)
        weight = mx.nd.array(initial).tostype("row_sparse")
        state = opt.create_state(0, weight)
    else:
        trainer = gluon.Trainer(w.trained_params(net, kind), name, dict(params), kvstore=None)
    loss_fn = gluon.loss.L2Loss()
    for step in range(steps):
        ids, y = w.batch(step)
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(ids)), mx.nd.array(y))
        loss.backward()
        assert table.weight.grad().stype == "row_sparse"
        if kind == "ftrl":
            opt.update(0, weight, table.weight.grad(), state)
            table.weight.set_data(weight.tostype("default"))
        else:
            trainer.step(w.BATCH)
    return table.weight.data().asnumpy(), net.head.weight.data().asnumpy(), net.head.bias.data().asnumpy()


@pytest.mark.parametrize("kind,hosts", [("adam", 2), ("adagrad", 2), ("sgd", 2), ("ftrl", 2), ("sgd", 1)])
def test_sync_two_workers_with_gluon_equal_one_process_with_mxnet_sparse_updates(kind, hosts):
    """hosts 1: both workers on one host, which shares their rows' pulls and
    sums their pushes (docs/runtime.md, "Local aggregation")."""
    steps = 12
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.npz")
        code, log = run_job(os.path.join(HERE, "mx_embedding_worker.py"),
                            ["--optimizer", kind, "--steps", str(steps), "--out", out],
                            ONE_HOST if hosts == 1 else None, hosts)
        assert code == 0, log
        assert ("each host summing first" in log) == (hosts == 1), log
        saved = dict(np.load(out))
    rows, kernel, bias = reference(kind, saved["initial"], steps)
    print("%s: max |psrt - reference| over the rows = %.3g" % (kind, np.abs(saved["final"] - rows).max()))
    np.testing.assert_allclose(saved["final"], rows, rtol=0, atol=1e-5)
    np.testing.assert_allclose(saved["head_kernel"], kernel, rtol=0, atol=1e-5)
    np.testing.assert_allclose(saved["head_bias"], bias, rtol=0, atol=1e-5)
    # The rows trained: some moved well away from where they started.
    assert np.abs(saved["final"] - saved["initial"]).max() > 1e-2
    # New rows start as N(0, 0.5^2) (table_options), drawn from (seed, id).
    assert 0.35 < saved["initial"].std() < 0.65


@pytest.mark.parametrize("hosts", [2, 1])
def test_a_table_initialised_with_rows_starts_from_rank_0s_and_trains_as_one_process(hosts):
    """SparseEmbedding's weight set to a matrix on rank 0 (rank 1's is
    random): every rank's first rows are rank 0's, and training from them
    equals one process from the matrix."""
    steps = 8
    saved, starts = run_table_job(os.path.join(HERE, "mx_embedding_worker.py"),
                                  ["--optimizer", "sgd", "--steps", str(steps), "--pretrained"], hosts)
    matrix = w.pretrained()
    for start in starts:
        np.testing.assert_array_equal(start, matrix)
    rows, kernel, bias = reference("sgd", matrix, steps)
    np.testing.assert_allclose(saved["final"], rows, rtol=0, atol=1e-5)
    np.testing.assert_allclose(saved["head_kernel"], kernel, rtol=0, atol=1e-5)
    np.testing.assert_allclose(saved["head_bias"], bias, rtol=0, atol=1e-5)
    assert np.abs(saved["final"] - matrix).max() > 1e-2


def test_kvstore_api_row_sparse_pull_push_pushpull():
    code, log = run_job(os.path.join(HERE, "mx_embedding_worker.py"), ["--api"])
    assert code == 0, log
    assert log.count("table checks passed") == 2, log


def test_table_optimizers_are_row_wise_or_refused():
    import psrt
    import psrt.mxnet as pmx
    from psrt.mxnet import _optimizers
    assert _optimizers._table_optimizer(mx.optimizer.Adam(lazy_update=True))["name"] == "adam"
    cfg = _optimizers._table_optimizer(mx.optimizer.AdaGrad(eps=1e-6))
    assert cfg["initial_accumulator_value"] == 1e-6 and cfg["eps"] == 0.0
    assert _optimizers._table_optimizer(mx.optimizer.Ftrl(wd=0.5))["l2"] == 0.25
    with pytest.raises(psrt.PsrtError, match=r"Adam\(lazy_update=False\) is not row-wise"):
        _optimizers._table_optimizer(mx.optimizer.Adam(lazy_update=False))
    with pytest.raises(psrt.PsrtError, match="weight decay"):
        _optimizers._table_optimizer(mx.optimizer.SGD(wd=1e-4))
    with pytest.raises(psrt.PsrtError, match="table_options takes no"):
        pmx.table_options(vocab=10)
