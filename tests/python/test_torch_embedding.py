"""psrt.torch.Embedding and EmbeddingBag in real jobs: two workers in sync
mode against one process with nn.Embedding(sparse=True) / nn.EmbeddingBag and
torch's own sparse optimizers on the mean gradient."""

import json
import os
import re
import subprocess
import tempfile

import pytest
import torch

import psrt

from jobs import BIN, EXAMPLES, HERE, ONE_HOST, run_job
import torch_embedding_worker as w

WORKER = os.path.join(HERE, "torch_embedding_worker.py")


def reference(kind, bag, initial, steps, sit_out=(), sit_out_grad="none"):
    """One process on the global batch. In the `sit_out` steps the table
    takes no part in the loss: with sit_out_grad "none" it gets no gradient
    (None, and SparseAdam leaves it alone), with "empty" it is looked up
    with no ids (an empty sparse gradient, which SparseAdam counts as a
    step)."""
    torch.manual_seed(0)
    head = torch.nn.Linear(w.DIM, 1)
    if bag:
        table = torch.nn.EmbeddingBag.from_pretrained(initial.clone(), freeze=False, mode="sum", sparse=True)
    else:
        table = torch.nn.Embedding.from_pretrained(initial.clone(), freeze=False, sparse=True)
    args = w.table_args(kind)
    name, lr = args.pop("optimizer"), args.pop("lr")
    sparse = {"adam": torch.optim.SparseAdam, "adagrad": torch.optim.Adagrad, "sgd": torch.optim.SGD}[name]
    table_opt = sparse(table.parameters(), lr=lr, **args)
    head_opt = torch.optim.SGD(head.parameters(), lr=0.1)
    for step in range(steps):
        ids, y = w.batch(step)
        table_opt.zero_grad()
        head_opt.zero_grad()
        # The mean over the global batch is the mean of the two halves' means.
        sit = step in sit_out
        loss = torch.nn.functional.mse_loss(w.forward(table, head, ids, bag, sit), y)
        if sit and sit_out_grad == "empty":
            loss = loss + table(torch.empty(0, dtype=torch.int64)).sum()
        loss.backward()
        table_opt.step()
        head_opt.step()
    return table.weight.detach(), head.state_dict()


def trained_in_jobs(configs, arguments):
    """{configuration: (rank 0's saved rows and head, each rank's first
    rows)}: the configurations (kind, bag, hosts) of each number of hosts
    one after the other in one job (torch_embedding_worker.py --configs:
    each its own table and head; a job's time is mostly its workers' start
    and torch's import)."""
    got = {}
    for hosts in sorted({c[2] for c in configs}, reverse=True):
        mine = [c for c in configs if c[2] == hosts]
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "rows.pt")
            code, log = run_job(WORKER, ["--configs", json.dumps([arguments(*c) for c in mine]), "--out", out],
                                ONE_HOST if hosts == 1 else None, hosts)
            assert code == 0, log
            assert ("each host summing first" in log) == (hosts == 1), log
            for i, c in enumerate(mine):
                part = "%s.c%d" % (out, i)
                got[c] = (torch.load(part), [torch.load("%s.initial%d" % (part, r)) for r in range(2)])
    return got


SYNC = [("adam", False, 2), ("adagrad", False, 2), ("sgd", True, 2), ("adam", True, 2), ("adam", False, 1),
        ("sgd", True, 1)]
SYNC_STEPS = 12


@pytest.fixture(scope="module")
def sync_trained():
    return trained_in_jobs(SYNC, lambda kind, bag, hosts: ["--optimizer", kind, "--steps", str(SYNC_STEPS)] +
                           (["--bag"] if bag else []))


@pytest.mark.parametrize("kind,bag,hosts", SYNC)
def test_sync_two_workers_equal_one_process_with_torch_sparse_optimizers(kind, bag, hosts, sync_trained):
    """hosts 1: both workers on one host, which sums their rows per id
    before the push (docs/runtime.md, "Local aggregation")."""
    steps = SYNC_STEPS
    got = sync_trained[(kind, bag, hosts)][0]
    rows, head = reference(kind, bag, got["initial"], steps)
    torch.testing.assert_close(got["final"], rows, rtol=0, atol=1e-5)
    for name, value in head.items():
        torch.testing.assert_close(got["head"][name], value, rtol=0, atol=1e-5)
    # The rows trained: some moved well away from where they started.
    assert (got["final"] - got["initial"]).abs().max() > 1e-2
    # New rows start as N(0, 1) (nn.Embedding's), drawn from (seed, id).
    assert 0.7 < got["initial"].std() < 1.3


