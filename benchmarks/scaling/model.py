"""A discrete-event model of a synchronous psrt job.

What it simulates, per training step:

* every worker computes (a mean time, times a straggler factor drawn from a
  log-normal), on a GPU or on the host's CPU; with `overlap`, its gradients
  become ready key by key over the backward pass (the last 2/3 of the step),
  as the plugins' gradient hooks push them;
* each gradient is cut into keys of `partition_bytes` spread evenly over the
  servers; per key and worker one push-pull request of the key's bytes
  (halved with fp16), which costs CPU at the worker and at the server (a
  fixed part per request and a part per byte: the kernel's and psrt's copies)
  and crosses the hosts' links when worker and server are on different hosts;
* a server adds each push into the key's sum as it arrives, and applies the
  optimizer once every worker's push of it has arrived (the sync barrier,
  key by key), each at a calibrated cost per byte; with replicas it
  forwards the update to the key's backup on the next host, which applies it
  too, and answers only once both hold it;
* then every worker's pull answer goes back the same way, and the worker's
  step ends when its last key is back;
* with `local_sum` (docs/runtime.md, "Local aggregation"), a host's workers
  hand each key's gradient to its owner among them (a copy, at the cost of
  a pass), the owner sums the host's gradients (a pass each) and pushes once
  for the host, the server waits for one push a host, and the others copy
  the owner's answer (a pass each).

Resources are FIFO queues: each host's outgoing and incoming link (a rate, and
a token bucket's burst where the link is shaped with tc's tbf), and a pool of
CPU cores, one per host, or one shared by all hosts (the network-namespace
hosts of the validation share one VM's cores). Parameters come from
calibrate.py (this machine) or, for the predictions, from predict.py's stated
hardware. The model is deliberately small: everything that is not one of the
quantities above is in the calibrated per-request and per-byte costs.
"""

import dataclasses
import heapq
import itertools
import random


@dataclasses.dataclass
class Costs:
    """What moving and applying bytes costs; calibrate.py fits these."""
    request_cpu_s: float = 20e-6  # CPU per request at each end (worker, server), each way
    byte_cpu_s: float = 0.25e-9  # CPU per byte at each end, each way (copies, syscalls)
    accumulate_cpu_s: float = 0.1e-9  # CPU per fp32 byte to add a push into the key's sum
    apply_cpu_s: float = 0.1e-9  # CPU per fp32 byte of the optimizer, once a key and step
    fp16_cpu_s: float = 0.05e-9  # CPU per fp32 byte to convert to fp16 and back
    hop_latency_s: float = 15e-6  # a message's wake-ups and stack traversal (not CPU)


@dataclasses.dataclass
class Cluster:
    hosts: int
    workers_per_host: int = 1
    servers_per_host: int = 1
    out_bytes_per_s: float = 1.25e9  # each host's outgoing link
    in_bytes_per_s: float = 1.25e9  # each host's incoming link
    burst_bytes: float = 0  # tbf's bucket on the outgoing link; 0: a plain rate
    line_bytes_per_s: float = 0  # the line behind a tbf (its burst goes at this)
    link_latency_s: float = 50e-6  # one way, host to host
    cores_per_host: float = 8  # for the servers and the workers' sends
    shared_cores: int = 0  # >0: all hosts share this many cores (one VM)
    local_sum: bool = False  # a host's workers sum first and push once a host


@dataclasses.dataclass
class Job:
    params: int  # fp32 values pushed and pulled per worker and step
    compute_s: float  # a step's compute per worker, mean
    batch: int = 1  # samples per worker and step
    compute_on_cpu: bool = False  # the compute takes one of the host's cores
    overlap: bool = False  # gradients ready key by key over the backward pass
    straggler_sigma: float = 0.0  # log-normal sigma of each step's compute
    partition_bytes: int = 256 << 10
    fp16: bool = False
    replicas: int = 0
    sparse_bytes: int = 0  # embedding rows pushed and pulled per worker and step
    # The variables' names and sizes, where they matter: psrt starts each
    # variable's keys at the server its name hashes to. None: one variable
    # of `params`.
    variables: tuple = None


