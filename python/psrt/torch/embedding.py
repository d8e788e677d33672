"""Embedding and EmbeddingBag whose rows live on psrt's servers.

Drop-ins for ``nn.Embedding(..., sparse=True)`` and ``nn.EmbeddingBag``: the
forward pass pulls the rows of the batch's distinct ids, autograd sums their
gradients per id, and ``psrt.torch.DistributedOptimizer.step()`` (or
``push()`` without one) pushes them; the table's row-wise optimizer runs on
the servers (docs/sparse.md).
"""

import itertools
import weakref

import numpy as np
import torch
import torch.nn.functional as F

import psrt
from psrt._tables import start_from

_OPTIMIZERS = ("sgd", "adagrad", "adam", "ftrl")
_names = itertools.count()
# The tables of this process, pushed by DistributedOptimizer.step().
_tables = weakref.WeakSet()


def _optimizer_config(optimizer, lr, kwargs):
    """A row-wise optimizer with torch's argument names, for the servers."""
    if optimizer not in _OPTIMIZERS:
        raise psrt.PsrtError("psrt.torch.Embedding: optimizer %r is not row-wise; use one of %s"
                             % (optimizer, ", ".join(_OPTIMIZERS)))
    cfg = {"name": optimizer, "lr": float(lr)}
    kwargs = dict(kwargs)
    if "betas" in kwargs:
        cfg["beta1"], cfg["beta2"] = (float(b) for b in kwargs.pop("betas"))
    if optimizer == "adagrad":
        cfg["eps"] = 1e-10  # torch.optim.Adagrad's default
    if optimizer == "ftrl" and "beta" in kwargs:
        cfg["ftrl_beta"] = float(kwargs.pop("beta"))
    for key in ("eps", "lr_decay", "initial_accumulator_value", "l1", "l2"):
        if key in kwargs:
            cfg[key] = float(kwargs.pop(key))
    if kwargs:
        raise psrt.PsrtError("psrt.torch.Embedding: %s takes no %s" % (optimizer, sorted(kwargs)))
    return cfg


def _int_ids(table, ids):
    """`ids` as given, refused unless of an integer dtype: nn.Embedding
    raises for float ids, and a cast would truncate them silently."""
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise psrt.PsrtError("table '%s': ids of dtype %s; ids are integers (torch.int64 or torch.int32), "
                             "as nn.Embedding takes them" % (table, ids.dtype))
    return ids


