"""Real architectures and training recipes through psrt's PyTorch plugin.

Each case builds a model people train (torch's own Transformer layers,
torchvision CNNs with BatchNorm, Hugging Face GPT-2 and BERT with tied
embeddings and attention masks, an LSTM language model), at small widths, and
trains it for a few steps with a recipe (clipping, GradScaler, frozen layers,
gradient accumulation). Rank r's batch at step s is drawn from seed (s, r).

Run under psrt-run, every rank trains the cases named on the command line and
writes its final parameters, buffers and loss scale to OUT.rankN (torch.save).
`reference(case, steps, workers)` computes in one process what those must be:
the same torch optimizer on the mean of the workers' gradients (SGD's last
operation rounded as the servers round it, see ServersRoundingSGD), each
worker's forward on its own batch (BatchNorm's batch statistics are per
worker), and floating-point buffers averaged over workers after each step.
"""

import argparse
import contextlib
import os
import time

import torch
from torch import nn
import torch.nn.functional as F

STEPS = 3
FUSION_BYTES = 1 << 16  # buckets go out during backward() even for small models
DEVICE = torch.device("cpu")  # --device / reference(device=): where models and batches live


def _on(*tensors):
    """Batches are drawn on the CPU (the same numbers on any device) and
    moved to DEVICE."""
    moved = tuple(t.to(DEVICE) for t in tensors)
    return moved if len(moved) > 1 else moved[0]


class _Seq2Seq(nn.Module):
    """nn.Transformer (encoder and decoder, MultiheadAttention throughout)
    on continuous sequences."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 32)
        self.transformer = nn.Transformer(d_model=32, nhead=4, num_encoder_layers=1, num_decoder_layers=1,
                                          dim_feedforward=64, dropout=0.0, batch_first=True)
        self.out = nn.Linear(32, 6)

    def forward(self, src, tgt):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.out(self.transformer(self.inp(src), self.inp(tgt), tgt_mask=mask, tgt_is_causal=True))


class _EmbeddingTransformer(nn.Module):
    """An embedding table and a TransformerEncoder (a language model's body)
    with a padding mask."""

    def __init__(self, vocab=50):
        super().__init__()
        self.embed = nn.Embedding(vocab, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, vocab)

    def forward(self, ids, pad):
        return self.head(self.encoder(self.embed(ids), src_key_padding_mask=pad))


class _LstmLm(nn.Module):
    def __init__(self, vocab=50):
        super().__init__()
        self.embed = nn.Embedding(vocab, 16)
        self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, vocab)

    def forward(self, ids):
        return self.head(self.lstm(self.embed(ids))[0])


class _AmpEncoder(nn.Module):
    """A TransformerEncoderLayer on continuous inputs (so a batch can
    overflow the scaled loss)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 32)
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.out = nn.Linear(32, 1)

    def forward(self, x):
        return self.out(self.layer(self.inp(x))).mean(dim=1)


