"""How the servers' new weights reach a DistributedOptimizer's parameters:
the push-pulls in flight, the module hooks that land a module's tensors
before its forward pass, and the torch function mode that lands a tensor
just before an operation reads it."""

import sys
import weakref

import torch
from torch.nn.modules import module as _module
from torch.overrides import TorchFunctionMode

import psrt


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


class _LandOnUse(TorchFunctionMode):
    """Lands a tensor whose new value is still arriving just before an
    operation reads it: the parameters that no module's own forward uses
    (``MultiheadAttention.out_proj``), tied weights, and any read in a parent."""

    def __init__(self, landing):
        super().__init__()
        self._landing = weakref.ref(landing)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        landing = self._landing()
        if landing is not None and landing.busy:
            landing.land_tensors(args)
            landing.land_tensors(kwargs.values())
        return func(*args, **kwargs)


# Forward hooks that ran inside compiled code (dynamo replays this count's
# change each time that code runs): a module compiled in place shows itself
# to no hook otherwise.
_traced_hook_calls = {"n": 0}


def _is_compiled_wrapper(module):
    """Whether `module` is torch.compile's wrapper (OptimizedModule); none can
    be before torch._dynamo is imported, which this does not do."""
    dynamo = sys.modules.get("torch._dynamo.eval_frame")
    return dynamo is not None and isinstance(module, dynamo.OptimizedModule)


class _Landing:
    """Writes the servers' new values into the tensors of a registry as
    they are needed: before the forward pass of the module that holds them,
    at the first operation that reads them, or at synchronize().

    Until the first step every module call runs under _LandOnUse to learn
    which tensors are read inside some module's forward; the others (a
    functional model, a forward called directly, a model compiled in place)
    are landed by step() itself (land_unread)."""

    def __init__(self, registry, fusion, sync_buffers):
        self._registry = registry
        self._fusion = fusion      # counts the tensors in flight, and advances the step
        self._sync_buffers = sync_buffers
        self._watched = set()      # modules whose state_dict() synchronizes first
        self._learning = True
        self._seen = set()
        self._land_at_step = []
        self._land_on_use = _LandOnUse(self)
        self._mode_depth = 0

    @property
    def busy(self):
        """Whether a tensor may still have to land (or be seen) in a forward."""
        return self._fusion.in_flight > 0 or self._learning

    def hook_forwards(self):
        """Every module's forward passes here first and last (global hooks,
        through a weak reference: they do nothing once the optimizer, which
        holds this, is gone). Returns the hooks' handles."""
        me = weakref.ref(self)

        def before_forward(module, args):
            if torch.compiler.is_compiling():
                _traced_hook_calls["n"] += 1
            elif me() is not None:
                me().before_forward(module)

        def after_forward(module, args, output):
            if me() is not None and not torch.compiler.is_compiling():
                me().after_forward()

        return [_module.register_module_forward_pre_hook(before_forward),
                _module.register_module_forward_hook(after_forward, always_call=True)]

    @torch.no_grad()
    def land(self, v):
        """Waits for the tensor's new values and writes them into it."""
        inflight, v.inflight = v.inflight, None
        self._fusion.in_flight -= 1
        try:
            inflight.wait()
            v.param.copy_(v.pulled)
        finally:
            v.grad = None  # the push has ended: its buffer may go
            if self._fusion.in_flight == 0:
                self._fusion.all_landed()

    def land_tensors(self, values):
        """Lands each tensor among `values` (and in lists, tuples or dicts
        among them) that is still waiting for its new value."""
        for x in values:
            if isinstance(x, torch.Tensor):
                v = self._registry.by_param.get(id(x))
                if v is None:
                    continue
                if v.inflight is not None:
                    self.land(v)
                if self._learning:
                    self._seen.add(id(x))
            elif isinstance(x, (list, tuple)):
                self.land_tensors(x)
            elif isinstance(x, dict):
                self.land_tensors(x.values())

    def synchronize(self):
        """Lands every tensor still waiting for its new values."""
        for v in self._registry.variables + self._registry.buffers:
            if v.inflight is not None:
                self.land(v)

    def before_forward(self, module):
        """A module's forward waits for its own tensors' new values; while
        any are arriving, the outermost call runs under _LandOnUse."""
        first_call = id(module) not in self._watched
        if first_call and isinstance(module, torch.nn.SyncBatchNorm):
            raise psrt.PsrtError(
                "psrt.DistributedOptimizer: nn.SyncBatchNorm needs a torch.distributed process "
                "group, which a psrt job does not start; use nn.BatchNorm*d, whose running "
                "statistics psrt averages over workers at every step")
        if first_call and self._sync_buffers:
            self._registry.add_buffers(module)
        if self._mode_depth:
            self._mode_depth += 1
        elif _is_compiled_wrapper(module):
            # torch.compile(model): the compiled code calls no hook and no
            # torch function mode inside; everything lands before it.
            self.synchronize()
        elif self.busy:
            self._land_on_use.__enter__()
            self._mode_depth = 1
        if self.busy:
            self.land_tensors(module._parameters.values())
            self.land_tensors(module._buffers.values())
        if first_call:
            self._watched.add(id(module))
            me = weakref.ref(self)

            def before_state_dict(*_):
                if me() is not None:
                    me().synchronize()

            module.register_state_dict_pre_hook(before_state_dict)

    def after_forward(self):
        if self._mode_depth:
            self._mode_depth -= 1
            if self._mode_depth == 0:
                self._land_on_use.__exit__(None, None, None)

    def end_learning(self):
        """At the first step: the tensors no module's forward read are
        landed by every step from now on."""
        if not self._learning:
            return
        if self._sync_buffers and not self._registry.model_seen and _traced_hook_calls["n"]:
            raise psrt.PsrtError(
                "psrt.DistributedOptimizer: the model ran compiled in place (module.compile()), "
                "so psrt sees none of its modules and cannot average their buffers (BatchNorm's "
                "statistics); compile with model = torch.compile(model) instead, or pass "
                "sync_buffers=False to keep each worker's own")
        self._learning = False
        registry = self._registry
        self._land_at_step = [v for v in registry.variables + registry.buffers if id(v.param) not in self._seen]
        self._seen = None

    def land_unread(self):
        """Lands the tensors no module's forward reads: they would be read
        before they land."""
        for v in self._land_at_step:
            if v.inflight is not None:
                self.land(v)
