"""A Hugging Face Trainer job for test_hf_trainer.py: a small GPT-2 (causal
LM) or BERT (sequence classification) on fixed-length token sequences.

Under psrt-run it trains with psrt.torch.hf.Trainer and saves, per rank,
the final parameters, the samples it read in order, and what the Trainer
thought of its place. With --reference N it is one process with the
plain transformers.Trainer on the global batch of N workers: each step's
batch is the N workers' batches together, in rank order, as
DistributedSampler deals them.
"""

import argparse
import json
import os

import torch
import transformers
from torch.utils.data import Dataset, DistributedSampler, Sampler

SAMPLES, LENGTH, VOCAB, PER_DEVICE = 64, 16, 64, 4


class Tokens(Dataset):
    """Fixed-length sequences (every batch has as many label tokens), which
    records the order it is read in."""

    def __init__(self, kind):
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, VOCAB, (SAMPLES, LENGTH), generator=g)
        self.classes = torch.randint(0, 2, (SAMPLES,), generator=g)
        self.kind = kind
        self.read = []

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        self.read.append(int(i))
        labels = self.ids[i] if self.kind == "gpt2" else self.classes[i]
        return {"input_ids": self.ids[i], "labels": labels}


def model_for(kind):
    """Without dropout: its masks come from each process's own random stream."""
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2,
                                         resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, bos_token_id=0, eos_token_id=0)
        return transformers.GPT2LMHeadModel(config)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=LENGTH, num_labels=2,
                                     hidden_dropout_prob=0, attention_probs_dropout_prob=0)
    return transformers.BertForSequenceClassification(config)


def arguments(opts, output_dir, batch):
    return transformers.TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=batch, max_steps=opts.steps,
        gradient_accumulation_steps=opts.accumulation, max_grad_norm=opts.max_grad_norm,
        learning_rate=1e-3, lr_scheduler_type="linear", optim=opts.optim, weight_decay=0.01,
        bf16=opts.bf16, use_cpu=True, seed=0, logging_steps=1, save_strategy="steps", save_steps=opts.steps,
        report_to="none", disable_tqdm=True, dataloader_num_workers=0, train_sampling_strategy=opts.sampling)


class Interleaved(Sampler):
    """The global batches of `workers` DistributedSamplers: per step, each
    worker's batch in rank order."""

    def __init__(self, dataset, workers):
        self.samplers = [DistributedSampler(dataset, workers, r, shuffle=True, seed=0) for r in range(workers)]

    def set_epoch(self, epoch):
        for s in self.samplers:
            s.set_epoch(epoch)

    def __len__(self):
        return sum(len(s) for s in self.samplers)

    def __iter__(self):
        orders = [list(s) for s in self.samplers]
        for t in range(0, len(orders[0]), PER_DEVICE):
            for order in orders:
                yield from order[t:t + PER_DEVICE]


class ReferenceTrainer(transformers.Trainer):
    def __init__(self, workers, *args, **kwargs):
        self.workers = workers
        super().__init__(*args, **kwargs)

    def _get_train_sampler(self, train_dataset=None):
        return Interleaved(self.train_dataset, self.workers)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--accumulation", type=int, default=1)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--optim", default="adamw_torch", help="TrainingArguments.optim")
    ap.add_argument("--sampling", default="random", help="TrainingArguments.train_sampling_strategy")
    ap.add_argument("--refused-sampling", help="first make a Trainer with this train_sampling_strategy, which "
                    "it must refuse at construction; the report says what it said")
    ap.add_argument("--reference", type=int, default=0, help="one process on N workers' global batch")
    ap.add_argument("--configs", help="a JSON list of argument lists (models of other kinds: their parameters' "
                    "names are the servers' keys): one after the other in this job, the i-th's files under OUT.ci")
    ap.add_argument("--model", choices=["gpt2", "bert"])
    ap.add_argument("--out", required=True)
    opts = ap.parse_args(argv)
    if opts.configs:
        for i, args in enumerate(json.loads(opts.configs)):
            main(args + ["--out", "%s.c%d" % (opts.out, i)])
        return
    if not opts.model:
        ap.error("--model or --configs is required")
    data = Tokens(opts.model)
    model = model_for(opts.model)
    if opts.reference:
        trainer = ReferenceTrainer(opts.reference, model=model, train_dataset=data,
                                   args=arguments(opts, opts.out + ".reference", PER_DEVICE * opts.reference))
        trainer.train()
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, opts.out + ".reference.pt")
        return
    import psrt.torch.hf as hf
    import psrt.torch as psrt
    psrt.init()
    rank = psrt.rank()
    refused = None
    if opts.refused_sampling:
        refusing = argparse.Namespace(**dict(vars(opts), sampling=opts.refused_sampling))
        try:
            hf.Trainer(model=model, train_dataset=data,
                       args=arguments(refusing, "%s.refused%d" % (opts.out, rank), PER_DEVICE))
            refused = "not refused"
        except psrt.PsrtError as e:
            refused = str(e)
    trainer = hf.Trainer(model=model, train_dataset=data,
                         args=arguments(opts, "%s.rank%d" % (opts.out, rank), PER_DEVICE))
    trainer.train()
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, "%s.rank%d.pt" % (opts.out, rank))
    with open("%s.rank%d.json" % (opts.out, rank), "w") as f:
        json.dump({"read": data.read, "world_process_zero": trainer.is_world_process_zero(),
                   "should_save": trainer.args.should_save, "world_size": trainer.args.world_size,
                   "refused": refused,
                   "environment": sorted(k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")
                                         if k in os.environ)}, f)


if __name__ == "__main__":
    main()
