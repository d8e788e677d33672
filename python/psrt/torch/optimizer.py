"""DistributedOptimizer: a torch optimizer whose updates run on psrt's servers.

A thin wrapper in the manner of Horovod's: a hook per parameter queues its
gradient the moment autograd has accumulated it, and each bucket of
`fusion_bytes` goes to the servers at once (overlapping communication with
the rest of the backward pass), asking for the updated weights back.
``step()`` does not wait for them: each module waits for its own
parameters' new weights just before its forward pass of the next step
(BytePS's cross-barrier), so the pulls of late layers hide behind the
compute of early ones. Everything else (partitioning, compression,
consistency, retries) happens once, in C++, behind the C API.
"""

import weakref

import torch
from torch.nn.modules import module as _module

import psrt
from psrt.torch import embedding

_SUPPORTED = {
    torch.optim.SGD: "sgd",
    torch.optim.Adam: "adam",
    torch.optim.AdamW: "adamw",
    torch.optim.Adagrad: "adagrad",
}


def _server_optimizer(optimizer, group):
    """The server-side settings for one param group, or a clear refusal."""
    kind = _SUPPORTED.get(type(optimizer))
    if kind is None:
        raise psrt.PsrtError(
            "psrt.DistributedOptimizer: %s cannot run on the parameter servers; "
            "use torch.optim.SGD, Adam, AdamW or Adagrad" % type(optimizer).__name__)
    for flag in ("maximize", "amsgrad", "differentiable"):
        if group.get(flag):
            raise psrt.PsrtError("psrt.DistributedOptimizer: %s with %s=True is not supported "
                                 "on the parameter servers" % (type(optimizer).__name__, flag))
    cfg = {"name": kind, "lr": float(group["lr"]),
           "weight_decay": float(group.get("weight_decay", 0.0))}
    if kind == "sgd":
        cfg.update(momentum=float(group.get("momentum", 0.0)),
                   dampening=float(group.get("dampening", 0.0)),
                   nesterov=bool(group.get("nesterov", False)))
    elif kind in ("adam", "adamw"):
        beta1, beta2 = group["betas"]
        cfg.update(beta1=float(beta1), beta2=float(beta2), eps=float(group["eps"]))
    else:
        cfg.update(lr_decay=float(group.get("lr_decay", 0.0)), eps=float(group["eps"]),
                   initial_accumulator_value=float(group.get("initial_accumulator_value", 0.0)))
    return cfg


class _Variable:
    """One parameter as the servers know it."""

    def __init__(self, name, param, group):
        self.name = name
        self.param = param
        self.group = group
        # Pulled weights land here, on the parameter's device; step() copies
        # them into the parameter (autograd may still read it until then).
        self.pulled = torch.empty_like(param.detach(), memory_format=torch.contiguous_format)
        self.grad = None      # what is being pushed: kept alive until the wait
        self.queued = False   # pushed (or in the bucket) this step
        self.passes = 0       # backward passes accumulated since the last push
        self.lr = float(group["lr"])
        self.inflight = None  # the push-pull whose weights it waits for


class _InFlight:
    """One bucket's push-pull, waited for once by whichever parameter of it
    is needed first."""

    def __init__(self, client, handle):
        self._client, self._handle = client, handle
        self._done, self._error = False, None

    def wait(self):
        if not self._done:
            self._done = True
            try:
                self._client.wait(self._handle)
            except psrt.PsrtError as e:
                self._error = e
        if self._error is not None:
            raise self._error