PRETRAINED = [("adam", False, 2), ("sgd", True, 2), ("adam", False, 1)]
PRETRAINED_STEPS = 8


@pytest.fixture(scope="module")
def pretrained_trained():
    return trained_in_jobs(PRETRAINED, lambda kind, bag, hosts: (
        ["--optimizer", kind, "--steps", str(PRETRAINED_STEPS), "--pretrained"] + (["--bag"] if bag else [])))


@pytest.mark.parametrize("kind,bag,hosts", PRETRAINED)
def test_a_table_from_pretrained_rows_starts_from_rank_0s_and_trains_as_one_process(kind, bag, hosts,
                                                                                    pretrained_trained):
    """psrt.Embedding.from_pretrained(matrix): rank 0's rows are every rank's
    at step 0 (rank 1 passes zeros), and training from them equals
    nn.Embedding.from_pretrained(matrix, sparse=True) with torch's sparse
    optimizer in one process."""
    steps = PRETRAINED_STEPS
    got, starts = pretrained_trained[(kind, bag, hosts)]
    matrix = w.pretrained()
    for start in starts:
        assert torch.equal(start, matrix)
    rows, head = reference(kind, bag, matrix, steps)
    torch.testing.assert_close(got["final"], rows, rtol=0, atol=1e-5)
    for name, value in head.items():
        torch.testing.assert_close(got["head"][name], value, rtol=0, atol=1e-5)
    assert (got["final"] - matrix).abs().max() > 1e-2


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_pretrained_rows_are_sent_once_a_job_and_a_restarted_rank_0_keeps_the_trained_ones(mode):
    """Rank 0 fails at step 3 and is started again (restart_workers): its
    from_pretrained finds the rows trained for 3 steps on the servers and
    sends nothing, and it goes on from step 3 (sync: the table's version on
    the servers), so the job ends as an uninterrupted one. Async jobs start
    from pretrained rows too: registration, not a step, orders the rows
    before every rank's first read."""
    crash, steps = 3, 6
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.pt")
        code, log = run_job(WORKER, ["--optimizer", "sgd", "--steps", str(steps), "--out", out, "--pretrained",
                                     "--crash-at", str(crash)], {"mode": mode, "restart_workers": 1})
        assert code == 0, log
        assert "its agent restarts it" in log, log
        starts = [torch.load("%s.initial%d" % (out, r)) for r in range(2)]
        restarted = torch.load(out + ".restarted")
        got = torch.load(out)
    matrix = w.pretrained()
    for start in starts:
        assert torch.equal(start, matrix)
    assert (restarted - matrix).abs().max() > 1e-2
    if mode == "sync":
        rows, _ = reference("sgd", False, matrix, crash)
        torch.testing.assert_close(restarted, rows, rtol=0, atol=1e-5)
        rows, head = reference("sgd", False, matrix, steps)
        torch.testing.assert_close(got["final"], rows, rtol=0, atol=1e-5)
        for name, value in head.items():
            torch.testing.assert_close(got["head"][name], value, rtol=0, atol=1e-5)


def test_gradscaler_unscales_the_rows_too():
    """A scaled loss (1024x) trains the rows as the unscaled one does in one
    process: step() unscales the rows' gradients with the dense ones. The
    user's scaler.unscale_(opt) cannot reach the rows, so it is refused."""
    steps = 4
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.pt")
        code, log = run_job(WORKER, ["--optimizer", "sgd", "--steps", str(steps), "--out", out, "--scaler"])
        assert code == 0, log
        got = torch.load(out)
        rows, head = reference("sgd", False, got["initial"], steps)
        torch.testing.assert_close(got["final"], rows, rtol=0, atol=1e-5)
        assert (got["final"] - got["initial"]).abs().max() > 1e-2
        code, log = run_job(WORKER, ["--optimizer", "sgd", "--steps", "1", "--out", out, "--scaler", "--unscale"])
    assert code != 0
    assert "scaler.unscale_(opt) does not reach psrt.torch.Embedding's rows" in log, log[-3000:]


