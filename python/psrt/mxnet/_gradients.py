"""Dense gradients on their way to the servers: host copies times
rescale_grad, MXNet's 2-bit quantization, clip_gradient and the learning
rate's share, each applied where MXNet's own servers apply it."""

import numpy as np

from psrt import _host
from psrt.mxnet._arrays import _is_sparse, _outputs, _scaled
from psrt.mxnet._optimizers import _check_rows_of_dense


class _Gradients:
    """A store's dense gradients from the pushed NDArrays to what is sent;
    2-bit quantization's residuals carry over between pushes."""

    def __init__(self, client, keys, updates, rates):
        self._client = client
        self._keys = keys        # _registration._Registry
        self._updates = updates
        self._rates = rates
        self._two_bit = None     # the 2bit compression's threshold, if set
        self._residuals = {}     # dense key -> what 2bit quantization has not sent yet

    def quantize(self, threshold):
        self._two_bit = threshold

    def host(self, keys, values):
        """Host copies of the pushed values: an optimizer's key gets them
        times rescale_grad, as MXNet's servers apply it; a plain key as is."""
        grads = []
        optimizer = self._updates.optimizer
        for k, v in zip(keys, values):
            self._keys.pushing(k)
            plain = self._keys.plain(k)
            if any(_is_sparse(x) for x in _outputs(v)):
                _check_rows_of_dense(k, None if plain else optimizer)
            scale = 1.0 if plain else float(optimizer.rescale_grad)
            if self._two_bit is not None:
                # MXNet quantizes what the worker computed; its servers
                # apply rescale_grad to the sum.
                grads.append(self._quantized(k, _scaled(v, 1.0)) * np.float32(scale))
            else:
                grads.append(_scaled(v, scale))
            if not plain:
                # MXNet's servers count each key's updates: the count drives
                # its lr_scheduler (num_update).
                optimizer._update_count(k)
        return grads

    def _quantized(self, key, grad):
        """MXNet's 2-bit quantization with error feedback: the residual
        takes the gradient; where it reaches +-threshold that is sent and
        taken off it, elsewhere 0 is sent."""
        residual = self._residuals.get(key)
        if residual is None:
            residual = self._residuals[key] = np.zeros_like(grad)
        residual += grad
        t = np.float32(self._two_bit)
        sent = np.where(residual >= t, t, np.where(residual <= -t, -t, np.float32(0)))
        sent = sent.astype(np.float32)
        residual -= sent
        return sent

    def prepared(self, keys, grads):
        """The gradients to push to the optimizer's keys: clipped, and with
        the learning rate's share where the servers keep a fixed rate
        (_learning_rates.py)."""
        grads = list(grads)
        idx = [i for i, k in enumerate(keys) if not self._keys.plain(k)]
        if self._updates.optimizer is None or not idx:
            return grads
        divide = self._clip(keys, grads, idx)
        for i in idx:
            grads[i] = self._rates.scaled(keys[i], grads[i])
            if divide != 1.0:
                grads[i] = grads[i] / np.float32(divide)
        return grads

    def _clip(self, keys, grads, idx):
        """clip_gradient: MXNet's servers clip the aggregated gradient. In
        sync mode it is found on a plain twin key, clipped on every worker
        alike, and pushed so that it aggregates to itself (the returned
        divisor); async and ssp apply each worker's push alone, so each
        worker clips its own."""
        clip = self._updates.optimizer.clip_gradient
        if clip is None:
            return 1.0
        clip = float(clip)
        if not self._client.is_sync():
            for i in idx:
                grads[i] = np.clip(grads[i], -clip, clip)
            return 1.0
        # The servers' aggregate, as they would apply it.
        op = _host.MEAN if self._client.averages() else _host.SUM
        totals, divide = _host.allreduce(self._client, [self._keys.names[keys[i]] for i in idx],
                                         [grads[i] for i in idx], [grads[i].shape for i in idx], op)
        for i, total in zip(idx, totals):
            grads[i] = np.clip(total, -clip, clip)
        return divide
