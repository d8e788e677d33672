"""BERT fine-tuning for classification (Hugging Face transformers) through psrt.

BERT-base's shape by default, its embedding layer frozen (as fine-tuning with
few examples often does: psrt registers the frozen weights with rank 0's
values and never pushes them), AdamW with a linear decay, on a synthetic
two-class task (a sentence is positive when it holds one of a few "positive"
tokens; no download). Rank 0 prints the loss, accuracy and samples/s.

    build/bin/psrt-run --local=2 --distribution='{"parameter_server": {"enabled": true}}' \\
      -- .venv/bin/python examples/torch_bert_finetune.py

The psrt-specific lines are marked "psrt:".
"""

import argparse
import sys
import time

import torch
from transformers import BertConfig, BertForSequenceClassification

import psrt.torch as psrt


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=16, help="sentences per step and worker")
    p.add_argument("--seq", type=int, default=64, help="tokens per sentence")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--log-every", type=int, default=10)
    args = p.parse_args()
    psrt.init()  # psrt: join the job psrt-run started
    rank, size = psrt.rank(), psrt.size()
    torch.set_num_threads(1)

    positive = torch.arange(100, 110)  # the tokens that make a sentence positive
    data = torch.Generator().manual_seed(1 + rank)

    def batch():
        tokens = torch.randint(1000, args.vocab, (args.batch, args.seq), generator=data)
        labels = torch.randint(0, 2, (args.batch,), generator=data)
        where = torch.randint(1, args.seq, (args.batch,), generator=data)
        pick = positive[torch.randint(0, len(positive), (args.batch,), generator=data)]
        tokens[labels == 1, where[labels == 1]] = pick[labels == 1]
        tokens[:, 0] = 101  # [CLS]
        return tokens, labels

    torch.manual_seed(rank)  # different on every rank: rank 0's values win
    config = BertConfig(num_hidden_layers=args.layers, hidden_size=args.width, num_attention_heads=args.heads,
                        intermediate_size=4 * args.width, vocab_size=args.vocab, num_labels=2)
    model = BertForSequenceClassification(config)
    for param in model.bert.embeddings.parameters():
        param.requires_grad = False  # psrt: frozen weights stay rank 0's, never pushed
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1 - step / args.steps)
    # psrt: the servers run AdamW.
    opt = psrt.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    if rank == 0:
        print("example: BERT fine-tuning (%.1fM parameters, %.1fM trainable), %d workers, %d steps of %d each"
              % (sum(p.numel() for p in model.parameters()) / 1e6, sum(p.numel() for p in trainable) / 1e6,
                 size, args.steps, args.batch), flush=True)
    start, first, correct, seen = time.monotonic(), None, 0, 0
    for step in range(args.steps):
        tokens, labels = batch()
        opt.zero_grad()
        out = model(input_ids=tokens, labels=labels)
        out.loss.backward()
        opt.step()
        schedule.step()
        first = out.loss.item() if first is None else first
        correct += int((out.logits.argmax(1) == labels).sum())
        seen += len(labels)
        if rank == 0 and ((step + 1) % args.log_every == 0 or step + 1 == args.steps):
            rate = (step + 1) * args.batch * size / (time.monotonic() - start)
            print("step %d/%d loss %.4f accuracy %.3f samples/s %.0f"
                  % (step + 1, args.steps, out.loss.item(), correct / seen, rate), flush=True)
            correct, seen = 0, 0
    if rank == 0:
        print("example: done: loss %.4f -> %.4f" % (first, out.loss.item()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
