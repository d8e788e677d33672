"""The learning rates of a store's optimizer keys on the servers: sent as
they change (a scheduler's, set_learning_rate's, a key's lr_mult), or, for
SGD with momentum, kept at the key's base rate with the change carried by
the pushed gradient."""

import numpy as np

from psrt.mxnet._optimizers import _scales_gradient
from psrt.mxnet._updates import _ASSIGN


class _LearningRates:
    """Each optimizer key's rate as it was registered: one the servers
    follow, or a fixed one that scales the key's gradient."""

    def __init__(self, client, updates):
        self._client = client
        self._updates = updates
        self._follow = {}   # optimizer key -> its variable, whose rate is sent as it changes
        self._fixed = {}    # SGD-with-momentum key -> (the servers' fixed rate, its weight decay)
        self._weights = {}  # such a key with weight decay -> its current weights

    def registered(self, key, name, config, value):
        self._follow.pop(key, None)
        self._fixed.pop(key, None)
        if config is _ASSIGN:
            return
        if _scales_gradient(config) and config["lr"] > 0:
            # The servers' rate stays; a changed one scales the gradient.
            self._fixed[key] = (config["lr"], config.get("weight_decay"))
        else:
            self._follow[key] = name
        self.keep(key, value)

    def keep(self, key, weights):
        """The key's current weights, where a changed rate needs them."""
        if key in self._fixed and self._fixed[key][1]:
            self._weights[key] = weights

    def sync(self, keys):
        """Sends changed learning rates before the keys' pushes: one call for
        every variable, and one per key whose rate differs from it."""
        optimizer = self._updates.optimizer
        if optimizer is None:
            return
        if not self._fixed:
            self._client.set_learning_rate(float(optimizer.learning_rate))
        for k in keys:
            if k in self._follow:
                self._client.set_learning_rate(float(optimizer._get_lr(k)), self._follow[k])

    def scaled(self, key, grad):
        """SGD with momentum: MXNet's buffer takes each step's gradient times
        that step's rate (v = m v - lr (g + wd w)), the servers' (PyTorch's)
        takes the gradient and multiplies the whole buffer by the current
        rate. Keeping the servers' rate at the key's base rate r (the
        optimizer's lr times lr_mult) and pushing s g + (s - 1) wd w with
        s = lr / r makes the two equal under any schedule."""
        if key not in self._fixed:
            return grad
        rate, wd = self._fixed[key]
        scale = float(self._updates.optimizer._get_lr(key)) / rate
        if scale == 1.0:
            return grad
        g = grad * np.float32(scale)
        if wd:
            g += np.float32((scale - 1.0) * wd) * self._weights[key].reshape(g.shape)
        return g
