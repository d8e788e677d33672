"""Variables held in host (numpy) buffers, for the plugins of frameworks whose
tensors reach Python as numpy arrays (TensorFlow, MXNet): registration with
the servers, one push-pull of all gradients per step, and the learning rate.
The work itself happens in C++ behind the C API (psrt._psrt)."""

import numpy as np

import psrt

MEAN, SUM = 0, 1  # psrt_allreduce's ops


def allreduce(client, names, values, shapes, op=MEAN, compression=psrt.Compression.none):
    """The workers' mean (or sum) of float32 arrays of the given shapes, a
    None among `values` saying this worker has none this step (it counts as
    zeros): psrt_allreduce (worker/reducer.h), the rule every plugin shares.
    Returns the results, None where no worker had one, and the servers'
    aggregate over the mean (1 where they average, the number of workers that
    pushed where they sum)."""
    ins = [None if v is None else np.ascontiguousarray(v, np.float32).reshape(-1) for v in values]
    outs = [np.empty(shape, np.float32) for shape in shapes]
    for name, v, o in zip(names, ins, outs):
        if v is not None and v.size != o.size:
            raise psrt.PsrtError("'%s' has %d values; its reduction takes %d" % (name, v.size, o.size))
    given, factor = client.allreduce(list(names), [o.size for o in outs],
                                     [0 if v is None else v.ctypes.data for v in ins],
                                     [o.ctypes.data for o in outs], op, compression.value)
    return [o if g else None for o, g in zip(outs, given)], factor


def load_state(client, name, who):
    """The bytes of the workers' state `name` the job restored (b"": none,
    a fresh job), its error told as `who`'s (worker/state_keys.h)."""
    try:
        return client.load_state(name)
    except psrt.PsrtError as e:
        raise psrt.PsrtError("%s: %s" % (who, e)) from None


def unique_names(names):
    """`names`, made unique by suffixes where they repeat."""
    seen, out = {}, []
    for n in names:
        k = seen.get(n, 0)
        seen[n] = k + 1
        out.append(n if k == 0 else "%s_%d" % (n, k))
    return out


class HostVariables:
    def __init__(self, client, compression):
        self._client = client
        self._compression = compression
        self._out = {}    # name -> float32 buffer the pulled weights land in
        self._steps = {}  # name -> the version its next push is for

    def register(self, name, value, optimizer, compression=None):
        """Registers a variable (with the store's compression unless given);
        returns its current value (rank 0's, or a restored checkpoint's)."""
        compression = self._compression if compression is None else compression
        host = np.array(value, dtype=np.float32, order="C", copy=True)
        self._client.register_variable(name, list(host.shape), host.ctypes.data, optimizer,
                                       compression.value, compression.value)
        self._out[name] = np.empty_like(host)
        self._steps[name] = self._client.next_step(name)
        return host

    def registered(self, name):
        return name in self._out

    @property
    def compression(self):
        return self._compression

    @property
    def step(self):
        """The step the next push is for (the least over the variables)."""
        return min(self._steps.values()) if self._steps else 0

    def set_learning_rate(self, lr):
        self._client.set_learning_rate(float(lr))

    def _step_of(self, names):
        """The step a push of `names` is for: the least of theirs. A worker
        that joined a running job may have pulled some a version ahead (the
        others were inside a step); the servers drop its push where the step
        is done, and would refuse one for a version a key has not reached."""
        return min(self._steps[n] for n in names)

    def push_pull(self, names, grads, lr=None):
        """Pushes every gradient, waits for the new weights; returns them.
        All names must be at the same step (one step of a model). A None
        gradient says the variable has none this step: the servers leave it
        alone where no worker had one."""
        if lr is not None:
            self.set_learning_rate(lr)
        for n in names:
            if n not in self._out:
                raise psrt.PsrtError("variable '%s' was never registered with psrt" % n)
        grads = [None if g is None else np.ascontiguousarray(g, dtype=np.float32) for g in grads]
        outs = [self._out[n] for n in names]
        for n, g, o in zip(names, grads, outs):
            if g is not None and g.size != o.size:
                raise psrt.PsrtError("gradient of '%s' has %d values; the variable has %d" % (n, g.size, o.size))
        step = self._step_of(names)
        handle = self._client.push_pull(list(names), [0 if g is None else g.ctypes.data for g in grads],
                                        [o.ctypes.data for o in outs], step)
        self._client.wait(handle)
        for n in names:
            self._steps[n] = self._client.next_step(n, self._steps[n])
        return [o.copy() for o in outs]

    def push(self, names, grads):
        """Pushes gradients without waiting for the new weights (pull them)."""
        for n in names:
            if n not in self._out:
                raise psrt.PsrtError("variable '%s' was never registered with psrt" % n)
        grads = [np.ascontiguousarray(g, dtype=np.float32) for g in grads]
        step = self._step_of(names)
        self._client.wait(self._client.push(list(names), [g.ctypes.data for g in grads], step))
        for n in names:
            self._steps[n] = step + 1  # sync: the version the update makes

    def pull(self, name):
        """The variable's current weights (sync: of the step it is at)."""
        out = self._out[name]
        self._client.wait(self._client.pull([name], [out.ctypes.data], self._steps[name] if self._client.is_sync() else 0))
        return out.copy()