class _Functional(nn.Module):
    """Its own weight read in its forward, a child used twice, a layer it
    never uses; the training loop calls forward() directly, so no hook runs
    around it."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 8) * 0.3)
        self.shared = nn.Linear(16, 16)
        self.unused = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        h = torch.tanh(F.linear(x, self.weight))
        h = self.shared(torch.tanh(self.shared(h)))
        return self.norm(h).sum(dim=1, keepdim=True)


class _SmallCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(F.relu(self.bn(self.conv(x))), 1).flatten(1))


def _gen(step, rank):
    return torch.Generator().manual_seed(step * 1000 + rank)


def _tokens(step, rank, vocab=50, n=3, length=8):
    g = _gen(step, rank)
    ids = torch.randint(1, vocab, (n, length), generator=g)
    pad = torch.zeros(n, length, dtype=torch.bool)
    pad[0, -3:] = True  # the first sequence is shorter
    return _on(ids, pad)


def _images(step, rank, n=4, size=64):
    g = _gen(step, rank)
    return _on(torch.randn(n, 3, size, size, generator=g), torch.randint(0, 10, (n,), generator=g))


def _hf_config(kind):
    import transformers
    if kind == "gpt2":
        return transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                       eos_token_id=0)
    return transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=16, hidden_dropout_prob=0.0,
                                   attention_probs_dropout_prob=0.0)


def _hf_batch(step, rank):
    ids, pad = _tokens(step, rank, vocab=64)
    return ids, (~pad).long()


# --- the cases: model, optimizer, loss, recipe ---------------------------------

def _transformer():
    return _Seq2Seq()


def _transformer_loss(model, step, rank):
    g = _gen(step, rank)
    src, tgt = _on(torch.randn(3, 5, 6, generator=g), torch.randn(3, 4, 6, generator=g))
    return F.mse_loss(model(src, tgt), tgt.roll(1, dims=1))


def _resnet18():
    import torchvision
    return torchvision.models.resnet18(num_classes=10)


def _mobilenet():
    import torchvision
    return torchvision.models.mobilenet_v3_small(num_classes=10, dropout=0.0)


def _image_loss(model, step, rank):
    x, y = _images(step, rank)
    return F.cross_entropy(model(x), y)


def _frozen_backbone():
    """A ResNet-18 backbone frozen for fine-tuning (its BatchNorm still
    tracks statistics) with a new trainable head."""
    model = _resnet18()
    for p in model.parameters():
        p.requires_grad_(False)
    model.fc = nn.Linear(512, 10)
    return model


def _gpt2():
    import transformers
    return transformers.GPT2LMHeadModel(_hf_config("gpt2"))


def _gpt2_loss(model, step, rank):
    ids, mask = _hf_batch(step, rank)
    labels = ids.masked_fill(mask == 0, -100)
    return model(input_ids=ids, attention_mask=mask, labels=labels).loss


def _bert():
    import transformers
    return transformers.BertForMaskedLM(_hf_config("bert"))


def _bert_loss(model, step, rank):
    ids, mask = _hf_batch(step, rank)
    labels = torch.full_like(ids, -100)
    labels[:, 2] = ids[:, 2]
    masked = ids.clone()
    masked[:, 2] = 3
    return model(input_ids=masked, attention_mask=mask, labels=labels).loss


def _lstm_loss(model, step, rank):
    ids, _ = _tokens(step, rank)
    logits = model(ids[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _embedding_transformer_loss(model, step, rank):
    ids, pad = _tokens(step, rank)
    logits = model(ids, pad)
    return F.cross_entropy(logits[~pad], ids.roll(-1, dims=1)[~pad])


def _amp_loss(model, step, rank):
    g = _gen(step, rank)
    x, y = torch.randn(4, 5, 6, generator=g), torch.randn(4, 1, generator=g)
    if step == 1 and rank == 1:
        x[0, 0, 0] = 3e38  # this worker's scaled loss overflows: the step is skipped everywhere
    x, y = _on(x, y)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16 if DEVICE.type == "cpu" else torch.float16):
        out = model(x)
    return F.mse_loss(out.float(), y)


def _functional_loss(model, step, rank):
    g = _gen(step, rank)
    x = _on(torch.randn(8, 8, generator=g))
    return F.mse_loss(model.forward(x), x.sum(dim=1, keepdim=True).sin())


def _compiled():
    """torch.compile's wrapper (the eager backend: dynamo traces, nothing is
    code-generated) around a CNN with BatchNorm."""
    return torch.compile(_SmallCnn(), backend="aot_eager")


def _compiled_in_place():
    """module.compile(): the module's own call is compiled, hooks included."""
    model = _SmallCnn()
    model.compile(backend="aot_eager")
    return model


def _small_image_loss(model, step, rank):
    x, y = _images(step, rank, size=16)
    return F.cross_entropy(model(x), y)


