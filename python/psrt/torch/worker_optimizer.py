"""The optimizer on the workers: the servers sum, every worker steps.

Where the servers cannot run the user's optimizer (RMSprop, NAdam, LBFGS,
transformers' Adafactor, any other), or where asked
(``optimizer_on="workers"``), every worker runs that optimizer object itself
on the step's mean gradient, as MXNet does with ``update_on_kvstore=False``
and BytePS by design. The mean is psrt_allreduce's (worker/reducer.h), the
rule every plugin shares; this module is torch's glue to it:

- every worker starts from rank 0's parameters and buffers (registration's
  rule: rank 0's first value wins), so same weights, same mean gradient and
  the same optimizer give the same update on every worker;
- the end of each ``backward()`` writes the mean gradient into ``.grad``
  (a parameter no worker had a gradient for keeps None, as in one process),
  so clipping, ``GradScaler`` and any code before ``step()`` see what one
  process on the global batch sees;
- the workers check that they still hold the same weights at the first step
  and every ``check_every`` steps after; a difference is an error naming the
  worker, never a silent drift.

- the job's checkpoints save rank 0's parameters, optimizer state and
  buffers once (``worker/state_keys.h``: at the checkpoints' steps and the
  last one, when the process exits), and a job restored from one gives them
  back to every worker before its first step.

Sync jobs only (an async push has no step-wide mean), and only where no
running process must receive the weights later (``Client::StateOnWorkers``:
recovery, restarted or joining workers are refused at start).
"""

import atexit
import io
import itertools
import weakref
import zlib

import torch
from torch.nn.modules import module as _module

import psrt
from psrt import _host
from psrt.torch import _buffers
from psrt.torch.optimizer import DistributedOptimizer

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# Each optimizer's state has a name, the same in every process of the job
# and in the job restored from its checkpoint: the order they were made in.
_made = itertools.count()


def _read_through(name):
    """An attribute that is the wrapped optimizer's, read and written."""
    return property(lambda self: getattr(self._optimizer, name),
                    lambda self, value: setattr(self._optimizer, name, value))


