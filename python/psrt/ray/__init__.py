"""psrt jobs on a Ray cluster, as Horovod's ``horovod.ray``.

::

    import psrt.ray

    def train(epochs):
        import psrt.torch as psrt
        psrt.init()
        ...                                  # the usual training loop
        return accuracy

    executor = psrt.ray.RayExecutor(num_workers=4, num_hosts=2, cpus_per_worker=2,
                                    distribution={"parameter_server": {"mode": "sync"}})
    executor.start()
    accuracies = executor.run(train, kwargs={"epochs": 5})   # one result per rank
    executor.shutdown()

``start()`` reserves one placement-group bundle per host (on distinct nodes
with the default STRICT_SPREAD) and places in it an actor that runs the
host's ``psrt-worker`` agent, which runs the host's ``psrt-server`` (one per
node by default, ``servers_per_host`` in the distribution), and one actor
per training rank; host 0's bundle also holds the actor that runs
``psrt-coordinator``. Each ``run()`` is one psrt job: the coordinator and the
agents start, every worker actor calls the function in its own process with
the environment the agent gives a training process (``PSRT_COORDINATOR``,
``PSRT_RANK``, ...), and the agent reports the function's end to the
coordinator as it would a training process's exit. Each program an actor
starts dies with the actor.
"""

import gc
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
import traceback

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from psrt import _relay
from psrt._programs import find_programs

__all__ = ["RayExecutor", "TrainingError"]

_PROGRAMS = ("psrt-coordinator", "psrt-server", "psrt-worker")
class TrainingError(RuntimeError):
    """A training function raised (or its actor died). ``rank`` and ``host``
    say where; ``cause`` is the exception itself when it could travel to the
    driver; the message holds its remote traceback."""

    def __init__(self, message, rank, host, cause=None):
        super().__init__(message)
        self.rank = rank
        self.host = host
        self.cause = cause


class _Daemon:
    """What the coordinator's and the hosts' actors share: one psrt program
    per job, and a directory of its own."""

    def __init__(self, bin_dir):
        try:
            self._bin = find_programs(_PROGRAMS, bin_dir)
        except FileNotFoundError as e:
            raise FileNotFoundError("node %s: %s" % (ray.util.get_node_ip_address(), e)) from None
        self._process = None
        self._dir = None

    def node(self):
        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "pid": os.getpid()}

    def _new_job(self, prefix):
        self.stop()
        self._dir = tempfile.mkdtemp(prefix=prefix)

    def wait(self, timeout_s):
        return None if self._process is None else self._process.wait(timeout_s)

    def stop(self):
        status = None if self._process is None else self._process.stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        return status


class _CoordinatorActor(_Daemon):
    def start(self, hosts, distribution, token, timeout_s):
        """Starts psrt-coordinator for `hosts`; returns its address once it
        listens."""
        self._new_job("psrt-ray-coordinator-")
        port_file = os.path.join(self._dir, "port")
        argv = [os.path.join(self._bin, "psrt-coordinator"), "--hosts=" + ",".join(hosts),
                "--distribution=" + distribution, "--bind=0.0.0.0", "--port=0", "--port-file=" + port_file]
        self._process = _relay.Process("psrt-coordinator", argv, dict(os.environ, PSRT_JOB_TOKEN=token))
        try:
            return self._address(port_file, timeout_s)
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)  # the port file's only
            self._dir = None

    def _address(self, port_file, timeout_s):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with open(port_file) as f:
                    port = int(f.read() or 0)
            except (OSError, ValueError):
                port = 0
            if port > 0:
                return "%s:%d" % (ray.util.get_node_ip_address(), port)
            if self._process.proc.poll() is not None:
                status = self._process.wait(1.0)
                raise RuntimeError("psrt-coordinator exited with code %d before it was listening:\n%s"
                                   % (status["code"], status["output"]))
            time.sleep(0.02)
        raise TimeoutError("psrt-coordinator did not report its port in %s within %g s" % (port_file, timeout_s))


