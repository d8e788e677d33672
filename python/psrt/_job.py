"""What every plugin does with the job's other workers: the step a push is
for and the learning rates the servers follow (the mean over the workers is
psrt_allreduce's, _host.allreduce). The plugins' own modules keep only what
their framework needs."""


def first_step(client, name):
    """The step a variable's first push is for: sync, the version the
    servers hold (a restored job resumes there; a worker that joins a running
    job joins its step); async and ssp, this worker's clock, which starts at
    the restored step."""
    return client.pulled_version(name) if client.is_sync() else client.restored_step()


def next_step(client, name, step):
    """The step of a variable's next push after one for `step`: sync, the
    version its pull returned (the servers' step); otherwise one on."""
    return client.pulled_version(name) if client.is_sync() else step + 1


class LearningRates:
    """Sends learning rates to the servers only when they change: one for
    every variable (`set`), and a variable's own where it differs from that
    (`set_for`)."""

    def __init__(self, client):
        self._client = client
        self._all = None  # the rate last sent for every variable
        self._own = {}    # variable -> its own rate, where it differs

    def set(self, lr):
        lr = float(lr)
        if lr != self._all:
            self._client.set_learning_rate(lr)
            self._all, self._own = lr, {}

    def set_for(self, name, lr):
        lr = float(lr)
        if lr != self._own.get(name, self._all):
            self._client.set_learning_rate(lr, name)
            self._own[name] = lr

    def registered(self, lr, name=None):
        """Variables registered with `lr` (`name`'s, or every one's): the
        servers hold it already."""
        if name is None:
            self._all = float(lr)
        else:
            self._own[name] = float(lr)