class _Table(torch.nn.Module):
    """What Embedding and EmbeddingBag share: the table on the servers, the
    pull of a batch's rows and the push of their gradients."""

    def __init__(self, num_embeddings, embedding_dim, name, optimizer, lr, seed, init_std, max_rows,
                 evict_after_steps, evict_min_count, compression, optimizer_args):
        super().__init__()
        if num_embeddings is None:
            num_embeddings = 0  # an open hash table: any int64 id
        if num_embeddings < 0 or embedding_dim <= 0:
            raise psrt.PsrtError("psrt.torch.%s: num_embeddings must be >= 0 (0 or None: an open hash "
                                 "table) and embedding_dim > 0; got %s and %s"
                                 % (type(self).__name__, num_embeddings, embedding_dim))
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.table_name = name if name is not None else "embedding%d" % next(_names)
        self._client = psrt.client()
        self._client.register_table(
            self.table_name, embedding_dim, num_embeddings, seed, init_std, max_rows, evict_after_steps,
            evict_min_count, _optimizer_config(optimizer, lr, optimizer_args), compression.value,
            compression.value)
        # The step to pull at and push for: the servers' version (sync: a
        # worker restarted or joining a running job starts where the table
        # is) or this worker's clock (async, ssp), counted from the restored step.
        self._step = self._client.next_step(self.table_name)
        self._looked_up = []  # (distinct ids, their rows as a leaf) per forward this step
        self._pushing = None  # (handle, buffers kept alive until its wait)
        _tables.add(self)

    def _rows(self, ids, min_version):
        ids = ids.detach().to("cpu", torch.int64).contiguous()
        out = torch.empty(ids.numel(), self.embedding_dim)
        if ids.numel() > 0:
            self._client.wait(self._client.pull_rows(self.table_name, ids.data_ptr(), ids.numel(),
                                                     out.data_ptr(), min_version))
        return out

    def _lookup(self, ids):
        """The batch's distinct ids' rows (a leaf whose gradient push() sends)
        and each id's index into them."""
        _int_ids(self.table_name, ids)
        self._finish_push()
        distinct, inverse = torch.unique(ids.detach().cpu().flatten(), return_inverse=True)
        rows = self._rows(distinct, self._step)
        if self.training and torch.is_grad_enabled():
            rows.requires_grad_()
            self._looked_up.append((distinct, rows))
        return rows, inverse.view(ids.shape)

    def rows(self, ids):
        """The rows of `ids` at this worker's step (sync: once every worker's
        last pushed step is applied), without gradient: to inspect or export."""
        ids = _int_ids(self.table_name, torch.as_tensor(ids))
        self._finish_push()
        with torch.no_grad():
            return self._rows(ids.flatten(), self._step).view(*ids.shape, self.embedding_dim)

    @classmethod
    def from_pretrained(cls, embeddings, freeze=False, **kwargs):
        """As ``nn.Embedding.from_pretrained(embeddings, sparse=True)``: a table of
        ``embeddings.shape[0]`` rows that start as rank 0's ``embeddings`` on every
        worker (its rows are sent once, in messages of a few MiB, before the first
        step; the others' are not read) and train with the table's optimizer.
        ``kwargs`` are the class's other arguments. A job restored from a
        checkpoint, a restarted rank 0 and a worker that joins later find the
        rows on the servers instead (``start_from``)."""
        if freeze:
            raise psrt.PsrtError(
                "psrt.torch.%s.from_pretrained: freeze=True; a frozen table is never pushed, so keep it "
                "as torch.nn.%s.from_pretrained(embeddings, freeze=True) on every worker" % (cls.__name__, cls.__name__))
        embeddings = torch.as_tensor(embeddings)
        if embeddings.dim() != 2 or not embeddings.is_floating_point():
            raise psrt.PsrtError("psrt.torch.%s.from_pretrained: embeddings are a 2-D floating-point tensor "
                                 "(rows x embedding_dim); got %s of shape %s"
                                 % (cls.__name__, embeddings.dtype, tuple(embeddings.shape)))
        table = cls(embeddings.shape[0], embeddings.shape[1], **kwargs)
        start_from(psrt.client(), table.table_name, table.embedding_dim,
                   lambda: (np.arange(embeddings.shape[0]), embeddings.detach().to("cpu", torch.float32).numpy()))
        return table

    def push(self, inv_scale=None):
        """Pushes this step's row gradients (DistributedOptimizer.step() does
        it, with GradScaler's `inv_scale`). Every worker pushes once per step,
        rows or not, in sync mode."""
        self._finish_push()
        found = [(ids, rows.grad) for ids, rows in self._looked_up if rows.grad is not None]
        self._looked_up = []
        if len(found) == 1:
            ids, grads = found[0]
        elif found:
            # Several lookups this step: one gradient per distinct id.
            ids, inverse = torch.unique(torch.cat([i for i, _ in found]), return_inverse=True)
            grads = torch.zeros(ids.numel(), self.embedding_dim).index_add_(
                0, inverse, torch.cat([g for _, g in found]))
        else:
            ids, grads = torch.empty(0, dtype=torch.int64), torch.empty(0, self.embedding_dim)
        ids, grads = ids.contiguous(), grads.contiguous()
        if inv_scale is not None and grads.numel():
            # GradScaler's own unscale, as for the dense gradients.
            torch._amp_foreach_non_finite_check_and_unscale_([grads], torch.zeros(()), inv_scale.cpu())
        handle = self._client.push_rows(self.table_name, ids.data_ptr(), ids.numel(), grads.data_ptr(),
                                        self._step)
        self._pushing = (handle, ids, grads)
        self._step += 1

    def skip(self):
        """A step GradScaler skipped: its rows' gradients are dropped, and
        the table stays at its step, as the dense keys do."""
        self._looked_up = []

    def has_gradients(self):
        return any(rows.grad is not None for _, rows in self._looked_up)

    def _finish_push(self):
        if self._pushing is not None:
            handle, self._pushing = self._pushing[0], None
            self._client.wait(handle)

    def extra_repr(self):
        return "%s, %d, table=%r" % (self.num_embeddings or "open hash", self.embedding_dim, self.table_name)