class ServersRoundingSGD(torch.optim.SGD):
    """torch.optim.SGD's algorithm (the momentum buffer is the first gradient,
    then momentum * buffer + gradient; param - lr * buffer) with the update
    rounded as psrt's servers round it: param + (-lr * buffer), two roundings,
    as torch's own unvectorized CPU kernels (ATEN_CPU_CAPABILITY=default) do
    bit for bit. torch's AVX2 and AVX-512 kernels fuse that multiply-add (one
    rounding), so about 1% of the elements end a step one float32 ulp apart,
    and ResNet-18 on batches of 4 magnifies that about 5000-fold a step
    (conv1.weight 1.4e-3 apart after 3 steps on an AVX-512 CPU, from the same
    mean gradients). The reference for psrt must not depend on which kernel
    this CPU gets; test_torch_models checks this class against torch's SGD."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            if group["weight_decay"] or group["dampening"] or group["nesterov"] or group["maximize"]:
                raise NotImplementedError("ServersRoundingSGD: plain SGD or momentum only")
            neg_lr = torch.tensor(-group["lr"], dtype=torch.float32)
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad
                if group["momentum"]:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = d.clone()
                    else:
                        state["momentum_buffer"].mul_(group["momentum"]).add_(d)
                    d = state["momentum_buffer"]
                p.copy_(p + d * neg_lr.to(d.device))
        return loss


def make_optimizer(case, params, servers_rounding=False):
    """The case's optimizer; with servers_rounding (the reference), SGD is
    ServersRoundingSGD with the same settings."""
    opt = CASES[case][2](params)
    if servers_rounding and type(opt) is torch.optim.SGD:
        d = opt.defaults
        opt = ServersRoundingSGD(params, lr=d["lr"], momentum=d["momentum"], dampening=d["dampening"],
                                 weight_decay=d["weight_decay"], nesterov=d["nesterov"])
    return opt


def _adam(params, lr=1e-3):
    # eps 1e-6: attention's key bias has a zero gradient, whose rounding noise
    # Adam with eps=1e-8 would blow up to lr/100 per step (in any two runs
    # whose weights differ in the last bit).
    return torch.optim.Adam(params, lr=lr, eps=1e-6)


# name: (build, loss, make optimizer, recipe)
CASES = {
    "transformer": (_transformer, _transformer_loss, lambda p: _adam(p, 1e-3), {}),
    "resnet18": (_resnet18, _image_loss, lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9), {}),
    "mobilenet_v3": (_mobilenet, _image_loss, lambda p: torch.optim.AdamW(p, lr=1e-4, eps=1e-6), {}),
    # Clipping and loss scaling use SGD: Adam's update hardly changes when a
    # whole gradient is scaled, so it would hide a clip or unscale not done.
    "gpt2": (_gpt2, _gpt2_loss, lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9), {"clip": 0.5}),
    "bert": (_bert, _bert_loss, lambda p: torch.optim.AdamW(p, lr=1e-2, eps=1e-6, weight_decay=0.01), {}),
    "lstm": (_LstmLm, _lstm_loss, lambda p: torch.optim.SGD(p, lr=1.0), {"clip": 0.1}),
    # The optimizer holds the frozen parameters too, as fine-tuning scripts
    # that pass model.parameters() do; torch skips them (no gradient).
    "frozen_backbone": (_frozen_backbone, _image_loss, lambda p: torch.optim.SGD(p, lr=0.1), {}),
    "horovod_idiom": (_LstmLm, _lstm_loss, lambda p: torch.optim.SGD(p, lr=1.0),
                      {"clip": 0.1, "horovod": True}),
    "functional": (_Functional, _functional_loss, lambda p: torch.optim.SGD(p, lr=0.1), {}),
    "small_cnn": (_SmallCnn, _small_image_loss, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), {}),
    "compiled": (_compiled, _small_image_loss, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), {}),
    "compiled_in_place": (_compiled_in_place, _small_image_loss,
                          lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), {}),
    # Refused (not in a group): nn.SyncBatchNorm.
    "sync_batchnorm": (lambda: nn.Sequential(nn.Conv2d(3, 8, 3), nn.SyncBatchNorm(8), nn.AdaptiveAvgPool2d(1),
                                             nn.Flatten(), nn.Linear(8, 10)),
                       _small_image_loss, lambda p: torch.optim.SGD(p, lr=0.1), {}),
    "amp": (_AmpEncoder, _amp_loss, lambda p: torch.optim.SGD(p, lr=0.1), {"amp": True, "clip": 1.0}),
    # GradScaler alone: scaler.step(opt) unscales (an in-place kernel that
    # bumps no version counter), or the user's unscale_ without a clip.
    "amp_plain": (_AmpEncoder, _amp_loss, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), {"amp": True}),
    "amp_unscale": (_AmpEncoder, _amp_loss, lambda p: torch.optim.SGD(p, lr=0.1), {"amp": True, "unscale": True}),
    # A scale of 1 at the first step (its unscale changes no bit), doubling
    # every good step: only knowing the scaler tells that edits are coming.
    "amp_growing": (_AmpEncoder, _amp_loss, lambda p: torch.optim.SGD(p, lr=0.1),
                    {"amp": {"init_scale": 1.0, "growth_interval": 1}}),
    # Other edits of .grad between backward() and step(): through .data
    # (no version bump, as DeepSpeed-style code does it) and clip_grad_value_.
    "data_edit": (_Functional, _functional_loss, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                  {"data_scale": 0.25}),
    "clip_value": (_Functional, _functional_loss, lambda p: torch.optim.SGD(p, lr=1.0), {"clip_value": 0.01}),
    "accumulation": (_EmbeddingTransformer, _embedding_transformer_loss, lambda p: _adam(p, 1e-3),
                     {"passes": 2}),
}


def build(case, seed):
    torch.manual_seed(seed)
    return CASES[case][0]().to(DEVICE)


def train_step(case, model, opt, scaler, step, ranks, after_backward=None, recipe=None, check_clip=True):
    """One step of the case's recipe (or `recipe`): backward over the batches
    of `ranks` (one rank in a worker), then `after_backward` (the reference
    averages there), then the recipe's unscale, clip and step. Returns the
    mean loss."""
    _, loss_fn, _, case_recipe = CASES[case]
    recipe = case_recipe if recipe is None else recipe
    losses = []
    passes = recipe.get("passes", 1)
    for rank in ranks:
        for k in range(passes):
            loss = loss_fn(model, step * passes + k, rank)
            losses.append(loss.item())
            (scaler.scale(loss) if scaler is not None else loss).backward()
        if after_backward is not None:
            after_backward(rank)
    if recipe.get("horovod") and hasattr(opt, "skip_synchronize"):
        opt.synchronize()  # Horovod's idiom: the gradients are final here
    params = [p for p in model.parameters() if p.grad is not None]
    if scaler is not None and ("clip" in recipe or recipe.get("unscale")):
        scaler.unscale_(opt)
    if "data_scale" in recipe:
        for p in params:
            p.grad.data.mul_(recipe["data_scale"])
    if "clip_value" in recipe:
        torch.nn.utils.clip_grad_value_(params, recipe["clip_value"])
    if "clip" in recipe:
        norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                              recipe["clip"])
        # The case must clip for the test to say something (an overflowed
        # step's norm is not finite).
        assert not check_clip or not torch.isfinite(norm) or norm > recipe["clip"], "norm %s does not clip" % norm
    with opt.skip_synchronize() if recipe.get("horovod") and hasattr(opt, "skip_synchronize") \
            else contextlib.nullcontext():
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
    opt.zero_grad()
    return sum(losses) / len(losses)


def make_scaler(case):
    """The case's GradScaler (recipe "amp": True, or its settings), or None."""
    amp = CASES[case][3].get("amp")
    if not amp:
        return None
    return torch.amp.GradScaler(DEVICE.type, **(amp if isinstance(amp, dict) else {"init_scale": 1024.0}))


