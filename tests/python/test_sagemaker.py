"""psrt-sagemaker with the files and variables SageMaker writes, under a
temporary root (SAGEMAKER_BASE_DIR) instead of /opt/ml: resourceconfig.json,
hyperparameters.json with every value JSON-encoded (as the SageMaker Python
SDK writes them), inputdataconfig.json and the channels' data.

Run by ctest (tests/CMakeLists.txt) with PYTHONPATH holding the built package
and PSRT_BIN_DIR the programs.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import tomllib

import numpy as np
import pytest
from sklearn.datasets import load_digits

from jobs import BIN, EXAMPLES, ROOT, job_processes

TRAIN = os.path.join(ROOT, "deploy", "sagemaker", "train")
SOURCEDIR = "sourcedir.tar.gz"


@pytest.fixture(scope="module", autouse=True)
def built_package_is_current():
    # The build copies python/psrt next to the extension; a stale copy would
    # test old code.
    import psrt.sagemaker
    with open(psrt.sagemaker.__file__) as built, open(os.path.join(ROOT, "python", "psrt", "sagemaker.py")) as src:
        assert built.read() == src.read(), "%s is stale: build again (make)" % psrt.sagemaker.__file__


def sagemaker_root(base, hosts, current, hyperparameters, interface=None, channels=None, code=None):
    """Lays out `base` as SageMaker lays out /opt/ml for one host. `code`:
    files copied into base/code."""
    config = os.path.join(base, "input", "config")
    os.makedirs(config)
    os.makedirs(os.path.join(base, "model"))
    os.makedirs(os.path.join(base, "output", "data"))
    resources = {"current_host": current, "hosts": hosts, "current_group_name": "homogeneousCluster",
                 "current_instance_type": "ml.c5.xlarge",
                 "instance_groups": [{"instance_group_name": "homogeneousCluster", "instance_type": "ml.c5.xlarge",
                                      "hosts": hosts}]}
    if interface:
        resources["network_interface_name"] = interface
    write_json(os.path.join(config, "resourceconfig.json"), resources)
    write_json(os.path.join(config, "hyperparameters.json"), {k: json.dumps(v) for k, v in hyperparameters.items()})
    write_json(os.path.join(config, "inputdataconfig.json"),
               {name: {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated",
                       "RecordWrapperType": "None"} for name in (channels or [])})
    for name in channels or []:
        os.makedirs(os.path.join(base, "input", "data", name))
    if code:
        os.makedirs(os.path.join(base, "code"))
        for f in code:
            shutil.copy(f, os.path.join(base, "code"))


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def sdk_hyperparameters(program, ps=True, **user):
    """What the SDK adds to the estimator's hyperparameters."""
    hps = {"sagemaker_program": program, "sagemaker_submit_directory": "s3://bucket/job/source/sourcedir.tar.gz",
           "sagemaker_container_log_level": 20, "sagemaker_job_name": "psrt-test", "sagemaker_region": "us-east-1"}
    if ps:
        hps["sagemaker_parameter_server_enabled"] = True
    hps.update(user)
    return hps


def psrt_sagemaker(base, args=(), env=None, timeout=120, command=None):
    full_env = dict(os.environ, SAGEMAKER_BASE_DIR=base, PSRT_BIN_DIR=BIN)
    full_env.update(env or {})
    return subprocess.run(command or [sys.executable, "-m", "psrt.sagemaker"] + list(args), env=full_env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)


