"""One host, several GPUs, one command: `psrt-run --workers=N` starts N
training processes and gives each its own GPU through CUDA_VISIBLE_DEVICES.
The GPUs here are a fake device list (CUDA_VISIBLE_DEVICES of psrt-run), so
this runs on the CPU: each training process prints what it got."""

import os
import re
import subprocess

from jobs import BIN

PS = '{"parameter_server": {"enabled": true, "heartbeat_timeout_s": 5}}'
SHOW = 'echo "rank=$PSRT_RANK local=$PSRT_LOCAL_RANK of=$PSRT_LOCAL_WORLD_SIZE gpus=${CUDA_VISIBLE_DEVICES-unset}"'


def psrt_run(args, command, visible="3,5,7,9", timeout=120):
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return subprocess.run([os.path.join(BIN, "psrt-run"), "--distribution=" + PS] + args + ["--"] + command,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)


def shown(log):
    """{rank: (local rank, local world size, gpus)} of the lines SHOW printed."""
    found = re.findall(r"^rank=(\d+) local=(\d+) of=(\d+) gpus=(\S*)$", log, re.M)
    ranks = {int(r): (int(lr), int(n), g) for r, lr, n, g in found}
    assert len(ranks) == len(found), log
    return ranks


def test_each_training_process_gets_its_own_gpu_and_they_train_one_job():
    linreg = os.path.join(BIN, "psrt-example-linreg")
    p = psrt_run(["--workers=4"], ["sh", "-c", SHOW + ' && exec "$0" --steps=20 --log-every=10', linreg])
    assert p.returncode == 0, p.stdout
    assert shown(p.stdout) == {0: (0, 4, "3"), 1: (1, 4, "5"), 2: (2, 4, "7"), 3: (3, 4, "9")}, p.stdout
    assert "on 4 workers" in p.stdout, p.stdout
    assert sorted(re.findall(r"^rank (\d) final loss", p.stdout, re.M)) == ["0", "1", "2", "3"], p.stdout


def test_simulated_hosts_take_consecutive_slices():
    p = psrt_run(["--local=2", "--workers=2"], ["sh", "-c", SHOW])
    assert p.returncode == 0, p.stdout
    assert shown(p.stdout) == {0: (0, 2, "3"), 1: (1, 2, "5"), 2: (0, 2, "7"), 3: (1, 2, "9")}, p.stdout


def test_fewer_gpus_than_processes_are_shared_round_robin():
    p = psrt_run(["--workers=3"], ["sh", "-c", SHOW], visible="GPU-aa,GPU-bb")
    assert p.returncode == 0, p.stdout
    assert shown(p.stdout) == {0: (0, 3, "GPU-aa"), 1: (1, 3, "GPU-bb"), 2: (2, 3, "GPU-aa")}, p.stdout


def test_bind_gpus_false_and_one_process_keep_every_gpu():
    p = psrt_run(["--workers=2", "--bind-gpus=false"], ["sh", "-c", SHOW])
    assert p.returncode == 0, p.stdout
    assert shown(p.stdout) == {0: (0, 2, "3,5,7,9"), 1: (1, 2, "3,5,7,9")}, p.stdout
    p = psrt_run([], ["sh", "-c", SHOW])
    assert shown(p.stdout) == {0: (0, 1, "3,5,7,9")}, p.stdout


def test_no_gpus_leave_the_environment_alone():
    p = psrt_run(["--workers=2"], ["sh", "-c", SHOW], visible="")
    assert shown(p.stdout) == {0: (0, 2, ""), 1: (1, 2, "")}, p.stdout


def test_workers_gpus_counts_the_hosts_gpus():
    p = psrt_run(["--workers=gpus"], ["sh", "-c", SHOW], visible="3,5,7")
    assert p.returncode == 0, p.stdout
    assert shown(p.stdout) == {0: (0, 3, "3"), 1: (1, 3, "5"), 2: (2, 3, "7")}, p.stdout
    p = psrt_run(["--workers=gpus"], ["true"], visible="")
    assert p.returncode == 2 and "--workers=gpus: this host has no GPUs" in p.stdout, p.stdout


def test_workers_flag_and_workers_per_host_must_agree():
    ps = '{"parameter_server": {"enabled": true, "workers_per_host": 2}}'
    p = subprocess.run([os.path.join(BIN, "psrt-run"), "--distribution=" + ps, "--workers=4", "--", "true"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert p.returncode == 2, p.stdout
    assert "--workers=4 and --distribution's \"workers_per_host\": 2 disagree" in p.stdout, p.stdout
    for bad in ("-1", "0", "5000", "all"):
        p = psrt_run(["--workers=" + bad], ["true"])
        assert p.returncode == 2, p.stdout
        assert "--workers must be a count in 1..1024 or \"gpus\", got '%s'" % bad in p.stdout, p.stdout
