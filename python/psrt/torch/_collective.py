"""Small collectives between the workers of a sync job, through the servers.

A framework's bookkeeping asks its processes to agree now and then (a
barrier, rank 0's checkpoint path, whether any worker wants to stop, a
logged metric's mean). A psrt job starts no torch.distributed process group,
so these go through psrt_allreduce (worker/reducer.h): every worker pushes
its values, the servers aggregate them once every worker's push is in, and
every worker pulls the same sum. One round trip each, in the order the
workers call them, as torch.distributed's are.
"""

import pickle

import numpy as np
import torch

import psrt
from psrt import _host


class Exchange:
    """Sums float32 vectors over the job's workers, as reduction group `name`."""

    _CHUNK = 4096  # floats a round trip carries

    def __init__(self, name, user):
        """`user` names who needs the collectives, for a refusal."""
        client = psrt.client()
        try:
            client.every_worker_each_step()
        except psrt.PsrtError as e:
            raise psrt.PsrtError("%s need every worker: %s" % (user, e)) from None
        self._name = name
        self._client = client

    def sum(self, values):
        """The sum over workers of `values` (any shape, as float32 on the CPU;
        exact for integers up to 2^24 / workers)."""
        flat = values.detach().to("cpu", torch.float32).reshape(-1).numpy()
        total = np.empty_like(flat)
        for at in range(0, max(1, flat.size), self._CHUNK):
            part = np.zeros(self._CHUNK, np.float32)
            n = min(self._CHUNK, flat.size - at)
            part[:n] = flat[at:at + n]
            (got,), _ = _host.allreduce(self._client, [self._name], [part], [part.shape], _host.SUM)
            total[at:at + n] = got[:n]
        return torch.from_numpy(total).reshape(values.shape)

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