def test_lazy_adam_counts_every_step_of_the_job_as_a_table_step():
    """A table that no worker's forward uses in a step (steps 2, 3 and 6;
    its pushes have no rows on any server, so each waits for the step
    there) still counts that step in Adam's bias correction (docs/sparse.md):
    as SparseAdam does for a table looked up with no ids, and not as it does
    for a table without a gradient."""
    steps, sit_out = 9, (2, 3, 6)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.pt")
        code, log = run_job(WORKER, ["--steps", str(steps), "--out", out, "--sit-out", "2,3,6"])
        assert code == 0, log
        got = torch.load(out)
    # Float ids are refused (nn.Embedding raises), naming the table.
    assert log.count("float ids refused: table 'table': ids of dtype torch.float32") == 2, log
    counted, head = reference("adam", False, got["initial"], steps, sit_out, "empty")
    torch.testing.assert_close(got["final"], counted, rtol=0, atol=1e-5)
    for name, value in head.items():
        torch.testing.assert_close(got["head"][name], value, rtol=0, atol=1e-5)
    skipped, _ = reference("adam", False, got["initial"], steps, sit_out, "none")
    assert (got["final"] - skipped).abs().max() > 1e-3


def test_ids_of_a_float_dtype_are_refused_naming_the_table():
    from psrt.torch.embedding import _int_ids
    with pytest.raises(RuntimeError):
        torch.nn.Embedding(4, 2)(torch.tensor([1.0]))  # what psrt follows
    for dtype in (torch.float32, torch.float16, torch.float64, torch.bool):
        with pytest.raises(psrt.PsrtError, match=r"table 'user': ids of dtype %s; ids are integers" % dtype):
            _int_ids("user", torch.zeros(2, dtype=dtype))
    for dtype in (torch.int64, torch.int32):
        assert _int_ids("user", torch.zeros(2, dtype=dtype)).dtype == dtype


@pytest.mark.parametrize("start", [[], ["--pretrained"]])
def test_a_checkpoint_holds_the_tables_and_restores_onto_another_number_of_servers(start):
    """6 steps on 2 servers and 2 workers, a checkpoint, then 6 more on 1
    server and 1 worker: the rows (and Adam's moments, or the last 6 steps
    would differ) end as 12 uninterrupted steps would have them. A table
    from pretrained rows resumes from the checkpoint's rows (its rows are
    not sent again)."""
    with tempfile.TemporaryDirectory() as d:
        ckpt = {"checkpoint": {"uri": "file://" + d + "/ckpt"}}
        out = os.path.join(d, "rows.pt")
        code, log = run_job(WORKER, ["--steps", "6", "--out", out] + start, ps=ckpt)
        assert code == 0, log
        initial = torch.load(out)["initial"]
        inspect = subprocess.run([os.path.join(BIN, "psrt-ckpt"), "inspect", "file://" + d + "/ckpt"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert inspect.returncode == 0, inspect.stdout
        rows = re.search(r"table\s+table of dim 8, vocabulary 40: (\d+) rows, (\d+) bytes", inspect.stdout)
        assert rows, inspect.stdout
        # Adam keeps 2 slots: 3 floats per value.
        assert int(rows.group(2)) == int(rows.group(1)) * 8 * 4 * 3, inspect.stdout
        code, log = run_job(WORKER, ["--steps", "12", "--out", out] + start, ps=dict(ckpt, restore="latest"),
                            hosts=1)
        assert code == 0, log
        assert re.search(r"restored \d+ keys from \S+ \(step 6\)", log), log
        got = torch.load(out)
    rows, head = reference("adam", False, initial, 12)
    torch.testing.assert_close(got["final"], rows, rtol=0, atol=1e-5)
    for name, value in head.items():
        torch.testing.assert_close(got["head"][name], value, rtol=0, atol=1e-5)


@pytest.mark.parametrize("mode", [{"mode": "sync", "compression": "fp16"}, {"mode": "async"},
                                  {"mode": "ssp", "staleness": 2}])
def test_the_recsys_demo_learns_the_clicks_in_every_mode(mode):
    # Async and ssp apply each worker's rows as they come, at rows a few
    # steps old; fp16 halves the rows on the wire. A smaller run than `make
    # demo DEMO=recsys` (0.85 there, the generator's own 0.88).
    code, log = run_job(os.path.join(EXAMPLES, "torch_recsys.py"),
                        ["--samples", "80000", "--epochs", "2", "--threshold", "0.75"], ps=mode)
    assert code == 0, log
    assert re.search(r"demo: test AUC 0\.\d+", log), log
