"""psrt.torch.Embedding and EmbeddingBag in real jobs: two workers in sync
mode against one process with nn.Embedding(sparse=True) / nn.EmbeddingBag and
torch's own sparse optimizers on the mean gradient."""

import os
import re
import subprocess
import tempfile

import pytest
import torch

from jobs import BIN, EXAMPLES, HERE, run_job
import torch_embedding_worker as w

WORKER = os.path.join(HERE, "torch_embedding_worker.py")


def reference(kind, bag, initial, steps):
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
        torch.nn.functional.mse_loss(w.forward(table, head, ids, bag), y).backward()
        table_opt.step()
        head_opt.step()
    return table.weight.detach(), head.state_dict()


@pytest.mark.parametrize("kind,bag", [("adam", False), ("adagrad", False), ("sgd", True), ("adam", True)])
def test_sync_two_workers_equal_one_process_with_torch_sparse_optimizers(kind, bag):
    steps = 12
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.pt")
        code, log = run_job(WORKER, ["--optimizer", kind, "--steps", str(steps), "--out", out] + (["--bag"] if bag else []))
        assert code == 0, log
        got = torch.load(out)
    rows, head = reference(kind, bag, got["initial"], steps)
    torch.testing.assert_close(got["final"], rows, rtol=0, atol=1e-5)
    for name, value in head.items():
        torch.testing.assert_close(got["head"][name], value, rtol=0, atol=1e-5)
    # The rows trained: some moved well away from where they started.
    assert (got["final"] - got["initial"]).abs().max() > 1e-2
    # New rows start as N(0, 1) (nn.Embedding's), drawn from (seed, id).
    assert 0.7 < got["initial"].std() < 1.3


def test_a_checkpoint_holds_the_tables_and_restores_onto_another_number_of_servers():
    """6 steps on 2 servers and 2 workers, a checkpoint, then 6 more on 1
    server and 1 worker: the rows (and Adam's moments, or the last 6 steps
    would differ) end as 12 uninterrupted steps would have them."""
    with tempfile.TemporaryDirectory() as d:
        ckpt = {"checkpoint": {"uri": "file://" + d + "/ckpt"}}
        out = os.path.join(d, "rows.pt")
        code, log = run_job(WORKER, ["--steps", "6", "--out", out], ps=ckpt)
        assert code == 0, log
        initial = torch.load(out)["initial"]
        inspect = subprocess.run([os.path.join(BIN, "psrt-ckpt"), "inspect", "file://" + d + "/ckpt"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert inspect.returncode == 0, inspect.stdout
        rows = re.search(r"table\s+table of dim 8, vocabulary 40: (\d+) rows, (\d+) bytes", inspect.stdout)
        assert rows, inspect.stdout
        # Adam keeps 2 slots: 3 floats per value.
        assert int(rows.group(2)) == int(rows.group(1)) * 8 * 4 * 3, inspect.stdout
        code, log = run_job(WORKER, ["--steps", "12", "--out", out], ps=dict(ckpt, restore="latest"), hosts=1)
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
