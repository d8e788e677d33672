"""DistributedOptimizer's ``mean_grads``: whether gradients wait for
``step()`` so that code between ``backward()`` and ``step()`` may change
them, the first step's decision of it shared by every worker, and, in sync
mode, the mean gradient over workers written into ``.grad`` at the end of
``backward()`` (as DDP does)."""

import torch

import psrt
from psrt import _host
from psrt.torch._fusion import _address
from psrt.torch._registration import _Variable


class _MeanGrads:
    """Gradients wait for step() always (True), never (False), or at the
    first step, which decides (None until then)."""

    def __init__(self, client, registry, mean_grads, compression):
        self._client = client
        self._registry = registry
        self._compression = compression
        self._sync = client.is_sync()
        self.mean_grads = mean_grads
        self._decision = None  # mean_grads=None: where the workers agree on it
        if mean_grads is None and registry.variables:
            self._join_decision()
        self._exchange_queued = False

    @property
    def hold(self):
        """Gradients wait for step(): with mean_grads, and at the first step
        while it is undecided."""
        return self.mean_grads is not False

    def _join_decision(self):
        """The first step's decision lives on the servers (an assign key: in
        sync mode the mean of the workers' "changed" flags), so every worker
        holds gradients or none does; a worker that joins later takes it."""
        self._decision = _Variable(self._registry.variables[0].name + "@mean_grads", torch.zeros(1))
        self._registry.register(self._decision, {"name": "assign"}, psrt.Compression.none)
        if self._client.pulled_version(self._decision.name) > 0:
            self.mean_grads = bool(self._decision.param.item() > 0)

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
        self.mean_grads = edited

    def at_step(self, found_inf):
        """Refuses gradients changed after they were sent; at the first step
        (mean_grads=None), decides whether gradients keep waiting."""
        # Edits matter where gradients were sent already, or to the first
        # step's decision; afterwards, with mean_grads, they are the point.
        edited = self._edited() if self.mean_grads is not True else None
        if not self.hold and edited is not None:
            raise psrt.PsrtError(
                "psrt.DistributedOptimizer: the gradient of '%s' changed between backward() and "
                "step() (gradient clipping, GradScaler, ...), after it was sent to the servers. "
                "Pass mean_grads=True to DistributedOptimizer when gradients are changed on some "
                "steps only, or from a later step on" % edited.name)
        if self.mean_grads is None:
            # A loss scale changes the gradients at every step, whatever
            # this one's bits show.
            self._decide(edited is not None or found_inf is not None)

    def queue_end_of_backward(self):
        """Sync: the mean gradient is in .grad when backward() returns."""
        if not self._exchange_queued:
            self._exchange_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)

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
            self._exchange()
        deciding = self.mean_grads is None
        for v in self._registry.variables:
            g = v.param.grad
            v.sent = (g, g._version, g.clone() if deciding else None) if g is not None else None
            v.passes = 0

    def _exchange(self):
        """Each .grad becomes the mean over workers, a worker without one
        counting as zeros (as under DDP); a parameter no worker had a
        gradient for keeps .grad None, as in one process (psrt_allreduce)."""
        variables = self._registry.variables
        if not variables:
            return
        for v in variables:
            if v.scratch is None:
                v.scratch = torch.empty_like(v.pulled)
        grads = [v.param.grad.detach().contiguous() if v.param.grad is not None else None for v in variables]
        given, _ = self._client.allreduce([v.name for v in variables], [v.scratch.numel() for v in variables],
                                          [_address(g) for g in grads], [v.scratch.data_ptr() for v in variables],
                                          _host.MEAN, self._compression.value)
        for v, anyone in zip(variables, given):
            if not anyone:
                v.param.grad = None
            elif v.param.grad is None:
                v.param.grad = v.scratch.clone()
            else:
                v.param.grad.copy_(v.scratch)

    def _edited(self):
        """The first parameter whose .grad changed since it was sent (or,
        with mean_grads, since the mean was written), or None."""
        for v in self._registry.variables:
            if v.sent is not None:
                g, version, bits = v.sent
                if v.param.grad is not g or g._version != version or (
                        bits is not None and not torch.equal(g.view(torch.int32), bits.view(torch.int32))):
                    return v
        return None
