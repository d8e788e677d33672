"""psrt.torch.Embedding and EmbeddingBag in real jobs: two workers in sync
mode against one process with nn.Embedding(sparse=True) / nn.EmbeddingBag and
torch's own sparse optimizers on the mean gradient."""

import os
import tempfile

import pytest
import torch

from jobs import HERE, run_job
import torch_embedding_worker as w


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
        code, log = run_job(os.path.join(HERE, "torch_embedding_worker.py"),
                            ["--optimizer", kind, "--steps", str(steps), "--out", out] + (["--bag"] if bag else []))
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