def dry_run(base, env=None):
    p = psrt_sagemaker(base, ["--dry-run"], env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def failure(base):
    path = os.path.join(base, "output", "failure")
    assert os.path.exists(path), "no failure file"
    with open(path) as f:
        return f.read()


def console_script(directory):
    """psrt-sagemaker as pip installs it from pyproject.toml's
    [project.scripts], for this interpreter and the built package."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        module, func = tomllib.load(f)["project"]["scripts"]["psrt-sagemaker"].split(":")
    path = os.path.join(directory, "psrt-sagemaker")
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexec %s -c 'import sys; from %s import %s; sys.exit(%s())' \"$@\"\n"
                % (sys.executable, module, func, func))
    os.chmod(path, 0o755)


def digits_channel(directory, rows):
    x, y = load_digits(return_X_y=True)
    np.savetxt(os.path.join(directory, "digits.csv"), np.column_stack([y, x])[:rows], fmt="%d", delimiter=",")


def sourcedir(base, files):
    """The code as the SDK packs it, in the code channel."""
    path = os.path.join(base, "input", "data", "code", SOURCEDIR)
    with tarfile.open(path, "w:gz") as tar:
        for f in files:
            tar.add(f, arcname=os.path.basename(f))
    return path


def coordinator_port_free():
    with socket.socket() as s:
        # As the coordinator binds: a closed job's TIME_WAIT does not count.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", 7070))
            return True
        except OSError:
            return False


def test_a_job_trains_through_psrt_and_leaves_the_model_in_SM_MODEL_DIR(tmp_path):
    # One host by IP, through psrt-run's multi-host path (the coordinator on
    # 7070), started as SageMaker starts a container: `train`.
    assert coordinator_port_free(), "port 7070 (psrt-run's coordinator) is in use on this machine"
    base = str(tmp_path / "ml")
    scripts = [os.path.join(EXAMPLES, "sagemaker_digits.py"), os.path.join(EXAMPLES, "torch_digits.py")]
    hps = sdk_hyperparameters("sagemaker_digits.py", epochs=6, threshold=0.9, **{
        "log-every": 50, "sagemaker_submit_directory": os.path.join(base, "input", "data", "code", SOURCEDIR),
        "psrt_distribution": {"compression": "fp16", "heartbeat_timeout_s": 5}})
    sagemaker_root(base, ["127.0.0.1"], "127.0.0.1", hps, channels=["train", "code"])
    sourcedir(base, scripts)
    digits_channel(os.path.join(base, "input", "data", "train"), 1500)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    console_script(str(bin_dir))

    started = time.monotonic()
    p = psrt_sagemaker(base, env={"PATH": "%s:%s" % (bin_dir, os.environ["PATH"]), "PSRT_JOB_TOKEN": "sm-test"},
                       command=[TRAIN], timeout=240)
    log = p.stdout + p.stderr
    print(log[-3000:], "took %.1f s" % (time.monotonic() - started))
    assert p.returncode == 0, log
    assert ("psrt-run --hosts=127.0.0.1 --current-host=127.0.0.1 --distribution="
            '{"parameter_server": {"enabled": true, "compression": "fp16", "heartbeat_timeout_s": 5}}') in log
    assert "--interface" not in log  # resourceconfig.json names no interface
    assert "sagemaker_digits: 1500 samples from %s/input/data/train" % base in log
    assert "registered server 0" in log and "job succeeded" in log, log
    assert os.path.exists(os.path.join(base, "output", "success"))
    assert not os.path.exists(os.path.join(base, "output", "failure"))
    assert sorted(os.listdir(os.path.join(base, "code"))) == ["sagemaker_digits.py", "torch_digits.py"]

    # The saved model, loaded here, is the trained one: it classifies the
    # held-out digits.
    sys.path.insert(0, EXAMPLES)
    import torch
    import torch_digits
    model = torch_digits.build_model(128)
    model.load_state_dict(torch.load(os.path.join(base, "model", "model.pth")))
    x, y = load_digits(return_X_y=True)
    _, x_test, _, y_test = torch_digits.split(x[:1500], y[:1500])
    with torch.no_grad():
        accuracy = float((model(torch.tensor(x_test, dtype=torch.float32)).argmax(1).numpy() == y_test).mean())
    assert accuracy >= 0.9, accuracy


def test_sigterm_stops_the_whole_job(tmp_path):
    # SageMaker stops a job with SIGTERM to the container's first process.
    assert coordinator_port_free(), "port 7070 (psrt-run's coordinator) is in use on this machine"
    base = str(tmp_path / "ml")
    scripts = [os.path.join(EXAMPLES, "sagemaker_digits.py"), os.path.join(EXAMPLES, "torch_digits.py")]
    sagemaker_root(base, ["127.0.0.1"], "127.0.0.1",
                   sdk_hyperparameters("sagemaker_digits.py", epochs=1000, **{"log-every": 5}), code=scripts)
    token = "sm-sigterm-%d" % os.getpid()
    env = dict(os.environ, SAGEMAKER_BASE_DIR=base, PSRT_BIN_DIR=BIN, PSRT_JOB_TOKEN=token)
    log_path = str(tmp_path / "log")
    with open(log_path, "w+") as log:
        job = subprocess.Popen([sys.executable, "-m", "psrt.sagemaker"], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 180
            while "step 10/" not in open(log_path).read():
                assert job.poll() is None and time.monotonic() < deadline, open(log_path).read()
                time.sleep(0.1)
            job.send_signal(signal.SIGTERM)
            code = job.wait(timeout=60)
        finally:
            if job.poll() is None:
                job.kill()
    assert code != 0, open(log_path).read()
    assert job_processes(token) == {}
    assert "training failed: psrt-run exited with status %d" % code in failure(base)


def checkpoint_config(base, local=None):
    """trainingjobconfig.json as SageMaker writes it for an estimator with
    checkpoint_s3_uri (and checkpoint_local_path)."""
    config = {"TrainingJobName": "psrt-test", "CheckpointConfig": {"S3Uri": "s3://bucket/psrt-test/checkpoints"}}
    if local:
        config["CheckpointConfig"]["LocalPath"] = local
    write_json(config_file(base, "trainingjobconfig.json"), config)


def latest_step(base):
    with open(os.path.join(base, "checkpoints", "LATEST")) as f:
        return int(f.read().strip().split("-")[1])


def run_until_stopped(base, token, log_path, wait_for):
    """psrt-sagemaker as SageMaker starts it, stopped with SIGTERM (a spot
    interruption's notice) once its log holds `wait_for`; returns the log."""
    env = dict(os.environ, SAGEMAKER_BASE_DIR=base, PSRT_BIN_DIR=BIN, PSRT_JOB_TOKEN=token)
    with open(log_path, "w+") as log:
        job = subprocess.Popen([sys.executable, "-m", "psrt.sagemaker"], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 180
            while wait_for not in open(log_path).read():
                assert job.poll() is None and time.monotonic() < deadline, open(log_path).read()
                time.sleep(0.1)
            job.send_signal(signal.SIGTERM)
            job.wait(timeout=90)
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
    assert job_processes(token) == {}
    return open(log_path).read()


def test_a_spot_job_started_again_resumes_from_opt_ml_checkpoints(tmp_path):
    # A spot interruption: SIGTERM, then (later) the same job started again
    # with /opt/ml/checkpoints as SageMaker downloaded it from
    # checkpoint_s3_uri. Same hyperparameters both times, as SageMaker does.
    assert coordinator_port_free(), "port 7070 (psrt-run's coordinator) is in use on this machine"
    base = str(tmp_path / "ml")
    scripts = [os.path.join(EXAMPLES, "sagemaker_digits.py"), os.path.join(EXAMPLES, "torch_digits.py")]
    sagemaker_root(base, ["127.0.0.1"], "127.0.0.1",
                   sdk_hyperparameters("sagemaker_digits.py", epochs=1000, **{"log-every": 5}), code=scripts)
    checkpoint_config(base)
    token = "sm-spot-%d" % os.getpid()
    first = run_until_stopped(base, token, str(tmp_path / "log1"), "step 10/")
    assert "from step 0" in first, first
    assert '"checkpoint": {"uri": "file://%s/checkpoints"}' % base in first, first
    stopped_at = latest_step(base)  # the final checkpoint the SIGTERM asked for
    assert stopped_at >= 10, first

    ahead = (stopped_at // 5 + 3) * 5  # a logged step (every 5th) at least 10 past the restored one
    again = run_until_stopped(base, token, str(tmp_path / "log2"), "step %d/" % ahead)
    assert '"restore": "latest"' in again, again
    assert "restoring file://%s/checkpoints/step-%012d" % (base, stopped_at) in again, again
    assert "from step %d" % stopped_at in again, again
    assert latest_step(base) >= ahead, again


def distribution(out):
    arg = [a for a in out["command"] if a.startswith("--distribution=")][0]
    return json.loads(arg[len("--distribution="):])["parameter_server"]


def test_checkpoint_s3_uri_means_checkpoints_in_opt_ml_checkpoints(tmp_path):
    base = str(tmp_path / "ml")
    sagemaker_root(base, ["algo-1", "algo-2"], "algo-1", sdk_hyperparameters("train.py"),
                   code=[os.path.join(EXAMPLES, "sagemaker_digits.py")])
    os.rename(os.path.join(base, "code", "sagemaker_digits.py"), os.path.join(base, "code", "train.py"))
    local = os.path.join(base, "checkpoints")
    assert "checkpoint" not in distribution(dry_run(base))  # no checkpoint_s3_uri
    checkpoint_config(base)
    ps = distribution(dry_run(base))
    assert ps["checkpoint"] == {"uri": "file://" + local} and "restore" not in ps  # nothing to resume yet
    # Started again: SageMaker downloaded a committed checkpoint first.
    os.makedirs(os.path.join(local, "step-000000000040"))
    put(os.path.join(local, "LATEST"), "step-000000000040\n")
    assert distribution(dry_run(base))["restore"] == "latest"
    # What psrt_distribution says stays.
    set_hyperparameter(base, "psrt_distribution", {"checkpoint": {"every_steps": 100}, "restore": ""})
    ps = distribution(dry_run(base))
    assert ps["checkpoint"] == {"every_steps": 100, "uri": "file://" + local} and ps["restore"] == ""
    set_hyperparameter(base, "psrt_distribution", {"checkpoint": {"uri": "s3://mine/x"}})
    ps = distribution(dry_run(base))
    assert ps["checkpoint"] == {"uri": "s3://mine/x"} and "restore" not in ps
    set_hyperparameter(base, "psrt_distribution", {})
    # checkpoint_local_path: under /opt/ml it moves with the root.
    checkpoint_config(base, "/opt/ml/spot")
    assert distribution(dry_run(base))["checkpoint"] == {"uri": "file://%s/spot" % base}
    checkpoint_config(base, "/scratch/ckpt")
    assert distribution(dry_run(base))["checkpoint"] == {"uri": "file:///scratch/ckpt"}
    # A job config without CheckpointConfig: the directory does not count.
    write_json(config_file(base, "trainingjobconfig.json"), {"TrainingJobName": "psrt-test"})
    assert "checkpoint" not in distribution(dry_run(base))
    # Without the file, the directory SageMaker made tells.
    os.remove(config_file(base, "trainingjobconfig.json"))
    ps = distribution(dry_run(base))
    assert ps["checkpoint"] == {"uri": "file://" + local} and ps["restore"] == "latest"


def test_the_command_and_variables_follow_the_toolkit(tmp_path):
    # Host 2 of 2 with an interface; SM_MODEL_DIR set by the container is
    # kept; user hyperparameters become sorted arguments.
    base = str(tmp_path / "ml")
    hps = sdk_hyperparameters("train.py", epochs=3, lr=0.01, b=True, name="x y", layers=[1, 2],
                              psrt_distribution={"mode": "ssp", "staleness": 2})
    sagemaker_root(base, ["algo-1", "algo-2"], "algo-2", hps, interface="eth0", channels=["train", "test"],
                   code=[os.path.join(EXAMPLES, "sagemaker_digits.py")])
    os.rename(os.path.join(base, "code", "sagemaker_digits.py"), os.path.join(base, "code", "train.py"))
    # A host with 4 GPUs (as nvidia-smi lists them) gets 4 training processes.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\nfor i in 0 1 2 3; do echo \"GPU $i: NVIDIA H100\"; done\n")
    (fake / "nvidia-smi").chmod(0o755)
    out = dry_run(base, {"SM_MODEL_DIR": "/elsewhere/model", "SM_CHANNEL_EXTRA": "/data/extra",
                         "PATH": "%s:%s" % (fake, os.environ["PATH"])})
    code = os.path.join(base, "code")
    assert out["command"] == [
        os.path.abspath(os.path.join(BIN, "psrt-run")), "--hosts=algo-1,algo-2", "--current-host=algo-2",
        "--interface=eth0", '--distribution={"parameter_server": {"enabled": true, "mode": "ssp", "staleness": 2, '
        '"workers_per_host": 4}}', "--",
        sys.executable, os.path.join(code, "train.py"),
        "-b", "True", "--epochs", "3", "--layers", "[1, 2]", "--lr", "0.01", "--name", "x y"]
    assert out["cwd"] == code
    env = out["env"]
    assert env["SM_HOSTS"] == '["algo-1","algo-2"]' and env["SM_CURRENT_HOST"] == "algo-2"
    assert env["SM_NETWORK_INTERFACE_NAME"] == "eth0"
    assert env["SM_CHANNEL_TRAIN"] == os.path.join(base, "input", "data", "train")
    assert env["SM_CHANNEL_TEST"] == os.path.join(base, "input", "data", "test")
    assert "SM_CHANNEL_EXTRA" not in env and "SM_MODEL_DIR" not in env  # kept as they were
    assert env["SM_CHANNELS"] == '["extra","test","train"]'
    assert json.loads(env["SM_HPS"]) == {"b": True, "epochs": 3, "layers": [1, 2], "lr": 0.01, "name": "x y"}
    assert env["SM_HP_EPOCHS"] == "3" and env["SM_HP_NAME"] == "x y"
    assert env["SM_USER_ENTRY_POINT"] == "train.py" and env["SM_MODULE_DIR"] == code
    assert env["SM_OUTPUT_DATA_DIR"] == os.path.join(base, "output", "data")
    assert env["SAGEMAKER_REGION"] == "us-east-1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == code
    assert env["SM_NUM_GPUS"] == "4"
    assert json.loads(env["SM_TRAINING_ENV"])["hosts"] == ["algo-1", "algo-2"]

    # SM_MODULE_DIR, when a directory, holds the code; SAGEMAKER_PROGRAM
    # names the script ahead of sagemaker_program; workers_per_host given
    # stays.
    set_hyperparameter(base, "psrt_distribution", {"workers_per_host": 2})
    out = dry_run(base, {"SM_MODULE_DIR": EXAMPLES, "SAGEMAKER_PROGRAM": "torch_digits.py",
                         "PATH": "%s:%s" % (fake, os.environ["PATH"])})
    assert out["command"][4:8] == ['--distribution={"parameter_server": {"enabled": true, "workers_per_host": 2}}',
                                   "--", sys.executable, os.path.join(EXAMPLES, "torch_digits.py")]
    assert out["cwd"] == EXAMPLES


def test_without_PSRT_BIN_DIR_psrt_run_is_found_on_PATH(tmp_path):
    # The interpreter's directory (.venv/bin) holds no psrt-run here, so
    # PATH is the first place that has one.
    base = str(tmp_path / "ml")
    sagemaker_root(base, ["algo-1"], "algo-1", sdk_hyperparameters("sagemaker_digits.py"),
                   code=[os.path.join(EXAMPLES, "sagemaker_digits.py")])
    out = dry_run(base, {"PSRT_BIN_DIR": "", "PATH": "/nonexistent:%s:/usr/bin:/bin" % BIN})
    assert out["command"][0] == os.path.abspath(os.path.join(BIN, "psrt-run")), out


def test_without_the_parameter_server_the_script_runs_plainly(tmp_path):
    base = str(tmp_path / "ml")
    script = tmp_path / "show.py"
    script.write_text("import json, os, sys\n"
                      "json.dump({'argv': sys.argv[1:], 'cwd': os.getcwd(),\n"
                      "           'env': {k: v for k, v in os.environ.items() if k.startswith('SM_')}},\n"
                      "          open(os.path.join(os.environ['SM_MODEL_DIR'], 'seen.json'), 'w'))\n")
    # The toolkit's own example: {'model_dir': ..., 'batch_size': 25}.
    sagemaker_root(base, ["algo-1"], "algo-1",
                   sdk_hyperparameters("show.py", ps=False, model_dir="/opt/ml/model", batch_size=25),
                   channels=["train"], code=[str(script)])
    p = psrt_sagemaker(base)
    assert p.returncode == 0, p.stderr
    assert "psrt-run" not in p.stderr
    with open(os.path.join(base, "model", "seen.json")) as f:
        seen = json.load(f)
    assert seen["argv"] == ["--batch_size", "25", "--model_dir", "/opt/ml/model"]
    assert seen["cwd"] == os.path.join(base, "code")
    assert seen["env"]["SM_CHANNEL_TRAIN"] == os.path.join(base, "input", "data", "train")
    assert seen["env"]["SM_HOSTS"] == '["algo-1"]'
    assert os.path.exists(os.path.join(base, "output", "success"))


def test_a_failing_script_writes_the_failure_file(tmp_path):
    base = str(tmp_path / "ml")
    script = tmp_path / "fail.py"
    script.write_text("import sys\nprint('the data is bad', file=sys.stderr)\nsys.exit(3)\n")
    sagemaker_root(base, ["algo-1"], "algo-1", sdk_hyperparameters("fail.py", ps=False), code=[str(script)])
    p = psrt_sagemaker(base)
    assert p.returncode == 3
    assert "the data is bad" in p.stderr  # still shown in the job's log
    assert failure(base) == "training failed: %s exited with status 3\nthe data is bad\n" % os.path.basename(
        sys.executable)


def test_psrt_runs_refusal_of_an_option_reaches_the_failure_file(tmp_path):
    base = str(tmp_path / "ml")
    sagemaker_root(base, ["127.0.0.1"], "127.0.0.1",
                   sdk_hyperparameters("sagemaker_digits.py", psrt_distribution={"stalenes": 2}),
                   code=[os.path.join(EXAMPLES, "sagemaker_digits.py")])
    p = psrt_sagemaker(base)
    assert p.returncode != 0
    text = failure(base)
    assert text.startswith("training failed: psrt-run exited with status %d\n" % p.returncode), text
    assert "stalenes" in text, text


def config_file(base, name):
    return os.path.join(base, "input", "config", name)


def put(path, text):
    with open(path, "w") as f:
        f.write(text)


def set_hyperparameters(base, **values):
    with open(config_file(base, "hyperparameters.json")) as f:
        hps = json.load(f)
    hps.update((k, json.dumps(v)) for k, v in values.items())
    write_json(config_file(base, "hyperparameters.json"), hps)


def set_hyperparameter(base, key, value):
    set_hyperparameters(base, **{key: value})


# case: (what breaks the job, returning variables to set, or None; the error)
BAD_INPUTS = {
    "missing resourceconfig": (
        lambda base: os.remove(config_file(base, "resourceconfig.json")),
        "resourceconfig.json: {base}/input/config/resourceconfig.json does not exist"),
    "malformed resourceconfig": (
        lambda base: put(config_file(base, "resourceconfig.json"), '{"hosts": ['),
        "resourceconfig.json: cannot read {base}/input/config/resourceconfig.json"),
    "current host not in hosts": (
        lambda base: write_json(config_file(base, "resourceconfig.json"),
                                {"current_host": "algo-3", "hosts": ["algo-1", "algo-2"]}),
        'resourceconfig.json: "current_host" "algo-3" in {base}/input/config/resourceconfig.json '
        'is not one of "hosts" ["algo-1", "algo-2"]'),
    "SM_CURRENT_HOST disagrees": (
        lambda base: {"SM_CURRENT_HOST": "algo-9"},
        "SM_CURRENT_HOST 'algo-9' differs from current_host 'algo-1' in resourceconfig.json"),
    "missing hyperparameters": (
        lambda base: os.remove(config_file(base, "hyperparameters.json")),
        "hyperparameters.json: {base}/input/config/hyperparameters.json does not exist"),
    "psrt_distribution not JSON": (
        lambda base: set_hyperparameter(base, "psrt_distribution", "{mode: async"),
        "hyperparameters.json: psrt_distribution is not valid JSON"),
    "psrt_distribution not an object": (
        lambda base: set_hyperparameter(base, "psrt_distribution", ["async"]),
        "hyperparameters.json: psrt_distribution must be a JSON object of parameter_server options, "
        'e.g. {{"mode": "async", "compression": "fp16"}}; got ["async"]'),
    "psrt_distribution disabling": (
        lambda base: set_hyperparameter(base, "psrt_distribution", {"enabled": False}),
        'hyperparameters.json: psrt_distribution must not set "enabled"'),
    "psrt_distribution without the parameter server": (
        lambda base: set_hyperparameters(base, psrt_distribution={"mode": "async"},
                                         sagemaker_parameter_server_enabled=False),
        "hyperparameters.json: psrt_distribution is set but sagemaker_parameter_server_enabled is not true"),
    "CheckpointConfig not an object": (
        lambda base: write_json(config_file(base, "trainingjobconfig.json"), {"CheckpointConfig": "s3://b/x"}),
        'trainingjobconfig.json: "CheckpointConfig" in {base}/input/config/trainingjobconfig.json must be an '
        'object with "S3Uri", got "s3://b/x"'),
    "CheckpointConfig LocalPath relative": (
        lambda base: write_json(config_file(base, "trainingjobconfig.json"),
                                {"CheckpointConfig": {"S3Uri": "s3://b/x", "LocalPath": "ckpt"}}),
        'trainingjobconfig.json: "CheckpointConfig" "LocalPath" in {base}/input/config/trainingjobconfig.json '
        'must be an absolute path, got "ckpt"'),
    "script not in the code": (
        lambda base: set_hyperparameter(base, "sagemaker_program", "missing.py"),
        "the entry point missing.py is not in the code directory {base}/code"),
    "no psrt-run in PSRT_BIN_DIR": (
        lambda base: {"PSRT_BIN_DIR": base},
        "psrt-run not found in {base} (PSRT_BIN_DIR); install psrt (pip install psrt) or set PSRT_BIN_DIR"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_named_and_written_to_the_failure_file(case, tmp_path):
    break_it, message = BAD_INPUTS[case]
    base = str(tmp_path / "ml")
    sagemaker_root(base, ["algo-1", "algo-2"], "algo-1", sdk_hyperparameters("train.py"),
                   code=[os.path.join(EXAMPLES, "sagemaker_digits.py")])
    os.rename(os.path.join(base, "code", "sagemaker_digits.py"), os.path.join(base, "code", "train.py"))
    env = break_it(base) or {}
    p = psrt_sagemaker(base, env=env)
    expected = "psrt-sagemaker: " + message.format(base=base)
    assert p.returncode == 2, p.stderr
    assert expected in p.stderr
    assert failure(base).startswith(expected), failure(base)


def test_code_from_s3_is_fetched_as_the_toolkit_does(tmp_path):
    # The SDK uploads source_dir to S3 as sourcedir.tar.gz and names it in
    # sagemaker_submit_directory; moto's S3 server stands in for S3.
    boto3 = pytest.importorskip("boto3", reason="boto3 is not installed (scripts/setup.sh s3)")
    moto = os.environ.get("PSRT_MOTO_SERVER", os.path.join(ROOT, ".venv", "bin", "moto_server"))
    if not os.access(moto, os.X_OK):
        pytest.skip("moto_server not found at %s (scripts/setup.sh s3)" % moto)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        endpoint = "http://127.0.0.1:%d" % port
        creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
        deadline = time.monotonic() + 30
        while True:
            try:
                s3.create_bucket(Bucket="jobs")
                break
            except Exception:
                assert time.monotonic() < deadline and server.poll() is None, "moto_server did not start"
                time.sleep(0.2)
        base = str(tmp_path / "ml")
        scripts = [os.path.join(EXAMPLES, "sagemaker_digits.py"), os.path.join(EXAMPLES, "torch_digits.py")]
        hps = sdk_hyperparameters("sagemaker_digits.py",
                                  sagemaker_submit_directory="s3://jobs/job-1/source/sourcedir.tar.gz")
        sagemaker_root(base, ["algo-1"], "algo-1", hps, channels=["code"])
        s3.upload_file(sourcedir(base, scripts), "jobs", "job-1/source/sourcedir.tar.gz")
        out = dry_run(base, dict(creds, S3_ENDPOINT_URL=endpoint))
        code = os.path.join(base, "code")
        assert sorted(os.listdir(code)) == ["sagemaker_digits.py", "torch_digits.py"]
        assert out["command"][-1] == os.path.join(code, "sagemaker_digits.py")

        # A key that is not there is named.
        shutil.rmtree(code)
        set_hyperparameter(base, "sagemaker_submit_directory", "s3://jobs/job-2/source/sourcedir.tar.gz")
        p = psrt_sagemaker(base, env=dict(creds, S3_ENDPOINT_URL=endpoint))
        assert p.returncode == 2
        assert ("sagemaker_submit_directory: cannot download s3://jobs/job-2/source/sourcedir.tar.gz"
                in failure(base))
    finally:
        server.terminate()
        server.wait(timeout=10)