class Embedding(_Table):
    """``nn.Embedding(num_embeddings, embedding_dim, sparse=True)`` on the servers.

    Args:
      num_embeddings: the vocabulary (ids in [0, num_embeddings)); 0 or None
        for an open hash table whose ids are any int64 (hashed features).
      embedding_dim: the row size.
      name: the table's name on the servers (every worker the same);
        default "embedding<N>" in creation order.
      optimizer: "sgd", "adagrad", "adam" (torch.optim.SparseAdam's lazy
        form) or "ftrl", with torch's argument names in ``optimizer_args``
        (``betas``, ``eps``, ``lr_decay``, ``initial_accumulator_value``;
        ftrl: ``l1``, ``l2``, ``beta``).
      seed, init_std: a new row is N(0, init_std^2) drawn from (seed, id):
        nn.Embedding's N(0, 1) by default.
      max_rows, evict_after_steps, evict_min_count: open hash tables' cap per
        server and eviction (docs/sparse.md).
    """

    def __init__(self, num_embeddings, embedding_dim, name=None, optimizer="adam", lr=1e-3, seed=0,
                 init_std=1.0, max_rows=0, evict_after_steps=0, evict_min_count=0,
                 compression=psrt.Compression.job_default, **optimizer_args):
        super().__init__(num_embeddings, embedding_dim, name, optimizer, lr, seed, init_std, max_rows,
                         evict_after_steps, evict_min_count, compression, optimizer_args)

    def forward(self, input):
        rows, index = self._lookup(input)
        return F.embedding(index, rows).to(input.device)


class EmbeddingBag(_Table):
    """``nn.EmbeddingBag`` (mode "sum", "mean" or "max", with ``offsets`` and
    ``per_sample_weights`` as there) on the servers; the other arguments as
    for Embedding."""

    def __init__(self, num_embeddings, embedding_dim, mode="mean", name=None, optimizer="adam", lr=1e-3,
                 seed=0, init_std=1.0, max_rows=0, evict_after_steps=0, evict_min_count=0,
                 compression=psrt.Compression.job_default, **optimizer_args):
        if mode not in ("sum", "mean", "max"):
            raise psrt.PsrtError("psrt.torch.EmbeddingBag: mode is 'sum', 'mean' or 'max'; got %r" % mode)
        super().__init__(num_embeddings, embedding_dim, name, optimizer, lr, seed, init_std, max_rows,
                         evict_after_steps, evict_min_count, compression, optimizer_args)
        self.mode = mode

    def forward(self, input, offsets=None, per_sample_weights=None):
        rows, index = self._lookup(input)
        if offsets is not None:
            offsets = offsets.cpu()
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.cpu()
        return F.embedding_bag(index, rows, offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights).to(input.device)


def push_tables(inv_scale=None):
    """Pushes every table's gradients of this step (DistributedOptimizer.step()),
    multiplied by GradScaler's `inv_scale` where given."""
    for table in list(_tables):
        table.push(inv_scale)


def skip_tables():
    """Drops every table's gradients of a step GradScaler skipped."""
    for table in list(_tables):
        table.skip()


def tables_have_gradients():
    return any(table.has_gradients() for table in list(_tables))
