"""Small collectives between the workers of a sync job, through the servers.

A framework's bookkeeping asks its processes to agree now and then (a
barrier, rank 0's checkpoint path, whether any worker wants to stop, a
logged metric's mean). A psrt job starts no torch.distributed process group,
so these go through one key on the servers whose optimizer is "assign":
every worker pushes its values for the key's next step, the servers take
their mean (or their sum, by the job's gradient_aggregation) once every
worker's push is in, and every worker pulls it. One round trip each, in the
order the workers call them, as torch.distributed's are.
"""

import pickle

import torch

import psrt
from psrt import _job


class Exchange:
    """Sums float32 vectors over the job's workers, through key `name`."""

    _CHUNK = 4096  # floats a round trip carries

    def __init__(self, name):
        self._client = psrt.client()
        if not self._client.is_sync():
            raise psrt.PsrtError("%s: collectives need a sync job (every worker takes part in "
                                 "each); this job's mode is async or ssp" % name)
        self._name = name
        self._out = torch.zeros(self._CHUNK)
        self._client.register_variable(name, [self._CHUNK], self._out.data_ptr(), {"name": "assign"},
                                       psrt.Compression.none.value, psrt.Compression.none.value)
        self._step = _job.first_step(self._client, name)
        self._workers = self._client.num_workers()

    def sum(self, values):
        """The sum over workers of `values` (any shape, as float32 on the CPU;
        exact for integers up to 2^24 / workers)."""
        flat = values.detach().to("cpu", torch.float32).reshape(-1)
        total = torch.empty_like(flat)
        scale = self._workers if self._client.averages() else 1
        for at in range(0, max(1, flat.numel()), self._CHUNK):
            part = torch.zeros(self._CHUNK)
            n = min(self._CHUNK, flat.numel() - at)
            part[:n] = flat[at:at + n]
            handle = self._client.push_pull([self._name], [part.data_ptr()], [self._out.data_ptr()], self._step)
            self._client.wait(handle)
            self._step = _job.next_step(self._client, self._name, self._step)
            total[at:at + n] = self._out[:n] * scale
        return total.reshape(values.shape)

    def broadcast(self, obj, src):
        """`obj` as rank `src` has it (pickled, byte by byte)."""
        mine = psrt.rank() == src
        data = pickle.dumps(obj) if mine else b""
        length = int(self.sum(torch.tensor([float(len(data))])).round().item())
        raw = torch.zeros(length)
        if mine:
            raw = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.float32)
        got = self.sum(raw).round().to(torch.uint8)
        return obj if mine else pickle.loads(got.numpy().tobytes())
