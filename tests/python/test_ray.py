"""psrt.ray on a local Ray cluster of three simulated nodes: the PyTorch
digits demo trains through a job whose coordinator, servers and training
functions are Ray actors, a training function that raises reaches the
driver, and neither an actor's death nor shutting the executor down during a
job leaves any of the job's processes behind.
The tests share one executor and run in order."""

import glob
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

import psrt.ray  # noqa: E402
from jobs import EXAMPLES, HERE, job_processes  # noqa: E402

NODES = 3
TOKEN = "ray-test-%d" % os.getpid()
PS = {"parameter_server": {"enabled": True, "mode": "sync", "heartbeat_timeout_s": 5}}


def start_cluster():
    # One CPU per node as Ray counts them (a worker's bundle) and a small
    # object store, so that three nodes fit a small machine.
    small = {"num_cpus": 1, "object_store_memory": 80 << 20}
    for attempt in (1, 2):
        cluster = Cluster()
        try:
            cluster.add_node(include_dashboard=False, **small)  # the head
            for _ in range(NODES - 1):
                cluster.add_node(**small)
            return cluster
        except Exception as e:
            # Ray gives a node 30 s to register with the head, which a
            # machine busy with other work can exceed: once more.
            cluster.shutdown()
            if attempt == 2 or "timed out during startup" not in str(e):
                raise


@pytest.fixture(scope="module")
def executor():
    cluster = start_cluster()
    # The actors unpickle this module's functions by importing it.
    path = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": path}})
    # Two workers and no num_hosts: a host per worker, on nodes of their own.
    ex = psrt.ray.RayExecutor(num_workers=2, distribution=PS, token=TOKEN)
    ex.start()
    yield ex
    ex.shutdown()
    ray.shutdown()
    cluster.shutdown()


def job_tree(token):
    """{pid: (parent pid, command line)} of the job's processes."""
    tree = {}
    for pid, cmd in job_processes(token).items():
        try:
            with open("/proc/%d/stat" % pid) as f:
                tree[pid] = (int(f.read().rsplit(")", 1)[1].split()[1]), cmd)
        except OSError:
            pass
    return tree


def programs(token):
    return sorted(cmd.split()[0].rsplit("/", 1)[-1] for cmd in job_processes(token).values()
                  if "/psrt-" in cmd.split()[0])


def train_digits(epochs):
    """The demo's training (torch_digits.py) as a psrt.ray function."""
    sys.path.insert(0, EXAMPLES)
    import argparse

    import torch
    from sklearn.datasets import load_digits

    import psrt.torch as psrt
    import torch_digits

    parser = argparse.ArgumentParser()
    torch_digits.add_arguments(parser)
    args = parser.parse_args(["--epochs", str(epochs)])
    psrt.init()
    x_train, x_test, y_train, y_test = torch_digits.split(*load_digits(return_X_y=True))
    model = torch_digits.train(args, x_train, y_train)
    with torch.no_grad():  # the forward pass waits for the last step's weights
        predicted = model(torch.tensor(x_test, dtype=torch.float32)).argmax(dim=1).numpy()
    return {"rank": psrt.rank(), "size": psrt.size(), "host": os.environ["PSRT_HOST"],
            "node": ray.get_runtime_context().get_node_id(),
            "accuracy": float((predicted == y_test).mean()),
            # The job ends once every rank returned: its programs run still.
            "processes": job_tree(os.environ["PSRT_JOB_TOKEN"])}


def test_the_digits_demo_trains_with_a_server_per_node(executor):
    hosts = executor.hosts()
    results = executor.run(train_digits, kwargs={"epochs": 5})
    # Each run is a job of its own, whose programs are gone once it ended.
    assert programs(TOKEN) == []

    assert [h["ranks"] for h in hosts] == [[0], [1]]
    assert len({h["node_id"] for h in hosts}) == 2
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == 2 for r in results)
    for r in results:
        assert r["node"] == hosts[r["rank"]]["node_id"]
        assert r["host"] == hosts[r["rank"]]["name"]
    # Sync mode: every rank ends with the servers' weights.
    assert results[0]["accuracy"] >= 0.9, results
    assert results[0]["accuracy"] == results[1]["accuracy"]

    # Server i runs under host i's agent, which runs in host i's actor.
    tree = results[0]["processes"]
    agents = {pid: cmd for pid, (_, cmd) in tree.items() if "psrt-worker " in cmd}
    servers = {pid: cmd for pid, (_, cmd) in tree.items() if "psrt-server " in cmd}
    assert sum("psrt-coordinator " in cmd for _, cmd in tree.values()) == 1
    assert len(agents) == len(servers) == 2, tree
    for pid, cmd in servers.items():
        index = int(cmd.split("--index=")[1].split()[0])
        agent = tree[pid][0]
        assert "--host-index=%d " % index in agents[agent]
        assert tree[agent][0] == hosts[index]["pid"]


