"""How the servers' new weights reach a DistributedOptimizer's parameters:
each tensor as the servers know it, the push-pulls in flight, and the
torch function mode that lands a tensor just before an operation reads it."""

import sys
import weakref

import torch
from torch.overrides import TorchFunctionMode

import psrt


class _Variable:
    """One tensor as the servers know it: a trainable parameter, or a
    floating-point buffer the servers average."""

    def __init__(self, name, param, group=None):
        self.name = name
        self.param = param
        self.group = group    # None for a buffer
        # Pulled values land here, on the tensor's device; landing copies
        # them in (autograd may still read the tensor until then).
        self.pulled = torch.empty_like(param.detach(), dtype=torch.float32, memory_format=torch.contiguous_format)
        self.grad = None      # what is being pushed: kept alive until the wait
        self.queued = False   # pushed (or in the bucket) this step
        self.passes = 0       # backward passes accumulated since the last push
        self.inflight = None  # the push-pull whose values it waits for
        self.sent = None      # (the .grad object, its version, its bits or None) as sent: edits after that show
        self.scratch = None   # the mean gradient's landing buffer; a buffer's outgoing copy
        self.step = 0         # buffers: the step their next push is for


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

    def __init__(self, optimizer):
        super().__init__()
        self._optimizer = weakref.ref(optimizer)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        opt = self._optimizer()
        if opt is not None and (opt._landing or opt._learning):
            opt._land_tensors(args)
            opt._land_tensors(kwargs.values())
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
