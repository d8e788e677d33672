"""Fine-tuning a GPT-2 with Hugging Face's Trainer through psrt.

A GPT-2 (small widths by default, so it runs on CPUs) learns a synthetic
language in which each token is the one before plus a per-sentence stride
(no download). psrt.torch.hf.Trainer shards the data over the job's
workers, runs AdamW on the servers on the mean gradient (clipped to
max_grad_norm), and logs, evaluates and saves on rank 0.

    build/bin/psrt-run --local=2 --distribution='{"parameter_server": {"enabled": true}}' \\
      -- .venv/bin/python examples/hf_trainer_finetune.py --output-dir /tmp/gpt2-psrt

The psrt-specific line is marked "psrt:".
"""

import argparse

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

from psrt.torch.hf import Trainer  # psrt: instead of transformers.Trainer


class Strides(Dataset):
    """Sentences of `length` tokens, each the one before plus a stride."""

    def __init__(self, n, length, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (n, 1), generator=g)
        stride = torch.randint(1, 4, (n, 1), generator=g)
        self.ids = (start + stride * torch.arange(length)) % vocab

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", default="hf_trainer_output")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=16, help="sentences per step and worker")
    p.add_argument("--length", type=int, default=32)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    args = p.parse_args()
    torch.manual_seed(0)  # rank 0's initial weights become everyone's anyway
    config = GPT2Config(vocab_size=args.vocab, n_positions=args.length, n_embd=args.width,
                        n_layer=args.layers, n_head=4, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=args.batch,
        learning_rate=3e-3, lr_scheduler_type="linear", warmup_steps=args.steps // 10, weight_decay=0.01,
        max_grad_norm=1.0, optim="adamw_torch", eval_strategy="steps", eval_steps=max(1, args.steps // 4),
        logging_steps=max(1, args.steps // 10), save_strategy="no", report_to="none", disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(), seed=0)
    trainer = Trainer(model=model, args=training, train_dataset=Strides(4096, args.length, args.vocab, 1),
                      eval_dataset=Strides(256, args.length, args.vocab, 2))
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    if trainer.is_world_process_zero():
        print("eval loss %.4f -> %.4f" % (before, after))
        trainer.save_model()


if __name__ == "__main__":
    main()