def stable_hash(name):
    """common/key_map.cc's StableHash: 64-bit FNV-1a."""
    h = 14695981039346656037
    for c in name.encode():
        h = ((h ^ c) * 1099511628211) % (1 << 64)
    return h


def partition(name, params, partition_bytes, servers):
    """common/key_map.cc's PartitionVariable: equal keys of at most
    partition_bytes, round robin from the server the name hashes to."""
    per_max = max(1, partition_bytes // 4)
    parts = -(-params // per_max)
    per = -(-params // parts)
    first = stable_hash(name) % servers
    return [((first + p) % servers, 4.0 * min(per, params - p * per)) for p in range(parts)]


class _Cpu:
    """c cores, FIFO: a task starts on the first core free."""

    def __init__(self, cores):
        self.free = [0.0] * max(1, int(cores))

    def run(self, t, seconds):
        start = max(t, heapq.heappop(self.free))
        heapq.heappush(self.free, start + seconds)
        return start + seconds


class _Link:
    """One direction of a host's link: a rate, or tbf's token bucket."""

    def __init__(self, rate, burst=0.0, line=0.0):
        self.rate, self.burst, self.line = rate, burst, line or rate * 100
        self.free = 0.0
        self.tokens, self.at = burst, 0.0

    def send(self, t, nbytes):
        start = max(t, self.free)
        if self.burst > 0:
            tokens = min(self.burst, self.tokens + (start - self.at) * self.rate)
            fast = min(tokens, nbytes)
            seconds = fast / self.line + (nbytes - fast) / self.rate
            self.tokens, self.at = tokens - fast, start + seconds
        else:
            seconds = nbytes / self.rate
        self.free = start + seconds
        return self.free


class _Sim:
    def __init__(self, cluster, job, costs, steps, seed):
        self.c, self.j, self.k = cluster, job, costs
        self.steps = steps
        self.rng = random.Random(seed)
        self.events = []
        self.seq = itertools.count()
        n_hosts = cluster.hosts
        shared = _Cpu(cluster.shared_cores) if cluster.shared_cores else None
        self.cpu = [shared or _Cpu(cluster.cores_per_host) for _ in range(n_hosts)]
        self.out = [_Link(cluster.out_bytes_per_s, cluster.burst_bytes, cluster.line_bytes_per_s)
                    for _ in range(n_hosts)]
        self.inl = [_Link(cluster.in_bytes_per_s) for _ in range(n_hosts)]
        self.workers = n_hosts * cluster.workers_per_host
        self.servers = n_hosts * cluster.servers_per_host
        # Keys: (server, fp32 bytes), placed as psrt places them (the
        # sparse rows: one request per server).
        self.keys = []
        for name, params in job.variables or (("model", job.params),):
            self.keys += partition(name, params, job.partition_bytes, self.servers)
        # A simulation of 256 workers with thousands of keys each would take
        # hours: a worker's keys on one server merge into a few requests,
        # at most 256 a worker (the per-request costs are still counted per
        # key).
        most = max(1, min(64, 256 // self.servers))
        self.chunks = self._merge(self.keys, most, False)
        if job.sparse_bytes:
            # Rows spread evenly over the servers, in requests of at most
            # partition_bytes.
            n = -(-job.sparse_bytes // job.partition_bytes)
            rows = [(i % self.servers, job.sparse_bytes / n) for i in range(n)]
            self.chunks += self._merge(rows, most, True)
        self.step_end = [[0.0] * steps for _ in range(self.workers)]
        self.local = cluster.local_sum and cluster.workers_per_host > 1
        self.pushers = n_hosts if self.local else self.workers
        self.handed = {}

    @staticmethod
    def _merge(keys, most, sparse):
        """(server, fp32 bytes, requests, sparse) in the order they are sent:
        round robin over the servers, as the keys are."""
        per_server = {}
        for s, b in keys:
            per_server.setdefault(s, []).append(b)
        chunks = []
        for s, sizes in per_server.items():
            groups = min(most, len(sizes))
            for g in range(groups):
                part = sizes[g::groups]
                chunks.append((g, s, float(sum(part)), len(part)))
        chunks.sort()
        return [(s, b, n, sparse) for _, s, b, n in chunks]

    def at(self, t, fn, *args):
        heapq.heappush(self.events, (t, next(self.seq), fn, args))

    def worker_host(self, w):
        return w // self.c.workers_per_host

    def server_host(self, s):
        return s // self.c.servers_per_host

    def wire(self, fp32_bytes, sparse):
        return fp32_bytes if sparse or not self.j.fp16 else fp32_bytes / 2

    def cpu_cost(self, fp32_bytes, nreq, sparse):
        k = self.k
        cost = nreq * k.request_cpu_s + self.wire(fp32_bytes, sparse) * k.byte_cpu_s
        if self.j.fp16 and not sparse:
            cost += fp32_bytes * k.fp16_cpu_s / 2
        return cost

    def transfer(self, t, src, dst, nbytes):
        """When a message sent at t from host src is at host dst."""
        return self.send_together(src, [(t, dst, nbytes)])[0]

    def send_together(self, src, messages):
        """When each of `messages` ((ready time, destination host, bytes)),
        sent by host src at about the same time, is at its destination.
        Their TCP streams share src's link fairly, so the remote ones leave
        together, once all their bytes have gone (FIFO would let the first
        destination have its bytes a whole batch early)."""
        hop, latency = self.k.hop_latency_s, self.c.link_latency_s
        remote = [m for m in messages if m[1] != src]
        leave = 0.0
        if remote:
            leave = self.out[src].send(min(m[0] for m in remote) + hop, sum(m[2] for m in remote))
        arrivals = []
        for ready, dst, nbytes in messages:
            if dst == src:
                arrivals.append(ready + hop)
            else:
                arrive = self.inl[dst].send(ready + hop + latency, nbytes)
                arrivals.append(max(leave + latency, arrive))
        return arrivals

    def run(self):
        c, j = self.c, self.j
        n_chunks = len(self.chunks)
        self.arrived = [[0] * n_chunks for _ in range(self.steps)]
        self.done = [[0] * self.workers for _ in range(self.steps)]
        for w in range(self.workers):
            self.at(0.0, self.start_step, w, 0)
        while self.events:
            t, _, fn, args = heapq.heappop(self.events)
            fn(t, *args)
        return self.step_end

    def start_step(self, t, w, step):
        j = self.j
        seconds = j.compute_s * (self.rng.lognormvariate(0, j.straggler_sigma)
                                 if j.straggler_sigma else 1.0)
        host = self.worker_host(w)
        if j.compute_on_cpu:
            # Slices of 1 ms, so that the servers' requests interleave with
            # it as the kernel's scheduler lets them.
            self.at(t, self.compute_slice, w, step, seconds)
            return
        n = len(self.chunks)
        if not j.overlap:
            self.at(t + seconds, self.push, w, step, range(n))
            return
        for i in range(n):
            self.at(t + seconds * (1 / 3 + 2 / 3 * (i + 1) / n), self.push, w, step, [i])

    def compute_slice(self, t, w, step, left):
        end = self.cpu[self.worker_host(w)].run(t, min(left, 1e-3))
        if left > 1e-3:
            self.at(end, self.compute_slice, w, step, left - 1e-3)
        else:
            self.at(end, self.push, w, step, range(len(self.chunks)))

    def owner(self, host, i):
        """The worker of `host` that sums and pushes chunk i (local_sum)."""
        return host * self.c.workers_per_host + i % self.c.workers_per_host

    def push(self, t, w, step, chunks):
        """Worker w's pushes of `chunks`, ready at t."""
        wh = self.worker_host(w)
        if self.local:
            for i in chunks:
                fp32 = self.chunks[i][1]
                ready = t if w == self.owner(wh, i) else self.cpu[wh].run(t, fp32 * self.k.accumulate_cpu_s)
                self.at(ready, self.hand_over, wh, step, i)
            return
        messages = []
        for i in chunks:
            s, fp32, nreq, sparse = self.chunks[i]
            ready = self.cpu[wh].run(t, self.cpu_cost(fp32, nreq, sparse))
            messages.append((ready, self.server_host(s), self.wire(fp32, sparse)))
        for i, arrival in zip(chunks, self.send_together(wh, messages)):
            self.at(arrival, self.server_receive, w, step, i)

    def hand_over(self, t, host, step, i):
        """One of `host`'s gradients of chunk i is in its owner's hands; with
        the last, the owner sums them and pushes once for the host."""
        key = (step, host, i)
        self.handed[key] = self.handed.get(key, 0) + 1
        if self.handed[key] < self.c.workers_per_host:
            return
        del self.handed[key]
        s, fp32, nreq, sparse = self.chunks[i]
        t = self.cpu[host].run(t, (self.c.workers_per_host - 1) * fp32 * self.k.accumulate_cpu_s)
        ready = self.cpu[host].run(t, self.cpu_cost(fp32, nreq, sparse))
        arrival = self.transfer(ready, host, self.server_host(s), self.wire(fp32, sparse))
        self.at(arrival, self.server_receive, self.owner(host, i), step, i)

    def server_receive(self, t, w, step, i):
        s, fp32, nreq, sparse = self.chunks[i]
        sh = self.server_host(s)
        t = self.cpu[sh].run(t, self.cpu_cost(fp32, nreq, sparse) + fp32 * self.k.accumulate_cpu_s)
        self.arrived[step][i] += 1
        if self.arrived[step][i] < self.pushers:
            return
        published = self.cpu[sh].run(t, fp32 * self.k.apply_cpu_s)
        if self.j.replicas:
            # The backup, on the next host, applies it too, while this
            # server does; published once both hold it.
            bh = (sh + 1) % self.c.hosts
            fwd = self.transfer(t, sh, bh, self.wire(fp32, sparse))
            fwd = self.cpu[bh].run(fwd, self.cpu_cost(fp32, nreq, sparse) + fp32 * self.k.apply_cpu_s)
            published = max(published, self.transfer(fwd, bh, sh, 64 * nreq))
        # Every pusher's answer, sent together.
        pushers = ([self.owner(h, i) for h in range(self.c.hosts)] if self.local
                   else range(self.workers))
        messages = []
        for w2 in pushers:
            ready = self.cpu[sh].run(published, self.cpu_cost(fp32, nreq, sparse))
            messages.append((ready, self.worker_host(w2), self.wire(fp32, sparse)))
        for w2, arrival in zip(pushers, self.send_together(sh, messages)):
            self.at(arrival, self.worker_receive, w2, step, i)

    def worker_receive(self, t, w, step, i):
        s, fp32, nreq, sparse = self.chunks[i]
        host = self.worker_host(w)
        t = self.cpu[host].run(t, self.cpu_cost(fp32, nreq, sparse))
        if self.local:
            # The owner's answer; the host's others copy it.
            for w2 in range(host * self.c.workers_per_host, (host + 1) * self.c.workers_per_host):
                if w2 != w:
                    self.finish(self.cpu[host].run(t, fp32 * self.k.accumulate_cpu_s), w2, step)
        self.finish(t, w, step)

    def finish(self, t, w, step):
        """One of worker w's chunks of `step` is back at t (its copies may
        be counted before an earlier one's: the step ends at the latest)."""
        self.done[step][w] += 1
        self.step_end[w][step] = max(self.step_end[w][step], t)
        if self.done[step][w] == len(self.chunks) and step + 1 < self.steps:
            self.at(self.step_end[w][step], self.start_step, w, step + 1)


def simulate(cluster, job, costs, steps=4, warmup=1, seed=1):
    """Samples/s of the whole job in its steady state (steps after `warmup`)."""
    sim = _Sim(cluster, job, costs, steps, seed)
    ends = sim.run()
    first = max(e[warmup - 1] for e in ends) if warmup else 0.0
    last = max(e[-1] for e in ends)
    return sim.workers * job.batch * (steps - warmup) / (last - first)


def efficiency(cluster, job, costs, steps=4, warmup=1, seed=1):
    """Samples/s over (workers x one worker's samples/s with no communication)."""
    alone = job.batch / job.compute_s
    workers = cluster.hosts * cluster.workers_per_host
    return simulate(cluster, job, costs, steps, warmup, seed) / (workers * alone)