def final_state(model, scaler):
    return {"state": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
            "scale": scaler.get_scale() if scaler is not None else None}


def reference(case, steps=STEPS, workers=2, device="cpu"):
    """One process on the mean gradient: each worker's forward and backward
    from the same weights and buffers, their gradients and floating-point
    buffers averaged, then the recipe."""
    global DEVICE
    DEVICE = torch.device(device)
    torch.set_num_threads(1)
    model = build(case, 0)
    opt = make_optimizer(case, list(model.parameters()), servers_rounding=True)
    scaler = make_scaler(case)
    params, buffers = list(model.parameters()), list(model.buffers())
    for step in range(steps):
        start = [b.clone() for b in buffers]
        grads, ends = [], []

        def after_backward(rank):
            grads.append([p.grad.clone() if p.grad is not None else None for p in params])
            ends.append([b.clone() for b in buffers])
            model.zero_grad()
            with torch.no_grad():
                for b, s in zip(buffers, start):
                    b.copy_(s)  # the next worker starts from the same buffers
                if rank != workers - 1:
                    return
                for i, p in enumerate(params):
                    if grads[0][i] is not None:
                        p.grad = sum(g[i] for g in grads) / workers
                for j, b in enumerate(buffers):
                    # Floating-point buffers: the mean; integer ones (BatchNorm's
                    # num_batches_tracked) count the same on every worker.
                    b.copy_(sum(e[j] for e in ends) / workers if b.is_floating_point() else ends[0][j])

        train_step(case, model, opt, scaler, step, range(workers), after_backward)
    return final_state(model, scaler)


