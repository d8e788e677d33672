"""psrt.keras.layers.Embedding in real jobs: two workers in sync mode, trained
by model.fit, against one process with keras.layers.Embedding and a sparse
(row-wise) update of the mean gradient: Keras's own SGD and Adagrad on the
dense gradient (a row with no gradient stays as it is under both), a LazyAdam
written with tf ops (none ships with Keras 3) and TensorFlow's
SparseApplyFtrl."""

import os
import tempfile

import numpy as np
import pytest

from jobs import HERE, ONE_HOST, run_job, run_table_job

tf = pytest.importorskip("tensorflow", reason="tensorflow is not installed (scripts/setup.sh frameworks)")
keras = pytest.importorskip("keras")
import tf_embedding_worker as w  # noqa: E402


class LazyAdam:
    """TF Addons' LazyAdam: only the rows in the gradient, and their moments,
    move; the bias correction counts the optimizer's steps."""

    def __init__(self, var, lr, beta_1, beta_2, epsilon):
        self.var, self.lr, self.b1, self.b2, self.eps = var, lr, beta_1, beta_2, epsilon
        self.m, self.v = tf.zeros_like(var), tf.zeros_like(var)
        self.t = 0

    def apply(self, ids, g):
        self.t += 1
        ids = ids[:, None]
        m = tf.gather_nd(self.m, ids)
        v = tf.gather_nd(self.v, ids)
        m = m + (g - m) * (1 - self.b1)
        v = v + (g * g - v) * (1 - self.b2)
        step_size = self.lr * np.sqrt(1 - self.b2 ** self.t) / (1 - self.b1 ** self.t)
        rows = tf.gather_nd(self.var, ids) - step_size * (m / (tf.sqrt(v) + self.eps))
        self.m = tf.tensor_scatter_nd_update(self.m, ids, m)
        self.v = tf.tensor_scatter_nd_update(self.v, ids, v)
        self.var = tf.tensor_scatter_nd_update(self.var, ids, rows)


class SparseFtrl:
    """tf.raw_ops.ResourceSparseApplyFtrl with Keras's beta folded into l2."""

    def __init__(self, var, lr, initial_accumulator_value=0.1, l1_regularization_strength=0.0,
                 l2_regularization_strength=0.0, beta=0.0):
        self.var = tf.Variable(var)
        self.accum = tf.Variable(tf.fill(var.shape, initial_accumulator_value))
        self.linear = tf.Variable(tf.zeros_like(var))
        self.lr, self.l1 = lr, l1_regularization_strength
        self.l2 = np.float32(l2_regularization_strength) + np.float32(beta) / (2 * np.float32(lr))

    def apply(self, ids, g):
        tf.raw_ops.ResourceSparseApplyFtrl(var=self.var.handle, accum=self.accum.handle,
                                           linear=self.linear.handle, grad=g, indices=ids, lr=self.lr,
                                           l1=self.l1, l2=self.l2, lr_power=-0.5)


def reference(kind, saved, steps):
    """One process: the same model on the global batch (whose mean loss is
    the mean of the workers' halves'), the table updated row-wise."""
    table = keras.layers.Embedding(w.VOCAB, w.DIM, embeddings_initializer=keras.initializers.Constant(
        saved["initial"]))
    model = w.build_model(table)
    model.get_layer("head").set_weights([saved["head_initial_kernel"], saved["head_initial_bias"]])
    args = w.table_args(kind)
    name, lr = args.pop("optimizer"), args.pop("lr")
    head_vars = model.get_layer("head").trainable_variables
    head_opt = w.head_optimizer()
    if name in ("sgd", "adagrad"):
        table_opt = {"sgd": keras.optimizers.SGD, "adagrad": keras.optimizers.Adagrad}[name](lr, **args)
    else:
        table_opt = {"adam": LazyAdam, "ftrl": SparseFtrl}[name](table.embeddings.numpy(), lr, **args)
    for step in range(steps):
        ids, y = w.batch(step)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(ids) - y))
        grads = tape.gradient(loss, [table.embeddings] + head_vars)
        head_opt.apply(grads[1:], head_vars)
        assert isinstance(grads[0], tf.IndexedSlices)  # sparse: the batch's rows only
        if name in ("sgd", "adagrad"):
            # Dense: Keras 3 applies IndexedSlices slice by slice, so a
            # repeated id would add the squares of its pieces to Adagrad's
            # accumulator instead of the square of its gradient.
            table_opt.apply([tf.convert_to_tensor(grads[0])], [table.embeddings])
        else:
            distinct, index = tf.unique(grads[0].indices)
            table_opt.apply(tf.cast(distinct, tf.int64),
                            tf.math.unsorted_segment_sum(grads[0].values, index, tf.shape(distinct)[0]))
            table.embeddings.assign(tf.convert_to_tensor(table_opt.var))
    return table.embeddings.numpy(), [v.numpy() for v in head_vars]


