"""psrt.torch.lightning.PsrtStrategy in real jobs: Lightning's Trainer with a
CNN with BatchNorm, SGD with momentum under a StepLR schedule and gradient
clipping, two workers under psrt-run, against one process with Lightning's
own strategy on the mean gradient (each worker's part of the global batch
through the model on its own), with gradient accumulation and bf16 autocast."""

import json
import os
import re
import tempfile

import pytest
import torch

from jobs import EXAMPLES, HERE, failure_text, references, run_job, shard_order
import lightning_worker as w

WORKER = os.path.join(HERE, "lightning_worker.py")


CONFIGS = [(1, "32-true"), (2, "32-true"), (1, "bf16-mixed"), (1, "16-mixed-cpu-scaler"), (1, "16-mixed")]


def runnable(precision):
    return precision != "16-mixed" or torch.cuda.is_available()


# torch's RMSprop, which the servers do not run: every worker runs it on the
# mean gradient (optimizer_on "auto").
RMSPROP = (1, "32-true", "rmsprop")


def arguments(accumulation, precision, optimizer="sgd"):
    return ["--accumulation", str(accumulation), "--precision", precision, "--optimizer", optimizer]


# Every runnable configuration, each model's layers named by its place here
# (Net's name: the servers' keys of one are not another's).
TRAINED = [c for c in CONFIGS if runnable(c[1])] + [RMSPROP]


def name(config):
    return "c%d" % TRAINED.index(config)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """{configuration: one process's parameters on the mean gradient}, every
    configuration's made by one process (Lightning imported once)."""
    d = tmp_path_factory.mktemp("reference")
    out = {c: os.path.join(d, name(c)) for c in TRAINED}
    references(WORKER, [arguments(*c) + ["--name", name(c), "--out", out[c]] for c in TRAINED])
    return {c: torch.load(out[c] + ".reference.pt") for c in TRAINED}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """{configuration: (each rank's parameters, each rank's report)}, every
    configuration trained in turn by one job of two workers (each worker
    imports Lightning once: most of a job's time)."""
    out = os.path.join(tmp_path_factory.mktemp("trained"), "r")
    code, log = run_job(WORKER, ["--configs", json.dumps([arguments(*c) for c in TRAINED]), "--out", out])
    assert code == 0, failure_text(log)
    got = {}
    for c in TRAINED:
        part = "%s.%s" % (out, name(c))
        reports = []
        for r in range(2):
            with open("%s.rank%d.json" % (part, r)) as f:
                reports.append(json.load(f))
        got[c] = ([torch.load("%s.rank%d.pt" % (part, r)) for r in range(2)], reports)
    return got


@pytest.mark.parametrize("accumulation,precision", CONFIGS)
def test_lightning_on_two_workers_equals_one_process_on_the_mean_gradient(accumulation, precision, reference,
                                                                          trained):
    if not runnable(precision):
        pytest.skip("fp16 autocast and its GradScaler need CUDA (Lightning runs bf16 on a CPU)")
    check_against_reference((accumulation, precision), reference, trained)


def test_lightning_with_rmsprop_on_the_workers_equals_one_process_on_the_mean_gradient(reference, trained):
    check_against_reference(RMSPROP, reference, trained)


def check_against_reference(config, reference, trained):
    accumulation = config[0]
    got, reports = trained[config]
    want = reference[config]
    for n in want:
        assert torch.equal(got[0][n], got[1][n]), n
        torch.testing.assert_close(got[0][n], want[n], rtol=0, atol=1e-5, msg=n)
    initial = dict(w.Net(name=name(config)).named_parameters())
    assert max((want[n] - initial[n]).abs().max().item() for n in want) > 1e-2, "training moved the weights"
    # Each rank read its own shard, reshuffled each epoch, as DistributedSampler deals it.
    used = 6 * accumulation * w.PER_DEVICE
    dataset = w.Images()
    for rank, report in enumerate(reports):
        assert report["read"][:used] == shard_order(dataset, 2, rank, 2)[:used], rank
        assert (report["global_rank"], report["world_size"], report["is_global_zero"]) == (rank, 2, rank == 0)
    # Rank 0 alone writes the checkpoint and the logs; a metric logged with
    # sync_dist is the same everywhere.
    assert any(f.endswith(".ckpt") for f in reports[0]["files"]), reports[0]
    assert reports[1]["files"] == []
    assert reports[0]["logged"] == reports[1]["logged"]


@pytest.mark.parametrize("flags,ps,messages", [
    (["--resume", "/nonexistent.ckpt", "--iterable"], None,
     ["rank %d: refused: PsrtStrategy: ckpt_path=/nonexistent.ckpt would load weights" % r for r in (0, 1)] +
     ["PsrtStrategy: an IterableDataset is not sharded by Lightning"]),
    ([], {"mode": "async"}, ["PsrtStrategy: Lightning's barriers, broadcasts and sync_dist need every worker: "
                             "FAILED_PRECONDITION: a sum over the job's workers needs every worker's push in each "
                             "step; the job's mode is async"]),
])
def test_what_lightning_cannot_match_is_refused(flags, ps, messages):
    with tempfile.TemporaryDirectory() as d:
        code, log = run_job(WORKER, flags + ["--out", os.path.join(d, "r")], ps)
    assert code != 0
    for message in messages:
        assert message in log, log


def test_the_digits_example_learns_and_rank_0_checkpoints():
    with tempfile.TemporaryDirectory() as d:
        # 3 epochs: 0.947 (0.982 after 5).
        code, log = run_job(os.path.join(EXAMPLES, "lightning_digits.py"), ["--epochs", "3", "--root", d])
        assert code == 0, log
        m = re.search(r"digits: validation accuracy ([0-9.]+)", log)
        assert m and float(m.group(1)) >= 0.9, log
        assert any(f.endswith(".ckpt") for _, _, fs in os.walk(d) for f in fs)
