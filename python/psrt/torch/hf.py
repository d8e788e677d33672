"""Hugging Face ``Trainer`` on psrt: ``from psrt.torch.hf import Trainer``.

    from psrt.torch.hf import Trainer
    trainer = Trainer(model=model, args=TrainingArguments(...), train_dataset=ds)
    trainer.train()

A ``transformers.Trainer`` that knows the job's workers. Under ``psrt-run``
every worker is a process of its own, and accelerate sees one process
(psrt sets no ``RANK``/``WORLD_SIZE``, so nothing starts torch.distributed
and nothing all-reduces). This subclass then:

- shards the training data over the workers (``DistributedSampler`` with
  ``psrt.size()`` replicas, this worker's ``psrt.rank()``, the Trainer's
  seed, reshuffled every epoch), so a step's global batch is the workers'
  batches together;
- tells the Trainer its place (``args.world_size``, ``process_index``,
  ``local_process_index``), so it logs and saves on rank 0 only;
- wraps the optimizer it creates, or the one it is given, in
  ``psrt.torch.DistributedOptimizer`` with ``backward_passes_per_step`` set
  to ``gradient_accumulation_steps``: the servers run it on the mean over
  workers of each worker's gradient, and ``max_grad_norm`` clips that mean
  (the plugin's ``mean_grads``), as one process on the global batch would.

It refuses what it cannot match: samplers that are not rank-aware
(``group_by_length``), iterable datasets (the Trainer cannot shard them),
several GPUs in one process, DeepSpeed and FSDP, and resuming from the
Trainer's own checkpoints (psrt's servers hold the weights and optimizer
state: resume the job from psrt's checkpoints, the distribution's
``"restore": "latest"`` beside its ``"checkpoint": {"uri": ...}``).
docs/frameworks.md has
the details.
"""

import copyreg
import functools

import transformers
from torch.utils.data import DistributedSampler
from transformers.trainer_utils import has_length

import psrt
from psrt.torch.optimizer import DistributedOptimizer


@functools.lru_cache(maxsize=None)
def _arguments_for_psrt(base):
    """`base` (a TrainingArguments class) whose process's place in the job is
    psrt's: accelerate sees one process, the Trainer should see the job."""

    class Arguments(base):
        world_size = property(lambda self: psrt.size())
        process_index = property(lambda self: psrt.rank())
        local_process_index = property(lambda self: psrt.local_rank())

        def __reduce_ex__(self, protocol):
            # Saved with a checkpoint as the user's class (this one is made here).
            return copyreg._reconstructor, (base, object, None), self.__dict__

    Arguments.__name__ = Arguments.__qualname__ = base.__name__
    return Arguments


def _refuse(what):
    raise psrt.PsrtError("psrt.torch.hf.Trainer: " + what)


class Trainer(transformers.Trainer):
    """A ``transformers.Trainer`` for psrt jobs; takes the same arguments."""

    def __init__(self, *args, **kwargs):
        psrt.init()
        super().__init__(*args, **kwargs)
        a = self.args
        a.__class__ = _arguments_for_psrt(type(a))
        if a.n_gpu > 1:
            _refuse("this process sees %d GPUs and the Trainer would replicate the model over them; "
                    "psrt runs one worker per GPU: psrt-run --workers=N (N the host's GPUs, or "
                    "--workers=gpus) gives each its own GPU" % a.n_gpu)
        if a.deepspeed or a.fsdp:
            _refuse("DeepSpeed and FSDP shard the model across processes themselves; psrt's servers "
                    "hold it whole")
        if a.train_sampling_strategy == "group_by_length":
            _refuse("train_sampling_strategy='group_by_length' is not rank-aware, so every worker "
                    "would see every sample; use 'random', 'sequential' or 'batch_rebalance'")
        if self.train_dataset is not None and not has_length(self.train_dataset):
            _refuse("the training dataset has no length (an IterableDataset), so the Trainer cannot "
                    "shard it and every worker would read the same samples; use a map-style dataset")

    def _get_train_sampler(self, train_dataset=None):
        dataset = self.train_dataset if train_dataset is None else train_dataset
        strategy = self.args.train_sampling_strategy
        if strategy == "batch_rebalance":  # rank-aware through args
            return super()._get_train_sampler(train_dataset)
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        return DistributedSampler(dataset, num_replicas=psrt.size(), rank=psrt.rank(),
                                  shuffle=strategy != "sequential", seed=seed,
                                  drop_last=self.args.dataloader_drop_last)

    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model)
        passes = self.args.gradient_accumulation_steps
        if isinstance(optimizer, DistributedOptimizer):
            if optimizer._passes != passes:
                _refuse("the DistributedOptimizer given has backward_passes_per_step=%d but "
                        "gradient_accumulation_steps is %d" % (optimizer._passes, passes))
            return optimizer
        model = model if model is not None else self.model
        self.optimizer = DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                              backward_passes_per_step=passes)
        return self.optimizer

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        if resume_from_checkpoint:
            _refuse("resume_from_checkpoint would load weights into this worker only; the servers "
                    "hold the model and its optimizer state: resume the job from psrt's checkpoints "
                    "(the distribution's \"restore\": \"latest\" beside its \"checkpoint\": {\"uri\": ...})")
        return super().train(None, *args, **kwargs)


__all__ = ["Trainer"]