class _HostActor(_Daemon):
    def start(self, coordinator, index, name, token, connect_timeout_s):
        """Starts this host's psrt-worker agent, which starts its servers and
        one relay per training rank; returns the directory where the relays
        leave their environment for the worker actors."""
        self._new_job("psrt-ray-host%d-" % index)
        job_dir = self._dir
        argv = [os.path.join(self._bin, "psrt-worker"), "--coordinator=" + coordinator,
                "--host-index=%d" % index, "--host=" + name, "--connect-timeout=%g" % connect_timeout_s,
                "--servers", "--server-host=" + ray.util.get_node_ip_address(),
                "--", sys.executable, "-c", _relay.RELAY, job_dir]

        def tell_workers(code, output):
            # A worker actor still waiting for its relay stops waiting.
            if os.path.isdir(job_dir):
                _relay.write_atomically(os.path.join(job_dir, "agent.exit"), json.dumps([code, output]))

        self._process = _relay.Process("psrt-worker[%d]" % index, argv, dict(os.environ, PSRT_JOB_TOKEN=token),
                                 on_exit=tell_workers)
        return job_dir

    def end_rank(self, local_rank):
        """Fails the training process of `local_rank` whose worker actor
        could not report its end (it died): the job ends now rather than at
        a timeout."""
        if self._dir is not None:
            _relay.end_relay(self._dir, local_rank, 1)


