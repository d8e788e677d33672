"""The learning rates the servers use for a DistributedOptimizer's
parameters: the param groups' ``lr`` (schedulers change it), and the user's
rule for a change in the number of workers taking part."""


class _LearningRates:
    """Sends the param groups' rates before the first push of a step, after
    `on_workers_change` (elastic jobs, workers that leave) had its say."""

    def __init__(self, client, registry, on_workers_change):
        self._client = client
        self._registry = registry
        self._on_workers_change = on_workers_change
        self._workers = client.active_workers()

    def before_first_push(self):
        """Calls on_workers_change(old, new) where the number of workers
        changed (it may set the groups' lr), then sends the rates."""
        workers = self._client.active_workers()
        if workers != self._workers and self._on_workers_change is not None:
            self._on_workers_change(self._workers, workers)
        self._workers = workers
        self.sync()

    def sync(self):
        """Schedulers change group['lr']; the servers follow before the next
        push (the client sends only the rates that changed)."""
        for v in self._registry.variables:
            self._client.set_learning_rate(float(v.group["lr"]), v.name)
