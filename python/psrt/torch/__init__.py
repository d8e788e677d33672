"""PyTorch plugin: ``import psrt.torch as psrt``.

    psrt.init()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt = psrt.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                    compression=psrt.Compression.fp16)
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()   # gradients go to the servers as they appear
        opt.step()                        # the servers' new weights come back

Embedding tables too large for one worker live on the servers as well:
``psrt.Embedding`` and ``psrt.EmbeddingBag`` (docs/sparse.md).

The wrapped optimizer is run by the parameter servers: its type and
hyperparameters become the server-side optimizer, and rank 0's initial
parameters become everyone's.
"""

from psrt import (Compression, PsrtError, init, is_sync, local_rank, num_servers, rank,
                  restored_step, size)
from psrt.torch.embedding import Embedding, EmbeddingBag
from psrt.torch.optimizer import DistributedOptimizer

__all__ = ["Compression", "DistributedOptimizer", "Embedding", "EmbeddingBag", "PsrtError", "init",
           "is_sync", "local_rank", "num_servers", "rank", "restored_step", "size"]
