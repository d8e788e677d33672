"""The kvstore's table keys: a key whose value is a row_sparse NDArray of
shape (vocab, dim) becomes a sparse table on the servers (psrt._tables), its
rows updated there by a row-wise optimizer. Psrt hands them these verbs and
keeps the dense keys' own."""

import numpy as np

import psrt
from psrt import _tables
from psrt.mxnet._arrays import _is_sparse, _nonzero_rows, _outputs, _row_pieces, _write_rows
from psrt.mxnet._optimizers import _table_optimizer

DEFAULTS = {"seed": 0, "init_std": 0.01, "max_rows": 0, "evict_after_steps": 0,
            "evict_min_count": 0, "compression": psrt.Compression.job_default}
options = {}  # key (None: every table) -> settings given to table_options


def _no_optimizer(key):
    return psrt.PsrtError("psrt kvstore: key %s is a table (a row_sparse weight): set_optimizer "
                          "first; its rows are updated on the servers" % (key,))


class TableKeys:
    def __init__(self, name_of):
        self._name_of = name_of  # key -> its variable on the servers
        self._tables = {}        # key -> _tables.HostTable

    def __contains__(self, key):
        return key in self._tables

    def __bool__(self):
        return bool(self._tables)

    def register(self, key, value, optimizer, compression):
        """The table `value` (vocab, dim) starts; `optimizer` updates its rows."""
        if key in self._tables:
            return
        if len(value.shape) != 2:
            raise psrt.PsrtError("psrt kvstore: a table's value has shape (vocab, dim); key %s "
                                 "has %s" % (key, value.shape))
        if optimizer is None:
            raise _no_optimizer(key)
        given = dict(options.get(None, {}), **options.get(key, {}))
        opts = dict(DEFAULTS, compression=compression)
        opts.update(given)
        # Without init_std, rank 0's value is the table's, as with a dense
        # key; rows the value lacks are zeros, as in a row_sparse array.
        from_value = "init_std" not in given
        if from_value:
            opts["init_std"] = 0.0
        name = self._name_of(key)
        self._tables[key] = _tables.HostTable("psrt kvstore", name, value.shape[1], value.shape[0],
                                              _table_optimizer(optimizer), **opts)
        if from_value:
            _tables.start_from(psrt.client(), name, value.shape[1], lambda: _nonzero_rows(value))

    def table(self, key):
        if key not in self._tables:
            raise _no_optimizer(key)
        return self._tables[key]

    def push(self, key, value, scale):
        """Pushes a table's row gradient(s) times `scale`; returns the (ids,
        rows) pieces."""
        table = self.table(key)
        pieces = _row_pieces(key, value, scale)
        table.push(pieces)
        return pieces

    def push_pull(self, key, value, out, scale):
        """Pushes the rows, then reads the pushed ids' new rows into `out`."""
        ids, _ = _tables.merge(self.push(key, value, scale))
        rows = self._tables[key].pull(ids)
        for dst in _outputs(out):
            _write_rows(dst, ids, rows)

    def pull(self, key, out, ignore_sparse):
        """The whole table, into dense outputs (and row_sparse ones unless
        ignore_sparse, as MXNet's kvstore does)."""
        dsts = [d for d in _outputs(out) if not (ignore_sparse and _is_sparse(d))]
        if dsts:
            table = self.table(key)
            ids = np.arange(table.vocab, dtype=np.int64)
            rows = table.pull(ids)
            for dst in dsts:
                _write_rows(dst, ids, rows)

    def row_sparse_pull(self, key, out, row_ids):
        """The rows of `row_ids` (one NDArray per output, or one for all)
        into `out`, row_sparse NDArrays that then hold just those rows."""
        table = self.table(key)
        dsts = _outputs(out)
        rids = list(row_ids) if isinstance(row_ids, (list, tuple)) else [row_ids] * len(dsts)
        if len(rids) != len(dsts):
            raise psrt.PsrtError("psrt kvstore: row_sparse_pull of key %s: %d outputs but %d "
                                 "row_ids" % (key, len(dsts), len(rids)))
        for dst, r in zip(dsts, rids):
            ids = np.unique(_tables.int_ids(table.name, r.asnumpy()))
            _write_rows(dst, ids, table.pull(ids))