class _WorkerActor:
    def node(self):
        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "pid": os.getpid(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    def run(self, payload, rank, job_dir, local_rank, agent_name, timeout_s, visible_devices):
        saved = dict(os.environ)
        code = 1
        try:
            os.environ.update(self._environment(job_dir, local_rank, agent_name, timeout_s))
            if visible_devices:
                os.environ["CUDA_VISIBLE_DEVICES"] = visible_devices
            # Loaded here, not as an argument of the task, so that a function
            # that cannot be loaded on this node fails the job at once.
            fn, args, kwargs = ray.cloudpickle.loads(payload)
            outcome = {"ok": True, "rank": rank, "result": fn(*args, **kwargs)}
            code = 0
        except Exception as e:
            outcome = {"ok": False, "rank": rank, "time": time.time(), "traceback": traceback.format_exc(),
                       "what": "%s: %s" % (type(e).__name__, e), "exception": e}
            try:
                ray.cloudpickle.dumps(e)
            except Exception:
                outcome["exception"] = None
        finally:
            # The next run() joins a new job: psrt.init() connects again, and
            # the last job's client goes with the objects that held it.
            if "psrt" in sys.modules:
                sys.modules["psrt"]._client = None
            gc.collect()
            os.environ.clear()
            os.environ.update(saved)
            _relay.end_relay(job_dir, local_rank, code)
        return outcome

    @staticmethod
    def _environment(job_dir, local_rank, agent_name, timeout_s):
        agent_exit = os.path.join(job_dir, "agent.exit")

        def gone():
            if not os.path.exists(agent_exit):
                return None
            with open(agent_exit) as f:
                code, output = json.load(f)
            return "%s exited with code %d before it started the training process of local rank %d:\n%s" % (
                agent_name, code, local_rank, output)

        return _relay.take_environment(job_dir, local_rank, timeout_s, gone, agent_name)


_Coordinator = ray.remote(_CoordinatorActor)
_Host = ray.remote(_HostActor)
_Worker = ray.remote(_WorkerActor)


class _Actors:
    """An executor's actors and where they are; run() keeps its own
    reference, so that a shutdown() meanwhile cannot pull them away."""

    def __init__(self, coordinator, hosts, workers, layout):
        self.coordinator, self.hosts, self.workers, self.layout = coordinator, hosts, workers, layout
        self.per_host = len(workers) // len(hosts)

    def host_of(self, rank):
        return self.layout[rank // self.per_host]

    def daemons(self):
        """(actor, the program it runs) of the hosts and the coordinator."""
        named = [(a, "psrt-worker[%d] on %s" % (h["index"], h["name"])) for a, h in zip(self.hosts, self.layout)]
        return named + [(self.coordinator, "psrt-coordinator")]


class RayExecutor:
    """Runs psrt jobs on the Ray cluster this process is connected to
    (``ray.init()``; started here when it is not).

    num_workers: training ranks. num_hosts: placement-group bundles, each a
    host of the job with its own psrt-server(s) and num_workers / num_hosts
    ranks; by default as many nodes as can hold a worker, at most
    num_workers and a divisor of it. num_workers_per_host: with num_hosts,
    instead of num_workers. cpus_per_worker, use_gpu, gpus_per_worker: each
    rank's resources (a bundle holds its ranks'). distribution: the
    ``parameter_server`` option as psrt-run takes it; ``workers_per_host``
    is set from the layout. placement_strategy: STRICT_SPREAD (a node per
    host), SPREAD, PACK or STRICT_PACK. bin_dir: where psrt-coordinator,
    psrt-server and psrt-worker are on every node (default: $PSRT_BIN_DIR,
    else where psrt's wheel installs them for the Python that runs the
    actors, else PATH). token: the job token (default: a random
    one). start_timeout_s: how long start() waits for the placement group
    and each kind of actor, and run() for the job's programs to come up and,
    with the job's heartbeat timeout on top, to exit at its end.
    """

    def __init__(self, num_workers=None, num_hosts=None, num_workers_per_host=None, cpus_per_worker=1,
                 use_gpu=False, gpus_per_worker=None, distribution=None, placement_strategy="STRICT_SPREAD",
                 bin_dir=None, token=None, start_timeout_s=60.0):
        if num_workers_per_host is not None:
            if num_hosts is None:
                raise ValueError("num_workers_per_host needs num_hosts")
            if num_workers is not None and num_workers != num_hosts * num_workers_per_host:
                raise ValueError("num_workers %d is not num_hosts %d x num_workers_per_host %d"
                                 % (num_workers, num_hosts, num_workers_per_host))
            num_workers = num_hosts * num_workers_per_host
        if not num_workers or num_workers < 1:
            raise ValueError("RayExecutor needs num_workers >= 1 (or num_hosts and num_workers_per_host)")
        if num_hosts is not None and (num_hosts < 1 or num_workers % num_hosts):
            raise ValueError("num_workers %d cannot be spread evenly over num_hosts %d" % (num_workers, num_hosts))
        self._num_workers = num_workers
        self._num_hosts = num_hosts
        self._cpus = cpus_per_worker
        self._gpus = (1 if gpus_per_worker is None else gpus_per_worker) if use_gpu else 0
        self._ps = self._parameter_server(distribution)
        elastic = self._ps.get("elastic", {}).get("max_workers", num_workers)
        if elastic != num_workers:
            raise ValueError("elastic.max_workers %s is not num_workers %d: psrt.ray starts a worker actor "
                             "per rank" % (elastic, num_workers))
        self._strategy = placement_strategy
        self._bin_dir = bin_dir or os.environ.get("PSRT_BIN_DIR")
        self._token = token or secrets.token_hex(16)
        self._start_timeout_s = start_timeout_s
        self._job_ps = None  # with the layout start() chose
        self._pg = None
        self._actors = None

    @staticmethod
    def _parameter_server(distribution):
        ps = dict((distribution or {}).get("parameter_server", {}))
        ps.setdefault("enabled", True)
        # A worker actor calls the training function once per run(): it
        # cannot be started again as a training process can.
        if ps.get("restart_workers", 0):
            raise ValueError("restart_workers is not supported by psrt.ray: a failed training function "
                             "ends the run")
        if ps.get("on_failure") == "recover":
            raise ValueError('on_failure "recover" is not supported by psrt.ray: it restarts training '
                             "processes, and a training function runs once per run()")
        return ps

    def _count_hosts(self):
        if self._num_hosts is not None:
            return self._num_hosts
        fit = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) >= self._cpus and
               n["Resources"].get("GPU", 0) >= self._gpus]
        hosts = max(1, min(self._num_workers, len(fit)))
        while self._num_workers % hosts:
            hosts -= 1
        return hosts

    def start(self):
        """Reserves the placement group and starts the actors."""
        if self._pg is not None:
            return
        if not ray.is_initialized():
            ray.init()
        num_hosts = self._count_hosts()
        per_host = self._num_workers // num_hosts
        if self._ps.get("workers_per_host", per_host) != per_host:
            raise ValueError("the distribution's workers_per_host %s is not num_workers / num_hosts = %d"
                             % (self._ps["workers_per_host"], per_host))
        self._job_ps = dict(self._ps, workers_per_host=per_host)
        bundle = {"CPU": self._cpus * per_host}
        if self._gpus:
            bundle["GPU"] = self._gpus * per_host
        self._pg = placement_group([dict(bundle) for _ in range(num_hosts)], strategy=self._strategy)
        try:
            self._get(self._pg.ready(), "the placement group of %d bundles %s (%s); the cluster has %s free"
                      % (num_hosts, bundle, self._strategy, ray.available_resources()))

            def place(index):
                return PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=index)

            # The programs' actors take no CPU of their own: the bundle's
            # CPUs are the training ranks'.
            coordinator = _Coordinator.options(num_cpus=0, scheduling_strategy=place(0)).remote(self._bin_dir)
            hosts = [_Host.options(num_cpus=0, scheduling_strategy=place(h)).remote(self._bin_dir)
                     for h in range(num_hosts)]
            workers = [_Worker.options(num_cpus=self._cpus, num_gpus=self._gpus,
                                       scheduling_strategy=place(rank // per_host)).remote()
                       for rank in range(self._num_workers)]
            self._actors = _Actors(coordinator, hosts, workers, [])
            self._get(coordinator.node.remote(), "the coordinator's actor to start")
            nodes = self._get([a.node.remote() for a in hosts], "the hosts' actors to start")
            ranks = self._get([w.node.remote() for w in workers], "the worker actors to start")
        except BaseException:
            self.shutdown()
            raise
        # Host names as logs and errors show them; nodes of one machine (as
        # in a test cluster) share an IP address.
        ips = [n["ip"] for n in nodes]
        for h, n in enumerate(nodes):
            mine = list(range(h * per_host, (h + 1) * per_host))
            # Local rank i's device i is its own GPU (psrt.local_rank()).
            gpus = [g for r in mine for g in ranks[r]["gpu_ids"]]
            self._actors.layout.append(dict(
                n, index=h, ranks=mine, visible_devices=",".join(dict.fromkeys(gpus)),
                name=n["ip"] if ips.count(n["ip"]) == 1 else "%s/%s" % (n["ip"], n["node_id"][:8])))

    def hosts(self):
        """The job's hosts, by index: name, node_id, ip, ranks, and pid: the
        process of the actor that runs the host's psrt-worker agent."""
        layout = self._actors.layout if self._actors is not None else []
        return [{k: h[k] for k in ("index", "name", "node_id", "ip", "ranks", "pid")} for h in layout]

    def run(self, fn, args=None, kwargs=None, timeout_s=None):
        """Runs ``fn(*args, **kwargs)`` as every rank of a new psrt job;
        returns the results by rank. A function that raises ends the job and
        raises TrainingError here. timeout_s bounds the training (default:
        none; psrt's own heartbeats end a job whose processes are lost)."""
        actors = self._actors
        if actors is None or not actors.layout:
            raise RuntimeError("RayExecutor.run() before start()")
        payload = ray.put(ray.cloudpickle.dumps((fn, tuple(args or ()), dict(kwargs or {}))))
        job_dirs = self._start_job(actors)
        refs = {}
        for rank, worker in enumerate(actors.workers):
            host = actors.host_of(rank)
            refs[worker.run.remote(payload, rank, job_dirs[host["index"]], rank % actors.per_host,
                                   "psrt-worker[%d] on %s" % (host["index"], host["name"]),
                                   self._barrier_s() + self._start_timeout_s, host["visible_devices"])] = rank
        outcomes = {}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while len(outcomes) < len(refs):
            pending = [r for r in refs if refs[r] not in outcomes]
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                self._stop_job(actors)
                raise TimeoutError("the training functions of ranks %s did not return within %g s"
                                   % (sorted(refs[r] for r in pending), timeout_s))
            rank = refs[ready[0]]
            try:
                outcomes[rank] = ray.get(ready[0])
            except ray.exceptions.RayError as e:
                # Its relay learns of it, so the job ends now.
                actors.hosts[rank // actors.per_host].end_rank.remote(rank % actors.per_host)
                lines = [line for line in str(e).splitlines() if line.strip()] or [repr(e)]
                outcomes[rank] = {"ok": False, "rank": rank, "time": time.time(), "exception": None,
                                  "what": "its worker actor failed: " + lines[0], "traceback": str(e)}
        ended = self._end_job(actors)
        failed = sorted((o for o in outcomes.values() if not o["ok"]), key=lambda o: o["time"])
        if failed:
            raise self._training_error(actors, fn, failed) from failed[0]["exception"]
        if ended:
            raise RuntimeError("every training function returned, but the job failed:\n" + ended)
        return [outcomes[r]["result"] for r in range(self._num_workers)]

    @staticmethod
    def _training_error(actors, fn, failed):
        # The first failure is the cause; the others' follow from the job's end.
        first = failed[0]
        host = actors.host_of(first["rank"])["name"]
        message = "training function %r failed on rank %d (host %s): %s" % (
            getattr(fn, "__name__", fn), first["rank"], host, first["what"])
        if len(failed) > 1:
            message += "\nthen, as the job ended: " + "; ".join(
                "rank %d: %s" % (o["rank"], o["what"].splitlines()[0]) for o in failed[1:])
        if first["traceback"]:
            message += "\n\nrank %d's traceback:\n%s" % (first["rank"], first["traceback"])
        return TrainingError(message, first["rank"], host, first["exception"])

    def _barrier_s(self):
        return float(self._ps.get("barrier_timeout_s", 60))

    def _start_job(self, actors):
        """Starts the coordinator and every host's agent; returns the hosts'
        job directories."""
        address = self._get(
            actors.coordinator.start.remote([h["name"] for h in actors.layout],
                                            json.dumps({"parameter_server": self._job_ps}), self._token,
                                            self._start_timeout_s),
            "psrt-coordinator to listen", extra_s=10)
        try:
            return self._get([a.start.remote(address, h["index"], h["name"], self._token, self._barrier_s())
                              for a, h in zip(actors.hosts, actors.layout)], "the hosts' psrt-worker to start")
        except BaseException:
            self._stop_job(actors)
            raise

    def _end_job(self, actors):
        """Waits for the job's programs to exit, as they do once it ended;
        returns "" when they all succeeded, else what went wrong."""
        timeout_s = float(self._ps.get("heartbeat_timeout_s", 10)) + self._start_timeout_s
        waits = [(d.wait.remote(timeout_s), name) for d, name in actors.daemons()]
        deadline = time.monotonic() + timeout_s + 10
        problems = []
        for ref, name in waits:
            try:
                s = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except ray.exceptions.GetTimeoutError:
                problems.append("the actor of %s did not answer within %g s" % (name, timeout_s + 10))
            except ray.exceptions.RayError as e:
                problems.append("the actor of %s failed: %s" % (name, str(e).strip().splitlines()[0]))
            else:
                if s["code"] is None:
                    problems.append("%s did not exit within %g s of the training functions' end; stopped it"
                                    % (name, timeout_s))
                elif s["code"] != 0:
                    problems.append("%s exited with code %d:\n%s" % (name, s["code"], s["output"]))
        self._stop_job(actors)
        return "\n".join(problems)

    def _stop_job(self, actors):
        refs = [d.stop.remote() for d, _ in actors.daemons()]
        deadline = time.monotonic() + 2 * _relay.STOP_GRACE_S + 10
        for ref in refs:  # each on its own: a dead actor's error must not cut the others' stop short
            try:
                ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except ray.exceptions.RayError:
                pass  # shutdown() kills the actors and with them their programs

    def _get(self, refs, what, extra_s=0.0):
        timeout_s = self._start_timeout_s + extra_s
        try:
            return ray.get(refs, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError("timed out after %g s waiting for %s" % (timeout_s, what)) from None

    def shutdown(self):
        """Stops the job's programs and the actors, and frees the placement
        group; the executor can start() again."""
        actors, self._actors = self._actors, None
        if actors is not None:
            self._stop_job(actors)
            for actor in actors.workers + actors.hosts + [actors.coordinator]:
                ray.kill(actor)
        if self._pg is not None:
            remove_placement_group(self._pg)
            self._pg = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
