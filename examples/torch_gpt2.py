"""A GPT-2-small-shaped language model (Hugging Face transformers) through psrt.

GPT-2 small's shape by default (12 layers, 768 wide, 12 heads, 50257 tokens,
the output layer tied to the token embedding), trained from scratch as the
GPT-2 recipe does: AdamW with weight decay, the gradient's norm clipped to 1,
a linear warm-up into a cosine schedule. The text is synthetic (tokens drawn
from a fixed table of common bigrams, so the loss falls; no download).
Rank 0 prints the loss and tokens/s.

    build/bin/psrt-run --local=2 --distribution='{"parameter_server": {"enabled": true}}' \\
      -- .venv/bin/python examples/torch_gpt2.py

The psrt-specific lines are marked "psrt:".
"""

import argparse
import math
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import psrt.torch as psrt


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=4, help="sequences per step and worker")
    p.add_argument("--seq", type=int, default=256, help="tokens per sequence")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--warmup", type=int, default=10, help="steps of linear warm-up")
    p.add_argument("--log-every", type=int, default=10)
    args = p.parse_args()
    psrt.init()  # psrt: join the job psrt-run started
    rank, size = psrt.rank(), psrt.size()
    torch.set_num_threads(1)

    # Synthetic text: each token mostly follows from the one before.
    following = torch.randint(0, args.vocab, (args.vocab,), generator=torch.Generator().manual_seed(0))
    data = torch.Generator().manual_seed(1 + rank)

    def batch():
        tokens = torch.empty(args.batch, args.seq, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, args.vocab, (args.batch,), generator=data)
        for t in range(1, args.seq):
            noise = torch.rand(args.batch, generator=data) < 0.1
            tokens[:, t] = torch.where(noise, torch.randint(0, args.vocab, (args.batch,), generator=data),
                                       following[tokens[:, t - 1]])
        return tokens

    torch.manual_seed(rank)  # different on every rank: rank 0's values win
    config = GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=args.heads, vocab_size=args.vocab,
                        n_positions=max(1024, args.seq))
    model = GPT2LMHeadModel(config)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))

    def warmup_cosine(step):
        if step < args.warmup:
            return (step + 1) / args.warmup
        return 0.5 * (1 + math.cos(math.pi * (step - args.warmup) / max(1, args.steps - args.warmup)))

    schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine)
    # psrt: the servers run AdamW; the clip below sees the mean gradient over
    # the workers, as one process would.
    opt = psrt.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print("example: GPT-2 (%.1fM parameters), %d workers, %d steps of %d x %d tokens each"
              % (params / 1e6, size, args.steps, args.batch, args.seq), flush=True)
    start, first = time.monotonic(), None
    for step in range(args.steps):
        tokens = batch()
        opt.zero_grad()
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        first = loss.item() if first is None else first
        if rank == 0 and ((step + 1) % args.log_every == 0 or step + 1 == args.steps):
            rate = (step + 1) * args.batch * args.seq * size / (time.monotonic() - start)
            print("step %d/%d loss %.4f tokens/s %.0f" % (step + 1, args.steps, loss.item(), rate), flush=True)
    if rank == 0:
        print("example: done: loss %.4f -> %.4f" % (first, loss.item()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
