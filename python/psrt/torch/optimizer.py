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

Everything else (partitioning, compression, consistency, retries) happens
once, in C++, behind the C API.
"""

import contextlib
import weakref

import torch
from torch.nn.modules import module as _module

import psrt
from psrt import _host
from psrt.torch import _buffers, embedding
from psrt.torch._landing import _InFlight, _is_compiled_wrapper, _LandOnUse, _traced_hook_calls, _Variable
from psrt.torch._placement import _on_workers, _server_optimizer


def _address(tensor):
    """A tensor's address for the C API; 0 (no gradient) for None."""
    return tensor.data_ptr() if tensor is not None else 0


def _frozen_error(name, now):
    return psrt.PsrtError(
        "psrt.DistributedOptimizer: parameter '%s' %s since the optimizer was made; the servers "
        "train the parameters that required grad then. Make a new DistributedOptimizer after "
        "freezing or unfreezing layers" % (name, now))


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
        if cls is DistributedOptimizer and _on_workers(optimizer, optimizer_on):
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
        self._fusion_bytes = fusion_bytes
        self._bucket, self._bucket_bytes = [], 0
        self._landing = 0      # tensors still waiting for their new values
        self._watched = set()  # modules whose state_dict() synchronizes first
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
        names = [n for n, _ in named]
        if len(set(names)) != len(names):
            raise psrt.PsrtError("psrt.DistributedOptimizer: named_parameters repeats a name")
        by_param = {id(p): n for n, p in named}
        if len(by_param) != len(named):
            raise psrt.PsrtError("psrt.DistributedOptimizer: a parameter appears twice in named_parameters")
        self._optimizer = optimizer
        self._client = client
        self._sync = client.is_sync()
        self._on_workers_change = on_workers_change
        self._workers = client.active_workers()
        self._compression = compression
        self._variables = []   # trainable: hooked and pushed
        self._frozen = []      # requires_grad=False: rank 0's values, never pushed
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
                    raise psrt.PsrtError("psrt.DistributedOptimizer: parameter '%s' is %s; the servers "
                                         "train float32 parameters (sync jobs run the optimizer on the "
                                         "workers for others: optimizer_on=\"workers\")" % (name, p.dtype))
                seen.add(id(p))
                if p.requires_grad:
                    self._variables.append(_Variable(name, p, group))
                    self._register(self._variables[-1], server_cfg)
        missing = [n for n, p in named if id(p) not in seen and p.requires_grad]
        if missing:
            raise psrt.PsrtError("psrt.DistributedOptimizer: parameters %s are in named_parameters "
                                 "but not in the optimizer" % missing)
        # Frozen parameters, in the optimizer or not, start from rank 0's
        # values like the rest (a frozen layer of a randomly initialised model
        # would otherwise differ between workers).
        for n, p in named:
            if not p.requires_grad and p.dtype.is_floating_point:
                self._frozen.append(_Variable(n, p))
                self._register(self._frozen[-1], {"name": "assign"}, psrt.Compression.none)
        # Gradients wait for step() (see mean_grads): always, never, or at the
        # first step, which decides (None until then; see _hold).
        self._mean_grads = mean_grads
        self._decision = None  # mean_grads=None: where the workers agree on it
        if mean_grads is None and self._variables:
            self._join_decision()
        self._exchange_queued = False
        # Buffers are found at the first forward of a module holding these
        # parameters (named_parameters does not name them).
        self._sync_buffers = sync_buffers
        self._buffers = []
        self._model_seen = False  # a module holding these parameters ran forward outside compiled code
        # Until the first step(), every module call runs under _LandOnUse to
        # learn which tensors are read inside some module's forward; the
        # others (a functional model, a forward called directly, a model
        # compiled in place) are landed by step() itself.
        self._learning = True
        self._seen = set()
        self._land_at_step = []
        # The step to push next: the servers' version in sync mode (a restored
        # job resumes there), this worker's clock otherwise.
        self._step = self._servers_version() if self._sync and self._variables else client.restored_step()
        self._pushing = False
        self._by_param = {id(v.param): v for v in self._variables}
        for v in self._variables:
            v.param.register_post_accumulate_grad_hook(self._make_hook(v))
        # Every module's forward passes here first and last (global hooks,
        # through a weak reference: they do nothing once this optimizer is
        # gone). While values are arriving, the outermost module call runs
        # under _LandOnUse.
        me = weakref.ref(self)
        self._land_on_use = _LandOnUse(self)
        self._mode_depth = 0

        def before_forward(module, args):
            if torch.compiler.is_compiling():
                _traced_hook_calls["n"] += 1
            elif me() is not None:
                me()._before_forward(module)

        def after_forward(module, args, output):
            if me() is not None and not torch.compiler.is_compiling():
                me()._after_forward()

        self._forward_hooks = [_module.register_module_forward_pre_hook(before_forward),
                               _module.register_module_forward_hook(after_forward, always_call=True)]
        # torch.optim.Optimizer's bookkeeping, over the same groups.
        self.defaults = optimizer.defaults
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state

    # --- setup -------------------------------------------------------------

    def _register(self, v, server_cfg, compression=None):
        self._register_tensor(v.name, v.param, server_cfg, compression)

    def _register_tensor(self, name, tensor, server_cfg, compression=None):
        """Registers the tensor; afterwards it holds rank 0's values (or the
        restored checkpoint's, or the servers' when the key exists)."""
        compression = self._compression if compression is None else compression
        host = tensor.detach().to("cpu", torch.float32, copy=True).contiguous()
        self._client.register_variable(name, list(host.shape), host.data_ptr(), server_cfg,
                                       compression.value, compression.value)
        with torch.no_grad():
            tensor.copy_(host)

    def _register_buffers(self, module):
        """Registers the float32 and int64 buffers under a module seen for the
        first time that holds these parameters, named as in the state_dict()
        of the module named_parameters came from (every worker builds the
        same model, so the names agree)."""
        # Integer buffers (num_batches_tracked) travel as float32, exact
        # below 2^24, so checkpoints hold them too. Those registered already
        # (under a module seen before) are left out.
        known = {id(v.param): v.name for v in self._variables + self._frozen + self._buffers}
        buffers = _buffers.named_buffers(module, known, lambda b: b.dtype in (torch.float32, torch.int64))
        if buffers is None:
            return
        self._model_seen = True
        for n, b in buffers:
            v = _Variable("buffer:" + n, b)
            self._register(v, {"name": "assign"}, psrt.Compression.none)
            # Async and ssp: this worker's clock on it (the key's version
            # counts every worker's pushes, some made already).
            v.step = self._client.next_step(v.name)
            v.scratch = torch.empty_like(v.pulled)
            self._buffers.append(v)
            self._by_param[id(b)] = v

    def _join_decision(self):
        """The first step's decision lives on the servers (an assign key: in
        sync mode the mean of the workers' "changed" flags), so every worker
        holds gradients or none does; a worker that joins later takes it."""
        self._decision = _Variable(self._variables[0].name + "@mean_grads", torch.zeros(1))
        self._register(self._decision, {"name": "assign"}, psrt.Compression.none)
        if self._client.pulled_version(self._decision.name) > 0:
            self._mean_grads = bool(self._decision.param.item() > 0)

    def _decide(self, edited):
        """The first step: gradients keep waiting for step() only if some
        worker changed them."""
        if self._decision is not None:
            v = self._decision
            if self._sync or edited:
                v.param.fill_(1.0 if edited else 0.0)
                self._client.wait(self._client.push_pull([v.name], [v.param.data_ptr()], [v.pulled.data_ptr()],
                                                         self._client.pulled_version(v.name)))
            else:
                # Async and ssp: a worker's first step may come after others'
                # updates, at weights where its clipping happens not to bite;
                # it takes their "changed" and never overwrites it with its own.
                self._client.wait(self._client.pull([v.name], [v.pulled.data_ptr()], 0))
            edited = bool(v.pulled.item() > 0)
        self._mean_grads = edited

    @property
    def _hold(self):
        """Gradients wait for step(): with mean_grads, and at the first step
        while it is undecided."""
        return self._mean_grads is not False

    def _make_hook(self, v):
        def hook(param):
            v.passes += 1
            if v.passes > self._passes:
                raise psrt.PsrtError(
                    "psrt.DistributedOptimizer: more backward passes than backward_passes_per_step=%d "
                    "before step() (parameter '%s')" % (self._passes, v.name))
            if v.passes < self._passes:
                return
            if not self._hold:
                self._push(v)
            elif not self._exchange_queued:
                # Sync: the mean gradient is in .grad when backward() returns.
                self._exchange_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        return hook

    # --- the training step ---------------------------------------------------

    def _sync_learning_rates(self):
        """Schedulers change group['lr']; the servers follow before the next
        push (the client sends only the rates that changed)."""
        for v in self._variables:
            self._client.set_learning_rate(float(v.group["lr"]), v.name)

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
        v.sent = (g, g._version, None) if g is not None else None
        # No gradient (unused this step) goes out as such: the servers leave
        # a parameter no worker had one for alone, as torch's optimizer does.
        v.grad = g.detach().contiguous() if g is not None else None
        v.queued = True
        self._bucket.append(v)
        self._bucket_bytes += v.param.numel() * 4
        if self._bucket_bytes >= self._fusion_bytes:
            self._flush()

    def _flush(self, step=None):
        if not self._bucket:
            return
        handle = self._client.push_pull([v.name for v in self._bucket],
                                        [_address(v.grad) for v in self._bucket],
                                        [v.pulled.data_ptr() for v in self._bucket],
                                        self._step if step is None else step)
        inflight = _InFlight(self._client, handle)
        for v in self._bucket:
            v.inflight = inflight
        self._landing += len(self._bucket)
        self._bucket, self._bucket_bytes = [], 0

    @torch.no_grad()
    def _end_of_backward(self):
        """Gradients held for step(): in sync mode every worker's go to the
        servers' mean-gradient keys ("assign") and the mean comes back into
        .grad, the same bits on every worker. Then .grad is noted, so step()
        sees whether the user changed it: by its version and, while the
        first step decides, by its bits too (edits through ``.data``, a numpy
        view or some kernels bump no version)."""
        self._exchange_queued = False
        if self._sync:
            self._exchange_mean_grads()
        deciding = self._mean_grads is None
        for v in self._variables:
            g = v.param.grad
            v.sent = (g, g._version, g.clone() if deciding else None) if g is not None else None
            v.passes = 0

    def _exchange_mean_grads(self):
        """Each .grad becomes the mean over workers, a worker without one
        counting as zeros (as under DDP); a parameter no worker had a
        gradient for keeps .grad None, as in one process (psrt_allreduce)."""
        if not self._variables:
            return
        for v in self._variables:
            if v.scratch is None:
                v.scratch = torch.empty_like(v.pulled)
        grads = [v.param.grad.detach().contiguous() if v.param.grad is not None else None
                 for v in self._variables]
        given, _ = self._client.allreduce([v.name for v in self._variables],
                                          [v.scratch.numel() for v in self._variables],
                                          [_address(g) for g in grads],
                                          [v.scratch.data_ptr() for v in self._variables],
                                          _host.MEAN, self._compression.value)
        for v, anyone in zip(self._variables, given):
            if not anyone:
                v.param.grad = None
            elif v.param.grad is None:
                v.param.grad = v.scratch.clone()
            else:
                v.param.grad.copy_(v.scratch)

    def _edited(self):
        """The first parameter whose .grad changed since it was sent (or,
        with mean_grads, since the mean was written), or None."""
        for v in self._variables:
            if v.sent is not None:
                g, version, bits = v.sent
                if v.param.grad is not g or g._version != version or (
                        bits is not None and not torch.equal(g.view(torch.int32), bits.view(torch.int32))):
                    return v
        return None

    def _grad_scaler(self):
        """(scale, found_inf) when torch.amp.GradScaler.step() called step():
        scale is None where scaler.unscale_(opt) ran already; found_inf says
        whether the (unscaled) gradients hold Inf or NaN. (None, None) without
        a scaler."""
        found_inf = getattr(self, "found_inf", None)
        if found_inf is None:
            return None, None
        return getattr(self, "grad_scale", None), bool(found_inf.item())

    def _unscale(self, scale):
        """Divides the gradients by the loss scale as GradScaler.unscale_ does
        (its kernel, its float64 reciprocal), so the bits are one process's.
        Returns the reciprocal, for the tables' rows."""
        inv_scale = scale.double().reciprocal().float()
        by_device = {}
        for v in self._variables:
            if v.param.grad is not None:
                by_device.setdefault(v.param.grad.device, []).append(v.param.grad)
        for device, grads in by_device.items():
            torch._amp_foreach_non_finite_check_and_unscale_(grads, torch.zeros((), device=device),
                                                             inv_scale.to(device))
        return inv_scale

    def _servers_version(self):
        """The least version pulled over the parameters. A worker that joins
        a running job pulls while the others are inside a step, when some
        keys are a version ahead: it pushes for the least one (the servers
        drop that push where the step is done), never for a version a key
        has not reached, which they refuse."""
        return min(self._client.pulled_version(v.name) for v in self._variables)

    @torch.no_grad()
    def _land(self, v):
        """Waits for the tensor's new values and writes them into it."""
        inflight, v.inflight = v.inflight, None
        self._landing -= 1
        try:
            inflight.wait()
            v.param.copy_(v.pulled)
        finally:
            v.grad = None  # the push has ended: its buffer may go
            if self._landing == 0 and self._variables:
                # Every key of the step has come back: the step to push next
                # is the servers' version (sync), or this worker's clock.
                self._step = self._servers_version() if self._sync else self._step + 1

    def _land_tensors(self, values):
        """Lands each tensor among `values` (and in lists, tuples or dicts
        among them) that is still waiting for its new value."""
        for x in values:
            if isinstance(x, torch.Tensor):
                v = self._by_param.get(id(x))
                if v is None:
                    continue
                if v.inflight is not None:
                    self._land(v)
                if self._learning:
                    self._seen.add(id(x))
            elif isinstance(x, (list, tuple)):
                self._land_tensors(x)
            elif isinstance(x, dict):
                self._land_tensors(x.values())

    def _before_forward(self, module):
        """A module's forward waits for its own tensors' new values; while
        any are arriving, the outermost call runs under _LandOnUse."""
        first_call = id(module) not in self._watched
        if first_call and isinstance(module, torch.nn.SyncBatchNorm):
            raise psrt.PsrtError(
                "psrt.DistributedOptimizer: nn.SyncBatchNorm needs a torch.distributed process "
                "group, which a psrt job does not start; use nn.BatchNorm*d, whose running "
                "statistics psrt averages over workers at every step")
        if first_call and self._sync_buffers:
            self._register_buffers(module)
        if self._mode_depth:
            self._mode_depth += 1
        elif _is_compiled_wrapper(module):
            # torch.compile(model): the compiled code calls no hook and no
            # torch function mode inside; everything lands before it.
            self.synchronize()
        elif self._landing > 0 or self._learning:
            self._land_on_use.__enter__()
            self._mode_depth = 1
        if self._landing > 0 or self._learning:
            self._land_tensors(module._parameters.values())
            self._land_tensors(module._buffers.values())
        if first_call:
            self._watched.add(id(module))
            me = weakref.ref(self)

            def before_state_dict(*_):
                if me() is not None:
                    me().synchronize()

            module.register_state_dict_pre_hook(before_state_dict)

    def _after_forward(self):
        if self._mode_depth:
            self._mode_depth -= 1
            if self._mode_depth == 0:
                self._land_on_use.__exit__(None, None, None)

    def synchronize(self):
        """Waits for every parameter's new weights from the last step().
        Between backward() and step() (Horovod's idiom, before clipping) the
        gradients in .grad are already the ones step() sends: with
        mean_grads, the mean over workers."""
        for v in self._variables + self._buffers:
            if v.inflight is not None:
                self._land(v)

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
        for v in self._frozen:
            if v.param.requires_grad:
                raise _frozen_error(v.name, "requires grad now")
        for v in self._variables:
            if not v.param.requires_grad:
                raise _frozen_error(v.name, "no longer requires grad")
        scale, found_inf = self._grad_scaler()
        if found_inf is not None and not self._hold:
            raise psrt.PsrtError(
                "psrt.DistributedOptimizer: GradScaler.step() on gradients that went to the servers "
                "during backward(), still scaled (mean_grads=False, or a first step without the "
                "scaler). Pass mean_grads=True (or leave it None and use the scaler from the first "
                "step on)")
        if found_inf is not None and scale is None and embedding.tables_have_gradients():
            raise psrt.PsrtError(
                "psrt.DistributedOptimizer: scaler.unscale_(opt) does not reach psrt.torch.Embedding's "
                "rows (they are not in the optimizer), so their gradients are still scaled. Call "
                "scaler.step(opt) without unscale_ first, and step() unscales them all")
        # Edits matter where gradients were sent already, or to the first
        # step's decision; afterwards, with mean_grads, they are the point.
        edited = self._edited() if self._mean_grads is not True else None
        if not self._hold and edited is not None:
            raise psrt.PsrtError(
                "psrt.DistributedOptimizer: the gradient of '%s' changed between backward() and "
                "step() (gradient clipping, GradScaler, ...), after it was sent to the servers. "
                "Pass mean_grads=True to DistributedOptimizer when gradients are changed on some "
                "steps only, or from a later step on" % edited.name)
        if self._mean_grads is None:
            # A loss scale changes the gradients at every step, whatever
            # this one's bits show.
            self._decide(edited is not None or found_inf is not None)
        if self._learning:
            if self._sync_buffers and not self._model_seen and _traced_hook_calls["n"]:
                raise psrt.PsrtError(
                    "psrt.DistributedOptimizer: the model ran compiled in place (module.compile()), "
                    "so psrt sees none of its modules and cannot average their buffers (BatchNorm's "
                    "statistics); compile with model = torch.compile(model) instead, or pass "
                    "sync_buffers=False to keep each worker's own")
            self._learning = False
            self._land_at_step = [v for v in self._variables + self._buffers if id(v.param) not in self._seen]
            self._seen = None
        if found_inf:
            # GradScaler skips the update. In sync mode every worker does:
            # each found the Inf in the same mean gradient. No key advances;
            # buffers are averaged as at every step.
            self._push_buffers()
            embedding.skip_tables()
            self._end_step()
            return loss
        inv_scale = self._unscale(scale) if scale is not None else None
        # A parameter whose gradient never came (unused this step) says so:
        # in sync mode every key advances every step, and the servers leave
        # one that no worker had a gradient for alone.
        for v in self._variables:
            if not v.queued:
                self._push(v)
        self._flush()
        self._push_buffers()
        embedding.push_tables(inv_scale)  # psrt.torch.Embedding's rows, once per step
        self._end_step()
        # Tensors no module's forward reads would be read before they land.
        for v in self._land_at_step:
            if v.inflight is not None:
                self._land(v)
        return loss

    def _end_step(self):
        for v in self._variables:
            v.queued = False
            v.passes = 0
            v.sent = None
        self._pushing = False

    def _push_buffers(self):
        """The buffers' values go to the servers, whose mean (sync) lands in
        them before their module's next forward (buffers registered at
        different times push for different steps, hence one flush each)."""
        for v in self._buffers:
            if v.inflight is not None:
                self._land(v)
            v.scratch.copy_(v.param)
            v.grad = v.scratch
        for step in sorted({v.step for v in self._buffers}):
            self._bucket = [v for v in self._buffers if v.step == step]
            self._flush(step)
        for v in self._buffers:
            v.step += 1

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