class WorkerOptimizer(DistributedOptimizer):
    """A DistributedOptimizer whose `optimizer` every worker runs on the mean
    gradient (DistributedOptimizer's optimizer_on picks it; its arguments
    are DistributedOptimizer's, of which fusion_bytes, on_workers_change and
    mean_grads have no part here: the mean is always in .grad after
    backward(), and the jobs with changing membership are refused)."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, optimizer, named_parameters, compression=psrt.Compression.job_default,
                 backward_passes_per_step=1, fusion_bytes=None, on_workers_change=None, mean_grads=None,
                 sync_buffers=True, optimizer_on="workers", check_every=100):
        client = psrt.client()
        try:
            client.state_on_workers(saves_state=True)
        except psrt.PsrtError as e:
            raise psrt.PsrtError("psrt.DistributedOptimizer(%s): %s" % (type(optimizer).__name__, e)) from None
        if not client.averages():
            raise psrt.PsrtError("psrt.DistributedOptimizer: the job's gradient_aggregation is \"sum\"; "
                                 "PyTorch's optimizer trains on the mean of the workers' gradients")
        if backward_passes_per_step < 1 or check_every < 1:
            raise psrt.PsrtError("psrt.DistributedOptimizer: backward_passes_per_step and check_every "
                                 "must be >= 1")
        if mean_grads is False:
            raise psrt.PsrtError("psrt.DistributedOptimizer: mean_grads=False with the optimizer on the "
                                 "workers; they step on the mean gradient, which is in .grad after backward()")
        named = list(named_parameters)
        by_param = {id(p): n for n, p in named}
        if len(by_param) != len(named) or len({n for n, _ in named}) != len(named):
            raise psrt.PsrtError("psrt.DistributedOptimizer: named_parameters repeats a name or a parameter")
        self._optimizer = optimizer
        self._client = client
        self._compression = compression
        self._passes = backward_passes_per_step
        self._check_every = check_every
        self._steps = 0
        self._done = 0  # backward passes since the last mean
        self._queued = False
        self._params = []  # (name, parameter) trained, in the optimizer's order
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in by_param:
                    raise psrt.PsrtError(
                        "psrt.DistributedOptimizer: the optimizer holds a parameter (shape %s) that is "
                        "not in named_parameters; pass the model's named_parameters()" % list(p.shape))
                if p.dtype not in _FLOATS:
                    raise psrt.PsrtError("psrt.DistributedOptimizer: parameter '%s' is %s; psrt trains "
                                         "float32, float16 and bfloat16 parameters" % (by_param[id(p)], p.dtype))
                self._params.append((by_param[id(p)], p))
        self._start_from_rank0([(n, p) for n, p in named if p.dtype.is_floating_point])
        self._mean = [torch.empty(p.numel(), dtype=torch.float32) for _, p in self._params]
        for _, p in self._params:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._on_gradient)
        # Float buffers (BatchNorm's statistics) of the modules that hold
        # these parameters, found as they run forward (named_parameters does
        # not name them).
        self._buffers = {}  # name -> buffer
        self._kept_buffers = {}  # the same and the others (a step count): a checkpoint's
        self._buffer_hook = None
        if sync_buffers:
            names = {id(p): n for n, p in named}
            me = weakref.ref(self)

            def before_forward(module, args):
                if me() is not None and not torch.compiler.is_compiling():
                    me()._take_buffers(dict(_buffers.named_buffers(module, names, lambda b: True) or ()))

            self._buffer_hook = _module.register_module_forward_pre_hook(before_forward)
        self._state_name = "torch.optimizer%d" % next(_made)
        self._start = self._saved = client.restored_step()
        self._restored_buffers = self._load_state()
        atexit.register(self._save_last)

    # torch.optim.Optimizer's bookkeeping is the wrapped optimizer's, read
    # through: its load_state_dict (accelerate's device placement calls it)
    # rebinds its param groups, which schedulers must still reach.
    param_groups = _read_through("param_groups")
    state = _read_through("state")
    defaults = _read_through("defaults")

    def _start_from_rank0(self, named):
        """Every worker takes rank 0's values (float32 on the wire: exact for
        bf16 and fp16 too)."""
        for name, p in named:
            host = p.detach().to("cpu", torch.float32, copy=True).contiguous()
            self._client.register_variable(name, list(host.shape), host.data_ptr(), {"name": "assign"},
                                           psrt.Compression.none.value, psrt.Compression.none.value)
            with torch.no_grad():
                p.copy_(host)

    # --- the state a checkpoint keeps ------------------------------------------

    def _load_state(self):
        """Every worker takes the state the job restored (rank 0's, saved
        once); returns the buffers, which modules show as they run."""
        blob = _host.load_state(self._client, self._state_name, "psrt.DistributedOptimizer")
        if not blob:
            return {}
        state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
        names = sorted(n for n, _ in self._params)
        if state["step"] != self._start or sorted(state["params"]) != names:
            raise psrt.PsrtError(
                "psrt.DistributedOptimizer: the checkpoint's state '%s' is of step %d and parameters %s; "
                "this job restored step %d and trains %s" % (self._state_name, state["step"],
                                                              sorted(state["params"]), self._start, names))
        with torch.no_grad():
            for n, p in self._params:
                p.copy_(state["params"][n])
        self._optimizer.load_state_dict(state["optimizer"])
        return dict(state["buffers"])

    def _take_buffers(self, found):
        """A module's buffers, as it runs forward: the float ones are
        averaged each step, all are in the state a checkpoint keeps (and
        take the restored values)."""
        self._kept_buffers.update(found)
        self._buffers.update((n, b) for n, b in found.items() if b.dtype.is_floating_point)
        for n in list(self._restored_buffers):
            if n in found:
                with torch.no_grad():
                    found[n].copy_(self._restored_buffers.pop(n))

    def _save_state(self, step):
        """Rank 0: the state of `step`, for the job's checkpoints."""
        f = io.BytesIO()
        torch.save({"step": step, "params": {n: p.detach().cpu() for n, p in self._params},
                    "optimizer": self._optimizer.state_dict(),
                    "buffers": {n: b.detach().cpu() for n, b in self._kept_buffers.items()}}, f)
        self._client.save_state(self._state_name, f.getvalue(), step)
        self._saved = step

    def _save_last(self):
        """At exit: the last step's state, which the final checkpoint saves."""
        step = self._start + self._steps
        if step > self._saved and self._client.rank() == 0 and self._client.state_due(step, True):
            self._save_state(step)

    # --- the mean gradient, at the end of backward() --------------------------

    def _on_gradient(self, _):
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)

    @torch.no_grad()
    def _end_of_backward(self):
        self._queued = False
        self._done += 1
        if self._done == self._passes:
            self._done = 0
            self._mean_gradients()

    def _mean_gradients(self):
        grads = [None if p.grad is None else p.grad.detach().to("cpu", torch.float32).reshape(-1).contiguous()
                 for _, p in self._params]
        given, _ = self._client.allreduce([n for n, _ in self._params], [m.numel() for m in self._mean],
                                          [0 if g is None else g.data_ptr() for g in grads],
                                          [m.data_ptr() for m in self._mean], _host.MEAN, self._compression.value)
        for (_, p), mean, anyone in zip(self._params, self._mean, given):
            if not anyone:
                p.grad = None
            elif p.grad is None:
                p.grad = mean.reshape(p.shape).to(p.device, p.dtype)
            else:
                p.grad.copy_(mean.reshape(p.shape))

    def _mean_loss(self, loss):
        """The workers' mean loss (a closure's, which LBFGS compares)."""
        value = torch.tensor([float(loss.detach() if torch.is_tensor(loss) else loss)], dtype=torch.float32)
        (mean,), _ = _host.allreduce(self._client, ["psrt.loss"], [value.numpy()], [(1,)])
        return torch.as_tensor(float(mean[0]), dtype=loss.dtype if torch.is_tensor(loss) else torch.float32)

    # --- the step ------------------------------------------------------------

    def step(self, closure=None):
        if self._done:
            raise psrt.PsrtError("psrt.DistributedOptimizer: step() after %d of backward_passes_per_step=%d "
                                 "backward passes" % (self._done, self._passes))
        if closure is not None:
            user = closure

            def closure():
                return self._mean_loss(user())
        loss = self._optimizer.step(closure)
        self._optimizer._opt_called = True
        self._steps += 1
        with torch.no_grad():
            self._average_buffers()
            if self._steps == 1 or self._steps % self._check_every == 0:
                self._check_weights()
            step = self._start + self._steps
            if self._client.rank() == 0 and self._client.state_due(step):
                self._save_state(step)
        return loss

    def _average_buffers(self):
        """BatchNorm's running statistics: the workers' mean each step, as the
        plugin keeps them with the optimizer on the servers."""
        if self._buffer_hook is not None and self._steps == 1:
            self._buffer_hook.remove()  # every module has run forward by now
        if not self._buffers:
            return
        names = sorted(self._buffers)
        values = [self._buffers[n].detach().to("cpu", torch.float32).reshape(-1).numpy() for n in names]
        means, _ = _host.allreduce(self._client, ["buffer:" + n for n in names], values,
                                   [v.shape for v in values])
        for n, mean in zip(names, means):
            b = self._buffers[n]
            b.copy_(torch.from_numpy(mean).reshape(b.shape))

    def _check_weights(self):
        digest = 0
        for _, p in self._params:
            digest = zlib.crc32(p.detach().to("cpu").reshape(-1).contiguous().view(torch.uint8).numpy(), digest)
        self._client.check_same("weights", digest)

    def zero_grad(self, set_to_none=True):
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def synchronize(self):
        """Nothing is in flight after backward(): the mean is in .grad."""

    @property
    def global_step(self):
        """Steps taken by this optimizer."""
        return self._steps

    def state_dict(self):
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self._optimizer.load_state_dict(state_dict)

    def __repr__(self):
        return "psrt.DistributedOptimizer(%r, optimizer_on=\"workers\")" % (self._optimizer,)