def wait_for_file(path, timeout=60):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError("no %s after %d s" % (path, timeout))
        time.sleep(0.05)


def main():
    import psrt.torch as psrt

    p = argparse.ArgumentParser()
    p.add_argument("cases", nargs="+", choices=sorted(CASES))
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--out", required=True)
    p.add_argument("--clip-from", type=int, help="clip gradients from this step on only (a test of the error)")
    p.add_argument("--late-rank1", action="store_true",
                   help="async and ssp: rank 1 takes its first step after rank 0's and clips from its second only")
    p.add_argument("--unfreeze-at", type=int, help="unfreeze the backbone at this step (a test of the error)")
    p.add_argument("--mean-grads", choices=["auto", "always", "never"], default="auto")
    p.add_argument("--fixed-batch", action="store_true",
                   help="every step on the first step's batches (async and ssp: the model must learn them)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda: the models and batches on this rank's GPU")
    p.add_argument("--no-sync-buffers", action="store_true", help="each worker keeps its own buffers")
    args = p.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    torch.set_num_threads(1)
    psrt.init()
    rank = psrt.rank()
    results = {}
    for case in args.cases:
        model = build(case, rank)  # rank 0's initial values must win
        inner = CASES[case][2](list(model.parameters()))
        options = {} if args.mean_grads == "auto" else {"mean_grads": args.mean_grads == "always"}
        if args.no_sync_buffers:
            options["sync_buffers"] = False
        opt = psrt.DistributedOptimizer(inner, named_parameters=[(case + "/" + n, q)
                                                                 for n, q in model.named_parameters()],
                                        backward_passes_per_step=CASES[case][3].get("passes", 1),
                                        fusion_bytes=FUSION_BYTES, **options)
        scaler = make_scaler(case)
        first = opt.global_step  # > 0 in a restored job: it goes on from there
        for step in range(first, args.steps):
            recipe = dict(CASES[case][3])
            clip_from = args.clip_from
            if args.late_rank1:
                clip_from = step if rank == 0 else first + 1
                if rank == 1 and step == first:
                    wait_for_file(args.out + ".rank0-stepped")
            if clip_from is not None and step >= clip_from:
                recipe["clip"] = 1e-3
            if step == args.unfreeze_at:
                for q in model.parameters():
                    q.requires_grad_(True)
            loss = train_step(case, model, opt, scaler, 0 if args.fixed_batch else step, [rank], recipe=recipe,
                              check_clip=not args.fixed_batch)
            print("rank %d: %s step %d loss %.6f" % (rank, case, step, loss), flush=True)
            if args.late_rank1 and rank == 0 and step == first:
                open(args.out + ".rank0-stepped", "w").close()
        opt.synchronize()
        results[case] = final_state(model, scaler)
        print("rank %d: %s trained %d steps" % (rank, case, args.steps), flush=True)
        del opt
    torch.save(results, "%s.rank%d" % (args.out, rank))


if __name__ == "__main__":
    main()
