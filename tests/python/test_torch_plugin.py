"""The PyTorch plugin in real jobs: psrt-run, the daemons and training
processes that import psrt.torch, over loopback.

Run by ctest (tests/CMakeLists.txt) with PYTHONPATH holding the built package
and PSRT_BIN_DIR the programs.
"""

import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import torch

from jobs import EXAMPLES, HERE, ONE_HOST, job_command, job_processes, run_job as _run_job
import torch_worker


def run_job(script_args, ps=None, hosts=2, timeout=240, script=None):
    return _run_job(script or os.path.join(HERE, "torch_worker.py"), script_args, ps, hosts, timeout)


def reference(kind, steps, workers, passes=1):
    """One process, the same torch optimizer, on the mean of the workers'
    gradients (each summed over `passes` batches) at the same weights."""
    torch.manual_seed(0)
    model = torch_worker.build_model()
    opt, scheduler = torch_worker.make_optimizer(kind, model)
    for step in range(steps):
        grads = []
        for rank in range(workers):
            model.zero_grad()
            for k in range(passes):
                x, y = torch_worker.batch(step * passes + k, rank)
                torch.nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = sum(g[i] for g in grads) / workers
        opt.step()
        if scheduler is not None:
            scheduler.step()
    return model.state_dict()


SYNC = [("sgd", 1, False), ("adam", 1, False), ("adamw", 1, False), ("adagrad", 1, False), ("sgd", 2, False),
        ("sgd", 1, True)]
SYNC_STEPS = 10


