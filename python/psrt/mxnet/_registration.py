"""The keys a store has on the servers: tables (_table_keys.py) and dense
keys, each dense key a variable registered with the optimizer it has (or
plain), moved to a new variable when set_optimizer changes that."""

import psrt
from psrt import _host
from psrt.mxnet import _table_keys
from psrt.mxnet._arrays import _assign, _is_sparse
from psrt.mxnet._optimizers import _without_lr
from psrt.mxnet._updates import _ASSIGN


class _Registry:
    """Every key of one store: where it lives on the servers and what it was
    registered with. A dense key given to init waits for its first use or
    set_optimizer, so that it registers with the optimizer that is set by
    then."""

    def __init__(self, client, prefix, compression, updates, rates, not_initialised):
        self._prefix = prefix
        self._client = client
        self._updates = updates
        self._rates = rates
        self._not_initialised = not_initialised  # the error type of a key used before init
        self.vars = _host.HostVariables(client, compression)
        self.tables = _table_keys.TableKeys(self.name)  # the keys that are tables
        self.compression = compression
        self.names = {}        # dense key -> its server variable
        self._pending = {}     # key -> value given to init, until first use or set_optimizer
        self._configs = {}     # dense key -> the optimizer its variable has
        self._generation = {}  # dense key -> how often set_optimizer moved it
        self.broadcast_only = {}  # key -> arrays Gluon broadcasts without a gradient (a plain key)
        self.pushed = set()    # dense keys ever pushed

    def name(self, key):
        return "%s/%s" % (self._prefix, key)

    def used(self):
        """Whether a key registered (its compression then fixed)."""
        return bool(self.names) or bool(self.tables)

    def compress(self, compression):
        self.compression = compression
        self.vars = _host.HostVariables(self._client, compression)

    def is_table(self, key):
        """A table's key: registered, or given to init as a row_sparse value."""
        return key in self.tables or _is_sparse(self._pending.get(key))

    def registered_or_pending(self, key):
        """Given to init: a registered dense key, or one waiting to register."""
        return key in self.names or key in self._pending

    def plain(self, key):
        """A dense key without an optimizer: its value is the pushes' aggregate."""
        return self._configs[key] is _ASSIGN

    def tables_first(self, verb, keys, *columns):
        """Hands each table key, with its entries of `columns` (lists beside
        `keys`), to `verb`; returns the dense keys and their entries."""
        rows = [(self.is_table(row[0]), row) for row in zip(keys, *columns)]
        for table, row in rows:
            if table:
                verb(*row)
        dense = [row for table, row in rows if not table]
        if not dense:
            return [[] for _ in range(1 + len(columns))]
        return [list(col) for col in zip(*dense)]

    def row_sparse_pull(self, key, out, row_ids):
        if not self.is_table(key):
            raise psrt.PsrtError("psrt kvstore: key %s is no table; init it with a row_sparse "
                                 "NDArray of shape (vocab, dim)" % (key,))
        self.tables.row_sparse_pull(key, out, row_ids)

    def init(self, key, value):
        if key in self.names or key in self.tables or key in self._pending:
            return
        if self._updates.optimizer is None:
            # Registered at its first use, with the optimizer if one came by
            # then (no move needed), else as a plain key.
            self._pending[key] = value.copy()
        else:
            self._register(key, value)

    def ensure(self, key):
        """Registers a dense key given to init at its first use."""
        if key in self.names:
            return
        if key not in self._pending:
            raise self._not_initialised("psrt kvstore: key %s was never initialised; call init "
                                        "first" % (key,))
        self._register(key, self._pending.pop(key))

    def pushing(self, key):
        """A dense key is pushed: one Gluon only broadcast so far is the
        optimizer's key it would have been."""
        if key in self.broadcast_only and self._updates.optimizer is not None:
            del self.broadcast_only[key]
            self._move(key)
        if self._updates.optimizer is None and not self.pushed and self._client.is_sync():
            # A plain key's value becomes the step's aggregate (Gluon's
            # update_on_kvstore=False): the weights and the optimizer's state
            # live on the workers, where a checkpoint, a restore or a
            # restarted worker would not find them.
            try:
                self._client.state_on_workers()
            except psrt.PsrtError as e:
                raise psrt.PsrtError("psrt kvstore: pushing to key %s, which has no optimizer (Gluon's "
                                     "update_on_kvstore=False), leaves the weights and the optimizer's "
                                     "state on the workers: %s; use update_on_kvstore=True (set_optimizer)"
                                     % (key, e)) from None
        self.pushed.add(key)

    def follow_optimizer(self):
        """After set_optimizer: keys registered with other settings move,
        those waiting register, and the workers' updater starts from what
        the keys hold."""
        for key in list(self.names):
            config = self._updates.config(key, key in self.broadcast_only)
            if _without_lr(self._configs[key]) != _without_lr(config):
                self._move(key)
        for key, value in list(self._pending.items()):
            self._register(key, value)
        self._pending.clear()
        for key in self.names:
            if key not in self.broadcast_only:
                self._updates.start(key, self.pull)

    def current(self, key):
        """A dense key's weights now (registered at its first use)."""
        self.ensure(key)
        weights = self._updates.weights(key)
        return self.vars.pull(self.names[key]) if weights is None else weights

    def push(self, keys, grads):
        self.vars.push([self.names[k] for k in keys], grads)

    def push_pull(self, keys, values):
        return self.vars.push_pull([self.names[k] for k in keys], values)

    def pull(self, key):
        return self.vars.pull(self.names[key])

    def _register(self, key, value):
        if _is_sparse(value):
            self.tables.register(key, value, self._updates.optimizer, self.compression)
            return
        if key in self.names:
            return
        config = self._updates.config(key, key in self.broadcast_only)
        name = self.name(key)
        host = self.vars.register(name, value.asnumpy(), config)
        _assign(value, host)
        self._registered(key, name, config, host)

    def _move(self, key):
        """Moves a dense key's current value to a new variable with the
        optimizer set now (set_optimizer after the key was used)."""
        value = self.vars.pull(self.names[key])
        config = self._updates.config(key, key in self.broadcast_only)
        self._generation[key] = self._generation.get(key, 0) + 1
        name = "%s#%d" % (self.name(key), self._generation[key])
        self.vars.register(name, value, config)
        self._registered(key, name, config, value)

    def _registered(self, key, name, config, value):
        self.names[key], self._configs[key] = name, config
        self._rates.registered(key, name, config, value)
        self._updates.registered(key, value, key in self.broadcast_only)
