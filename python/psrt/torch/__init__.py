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

The wrapped optimizer is run by the parameter servers where they can (SGD,
Adam, AdamW, Adagrad over float32 parameters): its type and hyperparameters
become the server-side optimizer. Any other runs on every worker on the mean
gradient (sync jobs; ``optimizer_on``). Rank 0's initial parameters become
everyone's.

Collectives for the user's own tensors, as Horovod's: ``psrt.allreduce(t)``
(the mean; ``op="sum"``), ``allgather``, ``broadcast``, ``broadcast_object``
and ``barrier``.
"""

from psrt import (Compression, PsrtError, init, is_sync, local_rank, num_servers, rank,
                  restored_step, size)
from psrt.torch.collectives import allgather, allreduce, barrier, broadcast, broadcast_object
from psrt.torch.embedding import Embedding, EmbeddingBag
from psrt.torch.optimizer import DistributedOptimizer

__all__ = ["Compression", "DistributedOptimizer", "Embedding", "EmbeddingBag", "PsrtError", "allgather",
           "allreduce", "barrier", "broadcast", "broadcast_object", "init", "is_sync", "local_rank",
           "num_servers", "rank", "restored_step", "size"]