def trained_in_one_job(configs, arguments, ps=None, hosts=2):
    """{configuration: rank 0's final parameters}, `configs` trained one after
    the other in one job (torch_worker.py --configs: each its own parameters'
    names; a job's time is mostly its workers' start and torch's import)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "final.pt")
        code, log = run_job(["--configs", json.dumps([arguments(*c) for c in configs]), "--out", out], ps=ps,
                            hosts=hosts)
        if (ps or {}).get("workers_per_host", 1) > 1:
            assert "each host summing first" in log, log
        assert code == 0, log
        return {c: torch.load("%s.c%d" % (out, i)) for i, c in enumerate(configs)}


@pytest.fixture(scope="module")
def sync_trained():
    return trained_in_one_job(SYNC, lambda kind, passes, overlap: (
        ["--optimizer", kind, "--steps", str(SYNC_STEPS), "--passes", str(passes)] +
        (["--check-overlap"] if overlap else [])), ps={"partition_bytes": 4096})


@pytest.mark.parametrize("kind,passes,overlap", SYNC)
def test_sync_two_workers_equal_one_process_on_the_mean_gradient(kind, passes, overlap, sync_trained):
    """SGD with momentum, Nesterov, weight decay, two param groups and a
    StepLR schedule; Adam with weight decay; AdamW with two groups; Adagrad
    with lr_decay; SGD accumulating 2 backward passes per step; SGD checking
    after every step that each layer gets its new weights at its own forward
    pass, not at step(). Tolerance: 1e-5 absolute (float32 sums in another
    order). The six train one after the other in one job."""
    got = sync_trained[(kind, passes, overlap)]
    want = reference(kind, SYNC_STEPS, 2, passes)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=1e-5, msg=lambda m: name + ": " + m)
    # And the run really trained: far from rank 0's initial values.
    torch.manual_seed(0)
    initial = torch_worker.build_model().state_dict()
    assert max((got[n] - initial[n]).abs().max().item() for n in initial) > 1e-2


def two_heads_reference(kind, steps, workers, clip, missing_as_zeros=False):
    """One process on the global batch: the mean of the workers'
    gradients, a worker without one adding zero, and .grad None where no
    worker had one (torch's optimizer then skips the parameter).
    missing_as_zeros: a missing gradient is zeros, so the optimizer steps
    every parameter at every step."""
    torch.manual_seed(0)
    model = torch_worker.TwoHeads()
    opt = torch_worker.make_two_heads_optimizer(kind, model)
    for step in range(steps):
        grads = []
        for rank in range(workers):
            model.zero_grad(set_to_none=True)
            torch_worker.two_heads_loss(model, step, rank).backward()
            grads.append([None if p.grad is None else p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            given = [g[i] for g in grads if g[i] is not None]
            p.grad = sum(given) / workers if given else None
            if p.grad is None and missing_as_zeros:
                p.grad = torch.zeros_like(p)
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return model.state_dict()


UNUSED = [("adam", 0, 2), ("sgd", 0, 2), ("adamw", 0, 2), ("adam", 0.05, 2), ("adam", 0, 1), ("adam", 0.05, 1)]
UNUSED_STEPS = 7


@pytest.fixture(scope="module")
def unused_trained():
    """The cases of each number of hosts in one job."""
    got = {}
    for hosts in (2, 1):
        got.update(trained_in_one_job(
            [c for c in UNUSED if c[2] == hosts],
            lambda kind, clip, hosts: (["--unused-head", "--optimizer", kind, "--steps", str(UNUSED_STEPS)] +
                                       (["--clip", str(clip)] if clip else [])),
            ps=ONE_HOST if hosts == 1 else None, hosts=hosts))
    return got


@pytest.mark.parametrize("kind,clip,hosts", UNUSED)
def test_a_parameter_without_a_gradient_on_some_steps_trains_as_in_one_process(kind, clip, hosts, unused_trained):
    """The auxiliary head has a gradient on every rank, on rank 0 only, or
    on none, step by step. Where none has one, Adam's moments and step
    count, SGD's momentum and weight decay leave it alone, as torch's
    optimizer does; where rank 0 alone has one, rank 1 counts as zeros in
    the mean. With a clip (mean_grads) the head's .grad is None where no
    worker had one. On one host the two processes sum first: the host's
    sum takes rank 0's alone, or says none. 7 steps: each case twice and
    more. The cases of each number of hosts train one after the other in
    one job."""
    steps = UNUSED_STEPS
    got = unused_trained[(kind, clip, hosts)]
    want = two_heads_reference(kind, steps, 2, clip)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=1e-5, msg=lambda m: name + ": " + m)
    # A run that pushed zeros for the missing gradient ends elsewhere.
    zeros = two_heads_reference(kind, steps, 2, clip, missing_as_zeros=True)
    assert (got["aux.weight"] - zeros["aux.weight"]).abs().max().item() > 1e-4


@pytest.mark.parametrize("mode", [{"mode": "async"}, {"mode": "ssp", "staleness": 1}])
def test_async_and_ssp_train_the_digits_to_a_stated_accuracy(mode):
    # Each worker's gradient is applied as it comes, computed at weights some
    # updates old, and more so when other jobs starve one worker: a smaller
    # learning rate than the demo's and a threshold below its 0.97. On an
    # idle VM these runs reach 0.95-0.97.
    code, log = run_job(["--epochs", "12", "--lr", "1e-3", "--threshold", "0.85"], ps=mode,
                        script=os.path.join(EXAMPLES, "torch_digits.py"))
    assert code == 0, log
    assert "demo: test accuracy 0." in log, log


def test_restored_job_resumes_at_the_checkpoint_step():
    digits = os.path.join(EXAMPLES, "torch_digits.py")
    with tempfile.TemporaryDirectory() as d:
        ckpt = {"checkpoint": {"uri": "file://" + d}}
        code, log = run_job(["--epochs", "2", "--threshold", "0"], ps=ckpt, script=digits)
        assert code == 0, log
        assert "from step 0" in log, log
        code, log = run_job(["--epochs", "12", "--threshold", "0.9"], ps=dict(ckpt, restore="latest"), script=digits)
        assert code == 0, log
        assert "from step 42" in log, log  # 2 epochs of 21 steps
        assert "demo: test accuracy 0." in log, log


@pytest.mark.parametrize("replicas", [0, 1])
def test_the_demo_survives_a_killed_server_losing_less_than_a_checkpoint_interval(replicas):
    # The demo takes 420 steps; a checkpoint every 50; server 1 is killed
    # with SIGKILL at a random logged step (seeded, and printed), 10-30 steps
    # past a checkpoint: one that a kill interrupts while it commits cannot
    # be returned to, and then the steps lost reach the interval. A step takes
    # about a millisecond, so the kill follows the step's line as it is
    # printed, with the server's pid looked up beforehand.
    seed = int(os.environ.get("PSRT_CHAOS_SEED", "1"))
    rng = random.Random(seed)
    kill_at = 50 * rng.randrange(1, 8) + rng.choice([10, 20, 30])
    print("killing server 1 at step %d (seed %d)" % (kill_at, seed))
    token = "recover-%d-%d-%d" % (os.getpid(), seed, replicas)
    digits = os.path.join(EXAMPLES, "torch_digits.py")
    with tempfile.TemporaryDirectory() as d:
        ps = {"on_failure": "recover", "heartbeat_timeout_s": 2, "replicas": replicas,
              "checkpoint": {"uri": "file://" + d + "/ckpt", "every_steps": 50}}
        run = subprocess.Popen(job_command(digits, ["--log-every", "10"], ps, token=token),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = queue.Queue()  # the job's output, line by line, then None

        def read():
            for line in run.stdout:
                lines.put(line)
            lines.put(None)

        reader = threading.Thread(target=read)
        reader.start()
        out = []
        try:
            deadline = time.monotonic() + 180
            server = None
            while not out or not out[-1].startswith("step %d/" % kill_at):
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
                assert line is not None, "".join(out)
                out.append(line)
                if server is None and line.startswith("demo: "):
                    servers = [p for p, cmd in job_processes(token).items()
                               if "psrt-server" in cmd and "--index=1" in cmd]
                    assert len(servers) == 1, job_processes(token)
                    server = servers[0]
            os.kill(server, signal.SIGKILL)
            code = run.wait(timeout=240)
        except queue.Empty:
            raise AssertionError("no line \"step %d/\" within 180 s:\n%s" % (kill_at, "".join(out)))
        finally:
            if run.poll() is None:
                run.kill()
            reader.join(timeout=30)
        while not lines.empty():
            out.append(lines.get() or "")
        out = "".join(out)
    assert code == 0, out
    assert "demo: test accuracy 0." in out, out
    assert not job_processes(token)
    recoveries = re.findall(r"recovery \d+ of at most \d+: server 1 on local1 .*; rolled back to step (\d+)"
                            r"[^;]*; (\d+) steps lost", out)
    if replicas:
        # Server 0 takes over server 1's keys from their replicas: no rollback.
        assert "server 0 serves server 1's keys from their replicas, no step lost (failover)" in out, out
        assert not recoveries, out
        return
    assert len(recoveries) == 1, out
    step, lost = map(int, recoveries[0])
    print("rolled back to step %d, %d steps lost" % (step, lost))
    assert step % 50 == 0 and lost < 50, out
    assert "from step %d" % step in out, out  # the training processes resumed there


def test_elastic_worker_joins_and_the_users_rule_scales_the_learning_rate():
    # Rank 1 of an elastic job (min 1, max 2) joins once rank 0 made its first
    # step; rank 0's optimizer hears the second worker arrive and its callback
    # doubles the learning rate, which the servers then apply.
    with tempfile.TemporaryDirectory() as d:
        code, log = run_job(["--optimizer", "adam", "--steps", "150", "--step-sleep", "0.05",
                             "--late", os.path.join(d, "first-step"), "--out", os.path.join(d, "final.pt")],
                            ps={"elastic": {"min_workers": 1, "max_workers": 2}})
    assert code == 0, log
    assert "starting with 1 of 2 workers" in log, log
    assert "worker 1 on local1 joined the job" in log, log
    assert "rank 0: workers 1 -> 2, lr 0.01 -> 0.02" in log, log


def test_a_worker_that_joins_inside_a_step_pushes_for_the_least_version_it_pulled():
    # torch_join_mid_step.py: rank 1 joins when rank 0 has pushed step 0 of
    # "weight" but not of "bias". Pushing for version 1 (weight's) would be
    # refused at bias, and rank 0's push of bias for version 0 would wait for
    # rank 1 forever; for version 0 it completes bias's step, and the servers
    # drop it at weight, whose step is done.
    with tempfile.TemporaryDirectory() as d:
        code, log = run_job([d], ps={"elastic": {"min_workers": 1, "max_workers": 2}}, timeout=120,
                            script=os.path.join(HERE, "torch_join_mid_step.py"))
    assert code == 0, log
    assert "rank 1: pulled weight at version 1, bias at version 0" in log, log
    # The ranks' last lines may share a line of the log (two processes, one pipe).
    ends = re.findall(r"rank (\d): versions weight 3 bias 3, weights (\[[^]]*\])", log)
    assert sorted(rank for rank, _ in ends) == ["0", "1"], log
    assert ends[0][1] == ends[1][1], log  # the same weights


def test_forgetting_init_is_a_clear_error_not_a_hang():
    with tempfile.TemporaryDirectory() as d:
        code, log = run_job(["--skip-init", "--out", os.path.join(d, "x")], timeout=120)
    assert code != 0
    assert "call psrt.init() first" in log, log


def test_parameters_that_are_not_the_models_are_refused():
    with tempfile.TemporaryDirectory() as d:
        code, log = run_job(["--foreign-params", "--out", os.path.join(d, "x")], timeout=120)
    assert code != 0
    assert "not in named_parameters" in log, log


def _alone_env():
    """The environment of `python train.py`: no job, psrt's programs found."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PSRT_")}
    env["PSRT_BIN_DIR"] = os.environ["PSRT_BIN_DIR"]
    return env


def _alone_jobs_left():
    """psrt-run processes of jobs of one (their relay's directory names them)."""
    out = subprocess.run(["ps", "-eo", "args"], stdout=subprocess.PIPE, text=True).stdout
    return [line for line in out.splitlines() if "psrt-alone-" in line]


def test_outside_psrt_run_init_trains_as_a_job_of_one():
    """`python train.py` without psrt-run: psrt.init() says it makes a job
    of one worker and trains through the servers as one process does; the
    background job ends with the script. An uncaught exception after init()
    fails the job, which ends too."""
    steps = 5
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "final.pt")
        p = subprocess.run([sys.executable, os.path.join(HERE, "torch_worker.py"), "--optimizer", "sgd",
                            "--steps", str(steps), "--out", out], env=_alone_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        assert p.returncode == 0, p.stdout
        assert "training as a job of one worker" in p.stdout, p.stdout
        got = torch.load(out)
    for name, value in reference("sgd", steps, 1).items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=1e-5, msg=lambda m: name + ": " + m)
    p = subprocess.run([sys.executable, "-c", "import psrt.torch as psrt; psrt.init(); raise SystemError('boom')"],
                       env=_alone_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode != 0 and "boom" in p.stdout, p.stdout
    deadline = time.monotonic() + 30
    while _alone_jobs_left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alone_jobs_left(), _alone_jobs_left()


def test_servers_that_sum_are_refused_at_start():
    """DistributedOptimizer trains on the mean (DDP's); a job whose servers
    sum (gradient_aggregation "sum") is refused before the first step."""
    code, log = run_job(["--steps", "2", "--out", "/nonexistent/final.pt"], ps={"gradient_aggregation": "sum"})
    assert code != 0
    assert 'gradient_aggregation is "sum"; PyTorch\'s optimizer trains on the mean' in log, log


def test_unsupported_optimizers_and_foreign_state_are_refused_clearly():
    import psrt
    from psrt.torch import optimizer as popt
    model = torch_worker.build_model()
    with pytest.raises(psrt.PsrtError, match="RMSprop cannot run on the parameter servers"):
        popt._server_optimizer(torch.optim.RMSprop(model.parameters()), {"lr": 0.1})
    with pytest.raises(psrt.PsrtError, match="amsgrad=True"):
        opt = torch.optim.Adam(model.parameters(), amsgrad=True)
        popt._server_optimizer(opt, opt.param_groups[0])
    cfg = popt._server_optimizer(*(lambda o: (o, o.param_groups[0]))(
        torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, nesterov=True)))
    assert cfg == {"name": "sgd", "lr": 0.5, "weight_decay": 0.0, "momentum": 0.9, "dampening": 0.0,
                   "nesterov": True}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_parameters_train_like_cpu_ones():
    code, log = run_job(["--epochs", "4", "--threshold", "0.8"],
                        script=os.path.join(EXAMPLES, "torch_digits.py"))
    assert code == 0, log


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("hosts", [1, 2])
def test_cuda_gradients_equal_one_process_summed_on_the_host_or_not(hosts):
    """Two workers' CUDA gradients: on one host (sharing a GPU) each is
    copied once into the host's page-locked slots and summed there; on two,
    each pushes its own. Both equal one process on the mean gradient."""
    steps = 10
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "final.pt")
        code, log = run_job(["--optimizer", "sgd", "--steps", str(steps), "--out", out, "--device", "cuda"],
                            ps=dict(ONE_HOST if hosts == 1 else {}, partition_bytes=4096), hosts=hosts)
        assert code == 0, log
        assert ("each host summing first" in log) == (hosts == 1), log
        assert "slots stay pageable" not in log, log
        got = torch.load(out)
    for name, value in reference("sgd", steps, 2).items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=1e-5, msg=lambda m: name + ": " + m)


def test_demo_default_log_level():
    """The PyTorch demo under psrt's default level (`make demo`'s settings):
    its own lines, and at most 3 of psrt's (psrt-run's notices)."""
    with tempfile.TemporaryDirectory() as d:
        dist = {"parameter_server": {"enabled": True, "mode": "sync", "compression": "fp16",
                                     "checkpoint": {"uri": "file://" + d, "keep": 2}}}
        cmd = job_command(os.path.join(EXAMPLES, "torch_digits.py"), ["--epochs", "2", "--threshold", "0"],
                          dist["parameter_server"])
        env = {k: v for k, v in os.environ.items() if k != "PSRT_LOG_LEVEL"}
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stdout
    psrt_lines = [line for line in p.stdout.splitlines()
                  if re.match(r"[0-9-]+T[0-9:.]+Z psrt-\S+ [EWNID] ", line)]
    assert len(psrt_lines) <= 3, p.stdout
    assert any(" N job succeeded" in line for line in psrt_lines), p.stdout
    assert "demo: test accuracy" in p.stdout and "demo: 2 workers" in p.stdout, p.stdout