def fail_on_rank_1():
    import torch

    import psrt.torch as psrt

    psrt.init()
    if psrt.rank() == 1:
        raise ValueError("rank 1 gives up")
    model = torch.nn.Linear(2, 1)
    opt = psrt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    named_parameters=model.named_parameters())
    for _ in range(100):  # sync: the first step needs rank 1's push
        opt.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        opt.step()


def rank_and_host():
    import psrt

    psrt.init()
    return psrt.rank(), os.environ["PSRT_HOST"]


def test_a_failing_function_reaches_the_driver_and_the_next_run_works(executor):
    with pytest.raises(psrt.ray.TrainingError) as failed:
        executor.run(fail_on_rank_1)
    e = failed.value
    assert e.rank == 1
    assert isinstance(e.cause, ValueError)
    assert "training function 'fail_on_rank_1' failed on rank 1" in str(e)
    assert "ValueError: rank 1 gives up" in str(e)
    # Rank 0 learnt of the job's end rather than waiting for rank 1.
    assert "rank 0: " in str(e)
    assert programs(TOKEN) == []

    names = [h["name"] for h in executor.hosts()]
    assert executor.run(rank_and_host) == [(0, names[0]), (1, names[1])]


def wait_forever(ready_dir):
    import psrt

    psrt.init()
    open(os.path.join(ready_dir, str(psrt.rank())), "w").close()
    threading.Event().wait()


def test_an_actor_s_death_and_shutdown_leave_none_of_the_job_s_processes(executor, tmp_path):
    job_dirs = set(glob.glob(os.path.join(tempfile.gettempdir(), "psrt-ray-host1-*")))
    outcome = []

    def run():
        try:
            executor.run(wait_forever, args=(str(tmp_path),))
        except Exception as e:
            outcome.append(e)

    runner = threading.Thread(target=run)
    runner.start()
    # Both ranks joined the job (and wait outside psrt from then on).
    deadline = time.monotonic() + 120
    while sorted(os.listdir(tmp_path)) != ["0", "1"]:
        assert time.monotonic() < deadline and runner.is_alive(), (outcome, programs(TOKEN))
        time.sleep(0.2)
    # The coordinator, and per host an agent and a server.
    assert programs(TOKEN) == ["psrt-coordinator", "psrt-server", "psrt-server", "psrt-worker", "psrt-worker"]

    # Host 1's actor dies: its agent and server go with it.
    host = executor.hosts()[1]["pid"]
    tree = job_tree(TOKEN)
    agent = [pid for pid, (parent, _) in tree.items() if parent == host]
    theirs = agent + [pid for pid, (parent, _) in tree.items() if parent in agent]
    assert len(theirs) == 3, tree  # the agent, its server and its relay
    os.kill(host, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while set(theirs) & set(job_processes(TOKEN)):
        assert time.monotonic() < deadline, job_tree(TOKEN)
        time.sleep(0.1)

    executor.shutdown()
    runner.join(120)
    assert not runner.is_alive()
    assert isinstance(outcome[0], psrt.ray.TrainingError)
    assert "worker actor failed" in str(outcome[0])
    # Stopped programs may take a moment to be gone from /proc.
    deadline = time.monotonic() + 10
    while job_processes(TOKEN) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job_processes(TOKEN) == {}
    # A killed actor cannot remove its job's directory.
    for d in set(glob.glob(os.path.join(tempfile.gettempdir(), "psrt-ray-host1-*"))) - job_dirs:
        shutil.rmtree(d, ignore_errors=True)
