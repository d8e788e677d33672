"""The tensors a DistributedOptimizer keeps on the servers: its trainable
parameters, its frozen ones and the model's buffers, each registered under
its name so that every worker starts from the same values."""

import torch

import psrt
from psrt.torch import _buffers
from psrt.torch._placement import _server_optimizer


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


def _frozen_error(name, now):
    return psrt.PsrtError(
        "psrt.DistributedOptimizer: parameter '%s' %s since the optimizer was made; the servers "
        "train the parameters that required grad then. Make a new DistributedOptimizer after "
        "freezing or unfreezing layers" % (name, now))


def names_by_parameter(named):
    """id(parameter) -> its name, refusing a name or a parameter named twice."""
    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        raise psrt.PsrtError("psrt.DistributedOptimizer: named_parameters repeats a name")
    by_param = {id(p): n for n, p in named}
    if len(by_param) != len(named):
        raise psrt.PsrtError("psrt.DistributedOptimizer: a parameter appears twice in named_parameters")
    return by_param


class _Registry:
    """What this optimizer registered on the servers, by kind: the trainable
    parameters (hooked and pushed), the frozen ones (rank 0's values, never
    pushed) and the buffers the servers average."""

    def __init__(self, client, compression):
        self._client = client
        self._compression = compression
        self.variables = []   # trainable: hooked and pushed
        self.frozen = []      # requires_grad=False: rank 0's values, never pushed
        # Found at the first forward of a module holding these parameters
        # (named_parameters does not name them).
        self.buffers = []
        self.by_param = {}    # id(tensor) -> its _Variable, trainable or buffer
        self.model_seen = False  # a module holding these parameters ran forward outside compiled code

    def register(self, v, server_cfg, compression=None):
        self.register_tensor(v.name, v.param, server_cfg, compression)

    def register_tensor(self, name, tensor, server_cfg, compression=None):
        """Registers the tensor; afterwards it holds rank 0's values (or the
        restored checkpoint's, or the servers' when the key exists)."""
        compression = self._compression if compression is None else compression
        host = tensor.detach().to("cpu", torch.float32, copy=True).contiguous()
        self._client.register_variable(name, list(host.shape), host.data_ptr(), server_cfg,
                                       compression.value, compression.value)
        with torch.no_grad():
            tensor.copy_(host)

    def add_parameters(self, optimizer, named, by_param):
        """Registers the optimizer's parameters that require grad, with its
        param group's settings, then every frozen one."""
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
                    self.variables.append(_Variable(name, p, group))
                    self.register(self.variables[-1], server_cfg)
                    self.by_param[id(p)] = self.variables[-1]
        missing = [n for n, p in named if id(p) not in seen and p.requires_grad]
        if missing:
            raise psrt.PsrtError("psrt.DistributedOptimizer: parameters %s are in named_parameters "
                                 "but not in the optimizer" % missing)
        # Frozen parameters, in the optimizer or not, start from rank 0's
        # values like the rest (a frozen layer of a randomly initialised model
        # would otherwise differ between workers).
        for n, p in named:
            if not p.requires_grad and p.dtype.is_floating_point:
                self.frozen.append(_Variable(n, p))
                self.register(self.frozen[-1], {"name": "assign"}, psrt.Compression.none)

    def add_buffers(self, module):
        """Registers the float32 and int64 buffers under a module seen for the
        first time that holds these parameters, named as in the state_dict()
        of the module named_parameters came from (every worker builds the
        same model, so the names agree)."""
        # Integer buffers (num_batches_tracked) travel as float32, exact
        # below 2^24, so checkpoints hold them too. Those registered already
        # (under a module seen before) are left out.
        known = {id(v.param): v.name for v in self.variables + self.frozen + self.buffers}
        buffers = _buffers.named_buffers(module, known, lambda b: b.dtype in (torch.float32, torch.int64))
        if buffers is None:
            return
        self.model_seen = True
        for n, b in buffers:
            v = _Variable("buffer:" + n, b)
            self.register(v, {"name": "assign"}, psrt.Compression.none)
            # Async and ssp: this worker's clock on it (the key's version
            # counts every worker's pushes, some made already).
            v.step = self._client.next_step(v.name)
            v.scratch = torch.empty_like(v.pulled)
            self.buffers.append(v)
            self.by_param[id(b)] = v

    def check_requires_grad(self):
        """Refuses a step after layers were frozen or unfrozen."""
        for v in self.frozen:
            if v.param.requires_grad:
                raise _frozen_error(v.name, "requires grad now")
        for v in self.variables:
            if not v.param.requires_grad:
                raise _frozen_error(v.name, "no longer requires grad")

    def servers_version(self):
        """The least version pulled over the parameters. A worker that joins
        a running job pulls while the others are inside a step, when some
        keys are a version ahead: it pushes for the least one (the servers
        drop that push where the step is done), never for a version a key
        has not reached, which they refuse."""
        return min(self._client.pulled_version(v.name) for v in self.variables)
