"""DistributedOptimizer: a torch optimizer whose updates run on psrt's servers.

A thin wrapper in the manner of Horovod's: a hook per parameter queues its
gradient the moment autograd has accumulated it, and each bucket of
`fusion_bytes` goes to the servers at once (overlapping communication with
the rest of the backward pass), asking for the updated weights back.
``step()`` does not wait for them: each module waits for its own
parameters' new weights just before its forward pass of the next step
(BytePS's cross-barrier), so the pulls of late layers hide behind the
compute of early ones. A parameter that is read before its module's forward
(a parent's functional call, as ``nn.MultiheadAttention`` does with
``out_proj``; a shared or tied weight) lands at its first use instead: while
weights are still arriving, each module call runs under a torch function
mode that lands any parameter an operation is about to read.

When the user edits gradients between ``backward()`` and ``step()``
(``clip_grad_norm_``, ``GradScaler``), the gradients stay until ``step()``
and, in sync mode, the end of ``backward()`` writes the mean over workers
into ``.grad`` first (as DDP does), so every edit sees what one process on the
mean gradient sees (``mean_grads``). Buffers (BatchNorm's
running statistics) are averaged over workers at every step.

This module is torch's glue; each concern is a helper of its own:
_registration.py (the tensors on the servers), _fusion.py (the buckets
pushed and the step they are for), _landing.py (the new weights written in
as they are needed), _mean_grads.py (gradients held for step() and their
mean), _grad_scaler.py (GradScaler's hand-off) and _learning_rates.py.
Everything else (partitioning, compression, consistency, retries) happens
once, in C++, behind the C API.
"""

import contextlib

import torch

import psrt
from psrt.torch import _grad_scaler, _placement, embedding
from psrt.torch._fusion import _Fusion
from psrt.torch._landing import _Landing
from psrt.torch._learning_rates import _LearningRates
from psrt.torch._mean_grads import _MeanGrads
from psrt.torch._registration import _Registry, names_by_parameter

# The servers' settings for a param group, still importable from here, where
# the tests read them.
_server_optimizer = _placement._server_optimizer