@pytest.mark.parametrize("kind,hosts", [("adam", 2), ("adagrad", 2), ("sgd", 2), ("ftrl", 2), ("adam", 1)])
def test_sync_two_workers_with_model_fit_equal_one_process_with_a_sparse_update(kind, hosts):
    """hosts 1: both workers on one host, which shares their rows' pulls and
    sums their pushes (docs/runtime.md, "Local aggregation")."""
    steps = 12
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.npz")
        code, log = run_job(os.path.join(HERE, "tf_embedding_worker.py"),
                            ["--optimizer", kind, "--steps", str(steps), "--out", out],
                            ONE_HOST if hosts == 1 else None, hosts)
        assert code == 0, log
        assert ("each host summing first" in log) == (hosts == 1), log
        saved = dict(np.load(out))
    rows, head = reference(kind, saved, steps)
    diff = np.abs(saved["final"] - rows).max()
    print("%s: max |psrt - reference| over the rows = %.3g" % (kind, diff))
    np.testing.assert_allclose(saved["final"], rows, rtol=0, atol=1e-5)
    np.testing.assert_allclose(saved["head_kernel"], head[0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(saved["head_bias"], head[1], rtol=0, atol=1e-5)
    # The rows trained: some moved well away from where they started.
    assert np.abs(saved["final"] - saved["initial"]).max() > 1e-2
    # New rows start as N(0, 0.05^2), drawn from (seed, id).
    assert 0.035 < saved["initial"].std() < 0.065


@pytest.mark.parametrize("hosts", [2, 1])
def test_a_table_with_an_initializer_starts_from_rank_0s_rows_and_trains_as_one_process(hosts):
    """embeddings_initializer differs per rank (its seed): every rank's
    first rows are rank 0's initializer's, and model.fit from them equals one
    process from them."""
    steps = 8
    saved, starts = run_table_job(os.path.join(HERE, "tf_embedding_worker.py"),
                                  ["--optimizer", "sgd", "--steps", str(steps), "--initializer"], hosts)
    matrix = keras.ops.convert_to_numpy(w.initializer(0)((w.VOCAB, w.DIM), "float32"))
    assert not np.array_equal(matrix, keras.ops.convert_to_numpy(w.initializer(1)((w.VOCAB, w.DIM), "float32")))
    for start in starts:
        np.testing.assert_array_equal(start, matrix)
    rows, head = reference("sgd", saved, steps)
    np.testing.assert_allclose(saved["final"], rows, rtol=0, atol=1e-5)
    np.testing.assert_allclose(saved["head_kernel"], head[0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(saved["head_bias"], head[1], rtol=0, atol=1e-5)
    assert np.abs(saved["final"] - matrix).max() > 1e-2


def test_an_initializer_needs_a_vocabulary_and_replaces_init_std():
    import psrt
    from psrt.tensorflow import layers
    with pytest.raises(psrt.PsrtError, match=r"fixed vocabulary \(input_dim > 0; got 0\)"):
        layers.Embedding(0, 4, embeddings_initializer="uniform")
    with pytest.raises(psrt.PsrtError, match=r"replaces init_std \(got 0.1\)"):
        layers.Embedding(10, 4, embeddings_initializer="uniform", init_std=0.1)


def test_table_optimizers_take_keras_names_and_refuse_others():
    from psrt.tensorflow import layers
    import psrt
    cfg = layers._optimizer_config("adagrad", 0.1, {"epsilon": 1e-6})
    assert cfg["initial_accumulator_value"] == pytest.approx(0.1 + 1e-6) and cfg["eps"] == 0.0
    assert layers._optimizer_config("adam", 0.1, {"beta_1": 0.5})["beta1"] == 0.5
    with pytest.raises(psrt.PsrtError, match="not row-wise"):
        layers._optimizer_config("rmsprop", 0.1, {})
    with pytest.raises(psrt.PsrtError, match=r"sgd takes no \['momentum'\]"):
        layers._optimizer_config("sgd", 0.1, {"momentum": 0.9})


def test_float_ids_pass_only_as_exact_whole_numbers():
    """Keras's Embedding casts float ids (truncating 2.5 to 2); the layer
    takes a float id only as a whole number its dtype holds exactly, and
    otherwise fails the step naming the table and the dtype."""
    from psrt.tensorflow import layers
    import psrt
    graph = tf.function(lambda x: layers.int64_ids("user", x))
    for ids in (tf.constant([[3.0, 1.0]]), tf.constant([3, 1], tf.int32)):
        for run in (lambda x: layers.int64_ids("user", x), graph):
            got = run(ids)
            assert got.dtype == tf.int64 and got.numpy().reshape(-1).tolist() == [3, 1]
    for bad in ([2.5], [float("nan")], [2.0 ** 25]):
        for run in (lambda x: layers.int64_ids("user", x), graph):
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=r"table user: ids of dtype float32 must be whole numbers"):
                run(tf.constant(bad, tf.float32))
    with pytest.raises(psrt.PsrtError, match="table 'user': ids of dtype string; ids are integers"):
        layers.int64_ids("user", tf.constant(["3"]))
