"""psrt.torch.hf.Trainer in real jobs: Hugging Face's Trainer with a GPT-2
and a BERT from transformers, two workers under psrt-run, against one
process with the plain Trainer on the global batch (the mean gradient), with
and without max_grad_norm and gradient accumulation, in bf16 where the CPU
allows it."""

import json
import os
import re
import tempfile

import pytest
import torch

from jobs import EXAMPLES, HERE, failure_text, references, run_job, shard_order
import hf_trainer_worker as w

WORKER = os.path.join(HERE, "hf_trainer_worker.py")


CONFIGS = [("gpt2", 1, 1.0, False), ("gpt2", 2, 0.0, False), ("bert", 2, 1.0, False), ("bert", 1, 0.0, True)]
# transformers' Adafactor (optim="adafactor"), which the servers do not run:
# every worker runs it on the mean gradient. BERT's attention keys have a
# bias of their own whose gradient is zero in exact arithmetic (softmax does
# not change when a constant is added to every score): what is there is
# rounding, which Adafactor scales up to a step of the learning rate in one
# process as in two, each its own. Those biases are left out of the
# comparison (GPT-2's fused query-key-value bias would spread it to the
# whole tensor through Adafactor's RMS clip).
ADAFACTOR = ("bert", 1, 1.0, False, "adafactor")
NOISE_ONLY = "attention.self.key.bias"


def arguments(model, accumulation, max_grad_norm, bf16, optim="adamw_torch"):
    return (["--model", model, "--accumulation", str(accumulation), "--max-grad-norm", str(max_grad_norm),
             "--optim", optim] + (["--bf16"] if bf16 else []))


def selected(request):
    """The configurations of the session's tests (ctest runs the Adafactor
    case apart from the others)."""
    configs = []
    for item in request.session.items:
        params = getattr(item, "callspec", None) and item.callspec.params
        if params and "max_grad_norm" in params:
            configs.append((params["model"], params["accumulation"], params["max_grad_norm"], params["bf16"]))
        elif "adafactor" in item.name:
            configs.append(ADAFACTOR)
    return configs


@pytest.fixture(scope="module")
def reference(tmp_path_factory, request):
    """{configuration: the plain Trainer's parameters in one process on the
    global batch}, the selected tests' configurations' made by one process."""
    d = tmp_path_factory.mktemp("reference")
    configs = selected(request)
    out = {c: os.path.join(d, "r%d" % i) for i, c in enumerate(configs)}
    references(WORKER, [arguments(*c) + ["--out", out[c]] for c in configs])
    return {c: torch.load(out[c] + ".reference.pt") for c in configs}


# A job of two workers spends most of its time importing transformers: one
# job trains a GPT-2 and then a BERT (their parameters' names, the servers'
# keys, differ), each of CONFIGS's in one of two jobs. The first
# configuration's worker also makes, before its Trainer, one with what
# psrt.torch.hf.Trainer cannot match, which each rank must refuse at
# construction.
JOBS = [[CONFIGS[0], CONFIGS[2]], [CONFIGS[1], CONFIGS[3]]]
REFUSED = ["--refused-sampling", "group_by_length"]


def config_arguments(config):
    return arguments(*config) + (REFUSED if config == CONFIGS[0] else [])


def train(configs):
    """{configuration: each rank's (final parameters, report)}, `configs`
    trained one after the other in one job."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r")
        code, log = run_job(WORKER, ["--configs", json.dumps([config_arguments(c) for c in configs]), "--out", out])
        assert code == 0, failure_text(log)
        got = {}
        for i, config in enumerate(configs):
            part = "%s.c%d" % (out, i)
            ranks = []
            for r in range(2):
                with open("%s.rank%d.json" % (part, r)) as f:
                    ranks.append((torch.load("%s.rank%d.pt" % (part, r)), json.load(f)))
            # Rank 0 saved the Trainer's checkpoint; rank 1 only its RNG state.
            assert os.path.exists(os.path.join(part + ".rank0", "checkpoint-6", "model.safetensors"))
            assert os.listdir(os.path.join(part + ".rank1", "checkpoint-6")) == ["rng_state_1.pth"]
            got[config] = ranks
        return got


@pytest.fixture(scope="module")
def trained():
    """trained(configuration): what train gave for it, its job run once."""
    done = {}

    def get(config):
        if config not in done:
            done.update(train(next(j for j in JOBS if config in j) if config in CONFIGS else [config]))
        return done[config]
    return get


@pytest.mark.parametrize("model,accumulation,max_grad_norm,bf16", CONFIGS)
def test_trainer_on_two_workers_equals_one_process_on_the_global_batch(model, accumulation, max_grad_norm, bf16,
                                                                        reference, trained):
    check_against_reference((model, accumulation, max_grad_norm, bf16), reference, trained)


def test_trainer_with_adafactor_on_the_workers_equals_one_process_on_the_global_batch(reference, trained):
    check_against_reference(ADAFACTOR, reference, trained)


def check_against_reference(config, reference, trained):
    model, accumulation, max_grad_norm, bf16 = config[:4]
    (p0, r0), (p1, r1) = trained(config)
    if config == CONFIGS[0]:
        for report in (r0, r1):
            assert ("psrt.torch.hf.Trainer: train_sampling_strategy='group_by_length' is not rank-aware"
                    in report["refused"]), report["refused"]
    # Ranks equal bit for bit.
    for name in p0:
        assert torch.equal(p0[name], p1[name]), name
    # Each rank read its own shard, reshuffled each epoch, as DistributedSampler
    # deals it (the dataloader reads one batch ahead).
    dataset = w.Tokens(model)
    used = 6 * accumulation * w.PER_DEVICE
    for rank, report in enumerate((r0, r1)):
        assert report["read"][:used] == shard_order(dataset, 2, rank, 2)[:used], rank
        assert report["world_size"] == 2
        assert report["world_process_zero"] == report["should_save"] == (rank == 0)
        assert report["environment"] == [], "no torch.distributed variables"
    first = min(used, w.SAMPLES // 2)  # an epoch's
    assert not set(r0["read"][:first]) & set(r1["read"][:first]), "the shards overlap"
    # One process on the global batch: Adam on the servers, torch's AdamW
    # there (measured: within 1e-6 in float32, 4e-4 under bf16 autocast,
    # whose matmuls round differently for a batch of 4 and one of 8).
    atol = 1e-3 if bf16 else 1e-5
    moved = 0.0
    initial = w.model_for(model).state_dict()
    for name, value in reference[config].items():
        if config == ADAFACTOR and name.endswith(NOISE_ONLY):
            continue
        torch.testing.assert_close(p0[name], value, rtol=0, atol=atol, msg=name)
        moved = max(moved, (value - initial[name]).abs().max().item())
    assert moved > 3 * atol, "training moved the weights"


def test_the_fine_tuning_example_trains_and_rank_0_saves_the_model():
    # 30 steps: the eval loss falls to 0.60 of where it began (0.50 after 40,
    # 0.72 after 20).
    with tempfile.TemporaryDirectory() as d:
        code, log = run_job(os.path.join(EXAMPLES, "hf_trainer_finetune.py"),
                            ["--output-dir", d, "--steps", "30", "--batch", "8"])
        assert code == 0, log
        m = re.search(r"eval loss ([0-9.]+) -> ([0-9.]+)", log)
        assert m, log
        assert float(m.group(2)) < 0.7 * float(m.group(1)), log
        assert os.path.exists(os.path.join(d, "model.safetensors"))
