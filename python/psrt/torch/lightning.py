"""Lightning on psrt: ``Trainer(strategy=psrt.torch.lightning.PsrtStrategy())``.

    import lightning as L
    from psrt.torch.lightning import PsrtStrategy
    trainer = L.Trainer(strategy=PsrtStrategy(), accelerator="cpu", devices=1,
                        gradient_clip_val=1.0, precision="bf16-mixed")
    trainer.fit(model, datamodule)

A strategy in the manner of the HorovodStrategy Lightning once had. Every
worker under ``psrt-run`` is a process driving one device; the strategy:

- gives Lightning the job's ranks (``PsrtEnvironment``), so its
  ``DistributedSampler`` shards each epoch over the workers and rank 0 alone
  logs and writes checkpoints;
- wraps each optimizer ``configure_optimizers`` returns in
  ``psrt.torch.DistributedOptimizer`` (``backward_passes_per_step`` is
  ``accumulate_grad_batches``): the servers run it on the mean gradient, and
  ``gradient_clip_val`` clips that mean; schedulers change the learning rate
  the servers use;
- does Lightning's collectives (barriers, broadcasts, ``self.log(...,
  sync_dist=True)``, early stopping's agreement) through psrt_allreduce on the
  servers (``psrt.torch.collectives``), since a psrt job starts no
  torch.distributed process group.

Resuming from a Lightning checkpoint (``ckpt_path``) is refused: the servers
hold the weights and optimizer state; resume from psrt's checkpoint. So are
jobs whose steps may go without a worker (async, ssp, backup_workers,
elastic, on_worker_failure "continue"): Lightning's collectives are sums over
every worker (Client::EveryWorkerEachStep).
"""

import os

import torch
from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.fabric.utilities.rank_zero import rank_zero_only as fabric_rank_zero_only
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.data import has_iterable_dataset
from lightning.pytorch.utilities.rank_zero import rank_zero_only

import psrt
from psrt.torch import collectives
from psrt.torch.optimizer import DistributedOptimizer


class PsrtEnvironment(ClusterEnvironment):
    """The job's ranks as psrt-run set them (PSRT_RANK, PSRT_LOCAL_RANK,
    PSRT_WORLD_SIZE); ranks are numbered host by host."""

    @property
    def creates_processes_externally(self):
        return True

    @property
    def main_address(self):
        return ""

    @property
    def main_port(self):
        return 0

    @staticmethod
    def detect():
        return "PSRT_COORDINATOR" in os.environ

    def world_size(self):
        return psrt.size()

    def set_world_size(self, size):
        pass  # the job's

    def global_rank(self):
        return psrt.rank()

    def set_global_rank(self, rank):
        pass  # the job's

    def local_rank(self):
        return psrt.local_rank()

    def node_rank(self):
        return psrt.rank() // int(os.environ.get("PSRT_LOCAL_WORLD_SIZE", "1"))


class _MixedPrecision(MixedPrecision):
    """Lightning's AMP, clipping what DistributedOptimizer steps on.

    DistributedOptimizer takes GradScaler's scale at step() (it says
    ``_step_supports_amp_scaling``), so Lightning neither unscales before its
    clip nor lets it clip. It also takes gradients the user unscaled
    (``scaler.unscale_(opt)``), so a clip unscales first here."""

    def clip_gradients(self, optimizer, clip_val=0.0, gradient_clip_algorithm=None):
        if clip_val > 0 and self.scaler is not None:
            self.scaler.unscale_(optimizer)
        kwargs = {} if gradient_clip_algorithm is None else {"gradient_clip_algorithm": gradient_clip_algorithm}
        Precision.clip_gradients(self, optimizer, clip_val, **kwargs)


def _reduce_op_name(op):
    name = str(getattr(op, "name", op)).lower()
    if name in ("sum",):
        return "sum"
    if name in ("mean", "avg"):
        return "mean"
    raise psrt.PsrtError("PsrtStrategy: reduce_op %r is not supported (sum or mean)" % (op,))