class DistributedOptimizer(torch.optim.Optimizer):
    """Runs `optimizer`'s updates on the parameter servers.

    After ``step()`` the parameters receive their new weights as the next
    forward pass reaches them (a module's forward pre-hook), or at
    ``synchronize()``, the next ``step()``, or a ``state_dict()`` of a module
    that has run forward. Read parameters outside a forward pass only after
    ``synchronize()``.

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
    """

    def __init__(self, optimizer, named_parameters, compression=psrt.Compression.job_default,
                 backward_passes_per_step=1, fusion_bytes=4 << 20, on_workers_change=None):
        if backward_passes_per_step < 1:
            raise psrt.PsrtError("psrt.DistributedOptimizer: backward_passes_per_step must be >= 1")
        self._passes = backward_passes_per_step
        self._fusion_bytes = fusion_bytes
        self._bucket, self._bucket_bytes = [], 0
        self._landing = 0      # parameters still waiting for their new weights
        self._watched = set()  # modules whose state_dict() synchronizes first
        client = psrt.client()
        named = list(named_parameters)
        names = [n for n, _ in named]
        if len(set(names)) != len(names):
            raise psrt.PsrtError("psrt.DistributedOptimizer: named_parameters repeats a name")
        by_param = {id(p): n for n, p in named}
        if len(by_param) != len(named):
            raise psrt.PsrtError("psrt.DistributedOptimizer: a parameter appears twice in named_parameters")
        self._optimizer = optimizer
        self._client = client
        self._on_workers_change = on_workers_change
        self._workers = client.active_workers()
        self._compression = compression
        self._variables = []
        seen = set()
        for group in optimizer.param_groups:
            server_cfg = _server_optimizer(optimizer, group)
            for p in group["params"]:
                name = by_param.get(id(p))
                if name is None:
                    raise psrt.PsrtError(
                        "psrt.DistributedOptimizer: the optimizer holds a parameter (shape %s) "
                        "that is not in named_parameters; pass the model's named_parameters()"
                        % list(p.shape))
                if p.dtype != torch.float32:
                    raise psrt.PsrtError("psrt.DistributedOptimizer: parameter '%s' is %s; psrt "
                                         "trains float32 parameters" % (name, p.dtype))
                seen.add(id(p))
                self._variables.append(_Variable(name, p, group))
                self._register(self._variables[-1], server_cfg)
        missing = [n for n, p in named if id(p) not in seen and p.requires_grad]
        if missing:
            raise psrt.PsrtError("psrt.DistributedOptimizer: parameters %s are in named_parameters "
                                 "but not in the optimizer" % missing)
        sync = client.is_sync()
        # The step to push next: the servers' version in sync mode (a restored
        # job resumes there), this worker's clock otherwise.
        self._step = self._servers_version() if sync and self._variables else client.restored_step()
        self._pushing = False
        self._by_param = {id(v.param): v for v in self._variables}
        for v in self._variables:
            v.param.register_post_accumulate_grad_hook(self._make_hook(v))
        # Every module's forward passes here first (a global hook, through a
        # weak reference: it does nothing once this optimizer is gone).
        me = weakref.ref(self)

        def before_forward(module, args):
            if me() is not None:
                me()._before_forward(module)

        self._forward_hook = _module.register_module_forward_pre_hook(before_forward)
        # torch.optim.Optimizer's bookkeeping, over the same groups.
        self.defaults = optimizer.defaults
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state

    # --- setup -------------------------------------------------------------

    def _register(self, v, server_cfg):
        """Registers the parameter; afterwards it holds rank 0's values (or the
        restored checkpoint's)."""
        host = v.param.detach().to("cpu", copy=True).contiguous()
        self._client.register_variable(v.name, list(host.shape), host.data_ptr(), server_cfg,
                                       self._compression.value, self._compression.value)
        with torch.no_grad():
            v.param.copy_(host)

    def _make_hook(self, v):
        def hook(param):
            v.passes += 1
            if v.passes > self._passes:
                raise psrt.PsrtError(
                    "psrt.DistributedOptimizer: more backward passes than backward_passes_per_step=%d "
                    "before step() (parameter '%s')" % (self._passes, v.name))
            if v.passes == self._passes:
                self._push(v)
        return hook

    # --- the training step ---------------------------------------------------

    def _sync_learning_rates(self):
        """Schedulers change group['lr']; the servers follow before the next push."""
        for v in self._variables:
            lr = float(v.group["lr"])
            if lr != v.lr:
                self._client.set_learning_rate(lr, v.name)
                v.lr = lr

    def _push(self, v):
        """Queues the parameter's gradient; a bucket of fusion_bytes goes out
        as one push-pull (one request per server for all its tensors)."""
        if not self._pushing:  # the first push of a step
            self.synchronize()  # the step it is for is known once all landed
            workers = self._client.active_workers()
            if workers != self._workers and self._on_workers_change is not None:
                self._on_workers_change(self._workers, workers)
            self._workers = workers
            self._sync_learning_rates()
            self._pushing = True
        g = v.param.grad
        v.grad = (g if g is not None else torch.zeros_like(v.param)).detach().contiguous()
        v.queued = True
        self._bucket.append(v)
        self._bucket_bytes += v.grad.numel() * 4
        if self._bucket_bytes >= self._fusion_bytes:
            self._flush()

    def _flush(self):
        if not self._bucket:
            return
        handle = self._client.push_pull([v.name for v in self._bucket],
                                        [v.grad.data_ptr() for v in self._bucket],
                                        [v.pulled.data_ptr() for v in self._bucket], self._step)
        inflight = _InFlight(self._client, handle)
        for v in self._bucket:
            v.inflight = inflight
        self._landing += len(self._bucket)
        self._bucket, self._bucket_bytes = [], 0

    def _servers_version(self):
        """The least version pulled over the parameters. A worker that joins
        a running job pulls while the others are inside a step, when some
        keys are a version ahead: it pushes for the least one (the servers
        drop that push where the step is done), never for a version a key
        has not reached, which they refuse."""
        return min(self._client.pulled_version(v.name) for v in self._variables)

    @torch.no_grad()
    def _land(self, v):
        """Waits for the parameter's new weights and writes them into it."""
        inflight, v.inflight = v.inflight, None
        self._landing -= 1
        try:
            inflight.wait()
            v.param.copy_(v.pulled)
        finally:
            v.grad = None  # the push has ended: its buffer may go
            if self._landing == 0:
                # Every key of the step has come back: the step to push next
                # is the servers' version (sync), or this worker's clock.
                self._step = self._servers_version() if self._client.is_sync() else self._step + 1

    def _before_forward(self, module):
        """A module's forward waits for its own parameters' new weights."""
        if self._landing > 0:
            for p in module._parameters.values():
                v = self._by_param.get(id(p)) if p is not None else None
                if v is not None and v.inflight is not None:
                    self._land(v)
        if id(module) not in self._watched:
            self._watched.add(id(module))
            me = weakref.ref(self)

            def before_state_dict(*_):
                if me() is not None:
                    me().synchronize()

            module.register_state_dict_pre_hook(before_state_dict)

    def synchronize(self):
        """Waits for every parameter's new weights from the last step()."""
        for v in self._variables:
            if v.inflight is not None:
                self._land(v)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        # A parameter whose gradient never came (unused this step) pushes
        # zeros: in sync mode every key advances every step.
        for v in self._variables:
            if not v.queued:
                self._push(v)
        self._flush()
        embedding.push_tables()  # psrt.torch.Embedding's rows, once per step
        for v in self._variables:
            v.queued = False
            v.passes = 0
        self._pushing = False
        return loss

    def zero_grad(self, set_to_none=True):
        self._optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def global_step(self):
        """The step the next push is for (sync: the servers' version)."""
        self.synchronize()
        return self._step

    # --- state: it lives on the servers ------------------------------------

    def state_dict(self):
        """Hyperparameters only. The optimizer's state (momentum, Adam's
        moments) and the weights live on the parameter servers: psrt's own
        checkpoints (the ``checkpoint`` and ``restore`` settings) save and
        restore them."""
        self.synchronize()
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self._optimizer.param_groups]
        return {"psrt": {"state": "on the parameter servers; saved by psrt checkpoints",
                         "step": self._step},
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
        self._sync_learning_rates()

    def __repr__(self):
        return "psrt.DistributedOptimizer(%r)" % (self._optimizer,)
