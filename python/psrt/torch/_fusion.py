"""What a DistributedOptimizer sends: gradients in buckets of `fusion_bytes`,
each one push-pull asking for the updated weights back (Horovod's tensor
fusion, DDP's buckets: small tensors share requests), the buffers' values,
and the step they are all for."""

from psrt.torch._landing import _InFlight


def _address(tensor):
    """A tensor's address for the C API; 0 (no gradient) for None."""
    return tensor.data_ptr() if tensor is not None else 0


class _Fusion:
    """The bucket being filled, the tensors whose new values are still in
    flight, and the step the next push is for."""

    def __init__(self, client, registry, fusion_bytes, sync):
        self._client = client
        self._registry = registry
        self._fusion_bytes = fusion_bytes
        self._sync = sync
        self._bucket, self._bucket_bytes = [], 0
        self.in_flight = 0  # tensors still waiting for their new values
        # The step to push next: the servers' version in sync mode (a restored
        # job resumes there), this worker's clock otherwise.
        self.step = registry.servers_version() if sync and registry.variables else client.restored_step()

    def add(self, v):
        """Queues the parameter's gradient; a bucket of fusion_bytes goes out
        as one push-pull (one request per server for all its tensors)."""
        g = v.param.grad
        v.sent = (g, g._version, None) if g is not None else None
        # No gradient (unused this step) goes out as such: the servers leave
        # a parameter no worker had one for alone, as torch's optimizer does.
        v.grad = g.detach().contiguous() if g is not None else None
        v.queued = True
        self._bucket.append(v)
        self._bucket_bytes += v.param.numel() * 4
        if self._bucket_bytes >= self._fusion_bytes:
            self.flush()

    def flush(self):
        """Sends the bucket, however full, for the current step."""
        if self._bucket:
            self._send(self._bucket, self.step)
            self._bucket, self._bucket_bytes = [], 0

    def push_buffers(self):
        """The buffers' values go to the servers, whose mean (sync) lands in
        them before their module's next forward (buffers registered at
        different times push for different steps, hence one push-pull for
        each). Each buffer must have landed already."""
        buffers = self._registry.buffers
        for v in buffers:
            v.scratch.copy_(v.param)
            v.grad = v.scratch
        for step in sorted({v.step for v in buffers}):
            self._send([v for v in buffers if v.step == step], step)
        for v in buffers:
            v.step += 1

    def _send(self, bucket, step):
        handle = self._client.push_pull([v.name for v in bucket], [_address(v.grad) for v in bucket],
                                        [v.pulled.data_ptr() for v in bucket], step)
        inflight = _InFlight(self._client, handle)
        for v in bucket:
            v.inflight = inflight
        self.in_flight += len(bucket)

    def all_landed(self):
        """Every key of the step has come back: the step to push next is the
        servers' version (sync), or this worker's clock."""
        if self._registry.variables:
            self.step = self._registry.servers_version() if self._sync else self.step + 1