class PsrtStrategy(ParallelStrategy):
    """Runs a Lightning Trainer's optimizers on psrt's servers.

    Args:
      compression: ``psrt.Compression`` of gradients and weights on the wire
        (``job_default``: the job's setting).
      iterables_sharded: an ``IterableDataset`` (which Lightning cannot
        shard) is refused unless this says that each worker's reads only its
        own part (say, by ``psrt.rank()`` of ``psrt.size()``).
      accelerator, checkpoint_io, precision_plugin: as for Lightning's
        strategies (the Trainer's ``accelerator``/``precision`` fill them).
    """

    strategy_name = "psrt"

    def __init__(self, compression=psrt.Compression.job_default, iterables_sharded=False, accelerator=None,
                 checkpoint_io=None, precision_plugin=None):
        psrt.init()
        super().__init__(accelerator=accelerator, cluster_environment=PsrtEnvironment(),
                         checkpoint_io=checkpoint_io, precision_plugin=precision_plugin)
        self._compression = compression
        self._iterables_sharded = iterables_sharded
        self._ready = False  # the collectives may run (setup_environment)

    @property
    def is_distributed(self):
        return True  # Lightning then shards the data (distributed_sampler_kwargs)

    @property
    def root_device(self):
        devices = self.parallel_devices or [torch.device("cpu")]
        if devices[0].type == "cuda":
            return torch.device("cuda", self.local_rank % torch.cuda.device_count())
        return devices[0]

    @property
    def distributed_sampler_kwargs(self):
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def setup_environment(self):
        try:
            psrt.client().every_worker_each_step()
        except psrt.PsrtError as e:
            raise psrt.PsrtError("PsrtStrategy: Lightning's barriers, broadcasts and sync_dist need every "
                                 "worker: %s" % e) from None
        self._ready = True
        super().setup_environment()
        rank_zero_only.rank = fabric_rank_zero_only.rank = self.global_rank

    def setup(self, trainer):
        if type(self.precision_plugin) is MixedPrecision:
            self.precision_plugin.__class__ = _MixedPrecision
        self.accelerator.setup(trainer)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()

    def model_to_device(self):
        self.model.to(self.root_device)

    def setup_optimizers(self, trainer):
        super().setup_optimizers(trainer)
        module = self.lightning_module
        wrapped = []
        for opt in self.optimizers:
            if not isinstance(opt, DistributedOptimizer):
                mine = {id(p) for g in opt.param_groups for p in g["params"]}
                opt = DistributedOptimizer(
                    opt, named_parameters=[(n, p) for n, p in module.named_parameters() if id(p) in mine],
                    compression=self._compression, backward_passes_per_step=trainer.accumulate_grad_batches)
            wrapped.append(opt)
        self.optimizers = wrapped

    def process_dataloader(self, dataloader):
        if has_iterable_dataset(dataloader) and not self._iterables_sharded:
            raise psrt.PsrtError(
                "PsrtStrategy: an IterableDataset is not sharded by Lightning, so every worker would "
                "read the same samples; use a map-style dataset, or shard it by psrt.rank() of "
                "psrt.size() and pass PsrtStrategy(iterables_sharded=True)")
        return dataloader

    def load_checkpoint(self, checkpoint_path, weights_only=None):
        raise psrt.PsrtError(
            "PsrtStrategy: ckpt_path=%s would load weights into this worker only; the servers hold the "
            "model and its optimizer state: resume the job from psrt's checkpoints (the distribution's "
            "\"restore\": \"latest\" beside its \"checkpoint\": {\"uri\": ...})" % checkpoint_path)

    # --- collectives, through the servers ----------------------------------

    def barrier(self, name=None, *args, **kwargs):
        if self._ready:
            collectives.barrier()

    def broadcast(self, obj, src=0):
        return collectives.broadcast_object(obj, src) if self._ready else obj

    def reduce(self, tensor, group=None, reduce_op="mean"):
        if not isinstance(tensor, torch.Tensor):
            return tensor
        op = "average" if _reduce_op_name(reduce_op) == "mean" else "sum"
        # Integers (a count) come back as float32, as a mean needs.
        return collectives.allreduce(tensor if tensor.is_floating_point() else tensor.float(), op)

    def all_gather(self, tensor, group=None, sync_grads=False):
        return collectives.allgather(tensor)


__all__ = ["PsrtEnvironment", "PsrtStrategy"]