class DistributedOptimizer(torch.optim.Optimizer):
    """Runs `optimizer`'s updates on the parameter servers, or on every
    worker on the mean gradient where the servers cannot run it
    (``optimizer_on``; worker_optimizer.py).

    After ``step()`` the parameters receive their new weights as the next
    forward pass reaches them (a module's forward pre-hook, or the first
    operation that reads them), or at ``synchronize()``, the next ``step()``,
    or a ``state_dict()`` of a module that has run forward. Read parameters
    outside a forward pass only after ``synchronize()``.

    Parameters with ``requires_grad=False`` (frozen layers) take rank 0's
    values and are never pushed. A parameter that has no gradient in a step
    says so: where no worker had one, the servers leave its weights and
    optimizer state alone, as torch's optimizer skips it.

    Args:
      optimizer: a torch.optim.SGD, Adam, AdamW or Adagrad over the model's
        parameters (param groups allowed).
      named_parameters: the model's ``named_parameters()``; the names key the
        variables on the servers, so every worker must use the same.
      compression: ``psrt.Compression.fp16`` or ``bf16`` halves the bytes of
        gradients and weights on the wire; the servers keep float32.
        ``job_default`` (the default) takes the job's ``compression``.
      backward_passes_per_step: gradients accumulate locally over this many
        backward passes before they are pushed (as in Horovod).
      fusion_bytes: gradients ready during the backward pass go out together
        once this many bytes are queued (the rest at step()), so small
        tensors share requests (Horovod's tensor fusion, DDP's buckets).
      on_workers_change: elastic jobs (and workers that leave): called as
        ``on_workers_change(old, new)`` before the first push of a step when
        the number of workers taking part changed; it may set the param
        groups' ``lr`` (say, scaled by new / old with the global batch), which
        the servers then use. Without it the learning rate stays.
      mean_grads: whether gradients wait for ``step()`` so that code between
        ``backward()`` and ``step()`` may change them (``clip_grad_norm_``,
        ``clip_grad_value_``, ``GradScaler``). Then, in sync mode, the end of
        ``backward()`` writes the mean gradient over workers into ``.grad``
        (one more round trip), as DDP does, and ``step()`` sends what
        ``.grad`` holds; in async and ssp modes each worker's own edited
        gradient goes out at ``step()``. ``None`` (the default) does this at
        the first step and keeps doing it only if that step's gradients were
        changed (in async and ssp modes: if any worker's first step changed
        them); ``True`` always (edits that start later, or happen on some
        steps only); ``False`` never. Without it a gradient changed after it
        was sent is an error at ``step()``.
      sync_buffers: the model's float32 and int64 buffers (BatchNorm's
        running mean and variance, and its num_batches_tracked, which is the
        same on every worker) are averaged over workers at every step (in
        async and ssp modes the latest worker's are taken) and checkpointed.
        ``False`` keeps each worker's own.
      optimizer_on: ``"servers"``: the servers run the optimizer (SGD, Adam,
        AdamW, Adagrad over float32 parameters; others are refused).
        ``"workers"`` (sync jobs): the servers return the step's mean
        gradient into ``.grad`` at the end of ``backward()`` and every worker
        runs `optimizer` itself, any torch optimizer over float32, float16 or
        bfloat16 parameters, closures (LBFGS) included; the weights and the
        optimizer's state live on the workers. ``"auto"`` (the default): the
        servers where they can, else (sync) the workers.
      check_every: with the optimizer on the workers, they check that they
        still hold the same weights at the first step and every this many
        steps; a worker that differs is an error naming it.
    """

    # torch.amp.GradScaler.step(opt) then hands step() its scale and found-inf
    # flag (opt.grad_scale, opt.found_inf) instead of unscaling .grad itself:
    # its in-place unscale bumps no version counter, so step() could not tell
    # otherwise that a scaler is at work. step() unscales, or skips the step.
    _step_supports_amp_scaling = True

    def __new__(cls, optimizer, *args, optimizer_on="auto", **kwargs):
        if cls is DistributedOptimizer and _placement._on_workers(optimizer, optimizer_on):
            from psrt.torch.worker_optimizer import WorkerOptimizer
            return object.__new__(WorkerOptimizer)  # whose __init__ Python calls next
        return object.__new__(cls)

    def __init__(self, optimizer, named_parameters, compression=psrt.Compression.job_default,
                 backward_passes_per_step=1, fusion_bytes=4 << 20, on_workers_change=None,
                 mean_grads=None, sync_buffers=True, optimizer_on="auto", check_every=None):
        if backward_passes_per_step < 1:
            raise psrt.PsrtError("psrt.DistributedOptimizer: backward_passes_per_step must be >= 1")
        if mean_grads not in (None, True, False):
            raise psrt.PsrtError("psrt.DistributedOptimizer: mean_grads is None, True or False")
        self._passes = backward_passes_per_step
        client = psrt.client()
        if client.is_sync() and not client.averages():
            # The mean-gradient round trip, the buffers' averages and the
            # first step's decision all take the servers' aggregate to be the
            # mean; on the sum they would train neither as one process on the
            # mean nor on the sum.
            raise psrt.PsrtError(
                "psrt.DistributedOptimizer: the job's gradient_aggregation is \"sum\"; PyTorch's "
                "optimizer trains on the mean of the workers' gradients, as DDP does. Leave "
                "gradient_aggregation out (\"mean\"), and scale the learning rate for a sum")
        named = list(named_parameters)
        by_param = names_by_parameter(named)
        self._optimizer = optimizer
        self._registry = _Registry(client, compression)
        self._rates = _LearningRates(client, self._registry, on_workers_change)
        self._registry.add_parameters(optimizer, named, by_param)
        self._mean = _MeanGrads(client, self._registry, mean_grads, compression)
        self._fusion = _Fusion(client, self._registry, fusion_bytes, client.is_sync())
        self._pushing = False  # the step's first push happened
        for v in self._registry.variables:
            v.param.register_post_accumulate_grad_hook(self._make_hook(v))
        self._landing = _Landing(self._registry, self._fusion, sync_buffers)
        self._forward_hooks = self._landing.hook_forwards()
        # torch.optim.Optimizer's bookkeeping, over the same groups.
        self.defaults = optimizer.defaults
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state

    def _make_hook(self, v):
        def hook(param):
            v.passes += 1
            if v.passes > self._passes:
                raise psrt.PsrtError(
                    "psrt.DistributedOptimizer: more backward passes than backward_passes_per_step=%d "
                    "before step() (parameter '%s')" % (self._passes, v.name))
            if v.passes < self._passes:
                return
            if not self._mean.hold:
                self._push(v)
            else:
                self._mean.queue_end_of_backward()
        return hook

    # --- the training step ---------------------------------------------------

    def _push(self, v):
        if not self._pushing:  # the first push of a step
            self.synchronize()  # the step it is for is known once all landed
            self._rates.before_first_push()
            self._pushing = True
        self._fusion.add(v)

    def synchronize(self):
        """Waits for every parameter's new weights from the last step().
        Between backward() and step() (Horovod's idiom, before clipping) the
        gradients in .grad are already the ones step() sends: with
        mean_grads, the mean over workers."""
        self._landing.synchronize()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Horovod's idiom (``with opt.skip_synchronize(): opt.step()`` after
        ``synchronize()``): psrt's step() never sends a gradient twice, so
        this changes nothing."""
        yield

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        # A scheduler made on the wrapped optimizer (Lightning's) looks for
        # its step() as torch's own schedulers mark it; the servers step.
        self._optimizer._opt_called = True
        self._registry.check_requires_grad()
        scale, found_inf = _grad_scaler.scale_and_found_inf(self)
        _grad_scaler.refuse_unreachable(scale, found_inf, self._mean.hold)
        self._mean.at_step(found_inf)
        self._landing.end_learning()
        if found_inf:
            # GradScaler skips the update. In sync mode every worker does:
            # each found the Inf in the same mean gradient. No key advances;
            # buffers are averaged as at every step.
            self._push_buffers()
            embedding.skip_tables()
            self._end_step()
            return loss
        variables = self._registry.variables
        inv_scale = _grad_scaler.unscale(variables, scale) if scale is not None else None
        # A parameter whose gradient never came (unused this step) says so:
        # in sync mode every key advances every step, and the servers leave
        # one that no worker had a gradient for alone.
        for v in variables:
            if not v.queued:
                self._push(v)
        self._fusion.flush()
        self._push_buffers()
        embedding.push_tables(inv_scale)  # psrt.torch.Embedding's rows, once per step
        self._end_step()
        # Tensors no module's forward reads would be read before they land.
        self._landing.land_unread()
        return loss

    def _push_buffers(self):
        """The buffers' averages from the last step land before their values
        go out again."""
        for v in self._registry.buffers:
            if v.inflight is not None:
                self._landing.land(v)
        self._fusion.push_buffers()

    def _end_step(self):
        for v in self._registry.variables:
            v.queued = False
            v.passes = 0
            v.sent = None
        self._pushing = False

    def zero_grad(self, set_to_none=True):
        self._optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def global_step(self):
        """The step the next push is for (sync: the servers' version)."""
        self.synchronize()
        return self._fusion.step

    # --- state: it lives on the servers ------------------------------------

    def state_dict(self):
        """Hyperparameters only. The optimizer's state (momentum, Adam's
        moments) and the weights live on the parameter servers: psrt's own
        checkpoints (the ``checkpoint`` and ``restore`` settings) save and
        restore them."""
        self.synchronize()
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self._optimizer.param_groups]
        return {"psrt": {"state": "on the parameter servers; saved by psrt checkpoints",
                         "step": self._fusion.step},
                "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Takes hyperparameters (e.g. a changed learning rate) from what
        state_dict() gave; refuses per-parameter state from a local torch
        optimizer, which the servers cannot take (restore a psrt checkpoint)."""
        if state_dict.get("state"):
            raise psrt.PsrtError(
                "psrt.DistributedOptimizer.load_state_dict: this holds per-parameter optimizer "
                "state from a local torch optimizer; on psrt it lives on the parameter servers. "
                "Restore a psrt checkpoint (the 'restore' setting) instead")
        groups = state_dict.get("param_groups", [])
        if len(groups) != len(self._optimizer.param_groups):
            raise psrt.PsrtError("psrt.DistributedOptimizer.load_state_dict: %d param groups given, "
                                 "the optimizer has %d" % (len(groups), len(self._optimizer.param_groups)))
        for mine, theirs in zip(self._optimizer.param_groups, groups):
            for k, value in theirs.items():
                if k != "params":
                    mine[k] = value
        self._rates.sync()

    def __repr__(self):
        return "psrt.DistributedOptimizer(%r)" % (self._optimizer,)
