"""psrt-sagemaker: the training entry point of a SageMaker container.

SageMaker starts every host of a training job as ``docker run IMAGE train``
with the job laid out under ``/opt/ml`` (``SAGEMAKER_BASE_DIR`` elsewhere):

- ``input/config/resourceconfig.json``: ``current_host``, ``hosts`` and
  ``network_interface_name``;
- ``input/config/hyperparameters.json``: every value a JSON-encoded string.
  The SageMaker Python SDK adds ``sagemaker_program`` (the script),
  ``sagemaker_submit_directory`` (where the code is), ``sagemaker_region`` and,
  for ``distribution={"parameter_server": {"enabled": True}}``,
  ``sagemaker_parameter_server_enabled``; the rest are the user's;
- ``input/config/inputdataconfig.json``: the channels, whose data is in
  ``input/data/<channel>``;
- ``model``: what is there at the end becomes the model artifact.

This reads them as the sagemaker-training toolkit does and runs the user's
script with the toolkit's arguments (``--key value`` per user hyperparameter,
sorted) and variables (``SM_MODEL_DIR``, ``SM_CHANNEL_<NAME>``, ``SM_HOSTS``,
``SM_CURRENT_HOST``, ``SM_HPS``, ...). With the parameter server enabled the
script runs under ``psrt-run`` on every host:

    psrt-run --hosts=algo-1,algo-2 --current-host=algo-1 --interface=eth0 \\
        --distribution='{"parameter_server": {"enabled": true, ...}}' -- python train.py --epochs 4

More ``parameter_server`` options (the SDK passes on only ``enabled``) come in
the hyperparameter ``psrt_distribution``, a JSON object such as
``{"mode": "async", "compression": "fp16"}``. On a host with more than one GPU,
``workers_per_host`` defaults to the number of GPUs. Every host needs the same
``PSRT_JOB_TOKEN`` in its environment (the estimator's ``environment``).

Precedence, as in the toolkit: hosts, current host and interface come from
resourceconfig.json (``SM_HOSTS``/``SM_CURRENT_HOST``, when set, must agree);
the script from ``SM_USER_ENTRY_POINT``, else ``SAGEMAKER_PROGRAM``, else
``sagemaker_program``; the code from ``SM_MODULE_DIR`` when it is a local
directory, else ``<base>/code`` when it holds files, else
``sagemaker_submit_directory`` (a directory, or a .tar.gz or ``s3://`` URI
unpacked into ``<base>/code``). ``SM_MODEL_DIR``, ``SM_OUTPUT_DATA_DIR`` and
``SM_CHANNEL_<NAME>`` already set are kept.

Spot training: where the estimator set ``checkpoint_s3_uri`` (the
CheckpointConfig of ``input/config/trainingjobconfig.json``, else the presence
of ``<base>/checkpoints``), checkpoints go to its local path
(``/opt/ml/checkpoints``, which SageMaker keeps in step with S3) unless
``psrt_distribution`` names a ``checkpoint.uri``, and a job that finds a
committed checkpoint there (SageMaker restored it for a restarted job)
restores the latest.

On success ``<base>/output/success`` is written; on any failure
``<base>/output/failure`` holds the reason (SageMaker shows its first 1024
characters as the job's FailureReason) and the exit status is non-zero: 2 for
bad input, else the training command's. ``--dry-run`` prints the command,
directory and variables as JSON instead of running them.
"""

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading

from psrt._programs import find_programs

PS_ENABLED = "sagemaker_parameter_server_enabled"
PSRT_DISTRIBUTION = "psrt_distribution"
# The toolkit's framework parameters: every "sagemaker_" key and these two.
FRAMEWORK_KEYS = ("_tuning_objective_metric", "default_user_module_name")
BAD_INPUT = 2


class SageMakerError(Exception):
    """Input that cannot make a job; the message names the file or variable."""


def base_dir(environ):
    return environ.get("SAGEMAKER_BASE_DIR") or "/opt/ml"


def read_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise SageMakerError("%s: %s does not exist" % (what, path)) from None
    except (OSError, ValueError) as e:
        raise SageMakerError("%s: cannot read %s: %s" % (what, path, e)) from None


def decode(value):
    """A hyperparameter's value: SageMaker stores each as a JSON string;
    one that is not JSON stays as it is (as in the toolkit)."""
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return value


def to_cmd_args(hyperparameters):
    """The toolkit's arguments: sorted keys, `--key value` (`-k` for one
    letter), str() of the value, a dict as k=v,k=v."""
    args = []
    for key in sorted(hyperparameters):
        value = hyperparameters[key]
        args.append(("--%s" if len(key) > 1 else "-%s") % key)
        if hasattr(value, "items"):
            args.append(",".join("%s=%s" % kv for kv in sorted(value.items())))
        else:
            args.append("" if value is None else str(value))
    return args


def to_env_value(value):
    """The toolkit's variable values: strings as they are, the rest JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def num_gpus():
    """GPUs on this host, counted as the toolkit does."""
    try:
        out = subprocess.run(["nvidia-smi", "--list-gpus"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def read_resource_config(path):
    what = "resourceconfig.json"
    config = read_json(path, what)
    if not isinstance(config, dict):
        raise SageMakerError("%s: %s holds %s, not a JSON object" % (what, path, type(config).__name__))
    hosts = config.get("hosts")
    if (not isinstance(hosts, list) or not hosts
            or not all(isinstance(h, str) and h and h.strip() == h and "," not in h for h in hosts)):
        raise SageMakerError('%s: "hosts" in %s must be a non-empty list of host names, got %s'
                             % (what, path, json.dumps(hosts)))
    if len(set(hosts)) != len(hosts):
        raise SageMakerError('%s: "hosts" in %s names a host twice: %s' % (what, path, json.dumps(hosts)))
    current = config.get("current_host")
    if not isinstance(current, str) or current not in hosts:
        raise SageMakerError('%s: "current_host" %s in %s is not one of "hosts" %s'
                             % (what, json.dumps(current), path, json.dumps(hosts)))
    interface = config.get("network_interface_name")
    if interface is not None and (not isinstance(interface, str) or not interface):
        raise SageMakerError('%s: "network_interface_name" in %s must be an interface name, got %s'
                             % (what, path, json.dumps(interface)))
    return config


def check_env_agrees(environ, hosts, current):
    """SM_HOSTS and SM_CURRENT_HOST, where something set them already, must
    say what resourceconfig.json says: a mismatch is a mistake to report."""
    sm_hosts = environ.get("SM_HOSTS")
    if sm_hosts:
        try:
            listed = json.loads(sm_hosts)
        except ValueError as e:
            raise SageMakerError("SM_HOSTS: not JSON (%s): %r" % (e, sm_hosts)) from None
        if listed != hosts:
            raise SageMakerError("SM_HOSTS %s differs from the hosts %s in resourceconfig.json; unset it or make "
                                 "them agree" % (sm_hosts, json.dumps(hosts)))
    sm_current = environ.get("SM_CURRENT_HOST")
    if sm_current and sm_current != current:
        raise SageMakerError("SM_CURRENT_HOST %r differs from current_host %r in resourceconfig.json; unset it or "
                             "make them agree" % (sm_current, current))


def ps_enabled(framework):
    value = framework.get(PS_ENABLED, False)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"
    if not isinstance(value, bool):
        raise SageMakerError("hyperparameters.json: %s must be true or false, got %s"
                             % (PS_ENABLED, json.dumps(value)))
    return value


def ps_options(value):
    """The hyperparameter psrt_distribution: a JSON object of
    parameter_server options (possibly JSON-encoded twice, when the
    estimator was given a string)."""
    example = '{"mode": "async", "compression": "fp16"}'
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise SageMakerError("hyperparameters.json: %s is not valid JSON (%s): %r; give a JSON object of "
                                 "parameter_server options, e.g. %s" % (PSRT_DISTRIBUTION, e, value, example)) from None
    if not isinstance(value, dict):
        raise SageMakerError("hyperparameters.json: %s must be a JSON object of parameter_server options, e.g. %s; "
                             "got %s" % (PSRT_DISTRIBUTION, example, json.dumps(value)))
    if "parameter_server" in value:
        raise SageMakerError('hyperparameters.json: %s holds the options inside "parameter_server" itself, e.g. %s; '
                             'leave out the "parameter_server" level' % (PSRT_DISTRIBUTION, example))
    if "enabled" in value:
        raise SageMakerError("hyperparameters.json: %s must not set \"enabled\": the estimator's "
                             "distribution={\"parameter_server\": {\"enabled\": True}} does (as %s)"
                             % (PSRT_DISTRIBUTION, PS_ENABLED))
    return value


def safe_extract(archive, dest, what):
    """Unpacks a .tar.gz, refusing members that would land outside dest."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            root = os.path.realpath(dest)
            for member in tar.getmembers():
                target = os.path.realpath(os.path.join(root, member.name))
                if os.path.commonpath([root, target]) != root or member.islnk() or member.issym():
                    raise SageMakerError("%s: %s holds %r, which is a link or lies outside the code directory"
                                         % (what, archive, member.name))
            if hasattr(tarfile, "data_filter"):  # Python >= 3.12 (and security backports) check again
                tar.extractall(root, filter="data")
            else:
                tar.extractall(root)
    except (OSError, tarfile.TarError) as e:
        raise SageMakerError("%s: cannot unpack %s: %s" % (what, archive, e)) from None


def fetch_s3(uri, dest, environ, what):
    """Downloads the SDK's sourcedir.tar.gz from S3 and unpacks it, as the
    toolkit does; boto3 finds the credentials SageMaker gives the container."""
    try:
        import boto3
    except ImportError:
        raise SageMakerError("%s: the code is at %s, and fetching it needs boto3 (pip install boto3), or put the "
                             "code in the image under %s" % (what, uri, dest)) from None
    bucket, _, key = uri[len("s3://"):].partition("/")
    region = environ.get("AWS_REGION", environ.get("SAGEMAKER_REGION"))
    s3 = boto3.client("s3", region_name=region, endpoint_url=environ.get("S3_ENDPOINT_URL") or None)
    with tempfile.TemporaryDirectory() as tmp:
        archive = os.path.join(tmp, "sourcedir.tar.gz")
        try:
            s3.download_file(bucket, key, archive)
        except Exception as e:  # botocore's errors have no common base worth naming
            raise SageMakerError("%s: cannot download %s: %s" % (what, uri, e)) from None
        safe_extract(archive, dest, what)


def code_directory(environ, base, submit):
    """The directory the user's script is in (see the module's docstring)."""
    module_dir = environ.get("SM_MODULE_DIR")
    if module_dir and os.path.isdir(module_dir):
        return module_dir
    code = os.path.join(base, "code")
    if os.path.isdir(code) and os.listdir(code):
        return code
    what = "sagemaker_submit_directory"
    if not submit:
        return code
    if not isinstance(submit, str):
        raise SageMakerError("hyperparameters.json: %s must be a path or URI, got %s" % (what, json.dumps(submit)))
    path = submit[len("file://"):] if submit.startswith("file://") else submit
    if os.path.isdir(path):
        return path
    os.makedirs(code, exist_ok=True)
    if submit.startswith("s3://"):
        fetch_s3(submit, code, environ, what)
    elif os.path.isfile(path):
        safe_extract(path, code, what)
    else:
        raise SageMakerError("%s: %s is neither a directory, a .tar.gz nor an s3:// URI, and %s is empty"
                             % (what, submit, code))
    return code


def checkpoint_dir(base, config_dir):
    """The local directory SageMaker keeps in step with the estimator's
    checkpoint_s3_uri (downloading it before a restarted spot job starts,
    uploading what is written there), or None. trainingjobconfig.json holds
    the job's CheckpointConfig where SageMaker writes that file; without it,
    the directory's presence tells, since SageMaker makes it only for a job
    with checkpoint_s3_uri."""
    default = os.path.join(base, "checkpoints")
    path = os.path.join(config_dir, "trainingjobconfig.json")
    if not os.path.exists(path):
        return default if os.path.isdir(default) else None
    job = read_json(path, "trainingjobconfig.json")
    config = job.get("CheckpointConfig") if isinstance(job, dict) else None
    if config is None:
        return None
    if not isinstance(config, dict) or not isinstance(config.get("S3Uri"), str):
        raise SageMakerError('trainingjobconfig.json: "CheckpointConfig" in %s must be an object with "S3Uri", got %s'
                             % (path, json.dumps(config)))
    local = config.get("LocalPath") or "/opt/ml/checkpoints"
    if not isinstance(local, str) or not os.path.isabs(local):
        raise SageMakerError('trainingjobconfig.json: "CheckpointConfig" "LocalPath" in %s must be an absolute '
                             "path, got %s" % (path, json.dumps(local)))
    # Under SAGEMAKER_BASE_DIR, /opt/ml's paths move with it.
    if local == "/opt/ml" or local.startswith("/opt/ml/"):
        local = os.path.join(base, os.path.relpath(local, "/opt/ml"))
    return local


def checkpoint_options(options, local):
    """Checkpoints to `local` unless psrt_distribution names a checkpoint.uri;
    a job that finds a committed checkpoint there (a restarted spot job)
    restores the latest unless psrt_distribution says what to restore."""
    checkpoint = options.get("checkpoint", {})
    if not isinstance(checkpoint, dict):
        raise SageMakerError("hyperparameters.json: %s: \"checkpoint\" must be a JSON object, got %s"
                             % (PSRT_DISTRIBUTION, json.dumps(checkpoint)))
    if checkpoint.get("uri"):
        return options
    options = dict(options, checkpoint=dict(checkpoint, uri="file://" + local))
    if "restore" not in options and os.path.isfile(os.path.join(local, "LATEST")):
        options["restore"] = "latest"
    return options


def find_psrt_run(environ):
    """The path of psrt-run (psrt._programs.find_programs says where)."""
    try:
        return os.path.join(find_programs(["psrt-run"], environ=environ), "psrt-run")
    except FileNotFoundError as e:
        raise SageMakerError(str(e)) from None


def prepare(environ):
    """Reads the job; returns (command, working directory, environment)."""
    base = base_dir(environ)
    config_dir = os.path.join(base, "input", "config")
    resources = read_resource_config(os.path.join(config_dir, "resourceconfig.json"))
    hosts, current = resources["hosts"], resources["current_host"]
    check_env_agrees(environ, hosts, current)
    interface = resources.get("network_interface_name") or environ.get("SM_NETWORK_INTERFACE_NAME") or None

    hp_path = os.path.join(config_dir, "hyperparameters.json")
    raw = read_json(hp_path, "hyperparameters.json")
    if not isinstance(raw, dict):
        raise SageMakerError("hyperparameters.json: %s holds %s, not a JSON object" % (hp_path, type(raw).__name__))
    all_hps = {k: decode(v) for k, v in raw.items()}
    framework = {k: v for k, v in all_hps.items()
                 if k.startswith("sagemaker_") or k in FRAMEWORK_KEYS or k == PSRT_DISTRIBUTION}
    user_hps = {k: v for k, v in all_hps.items() if k not in framework}

    data_config_path = os.path.join(config_dir, "inputdataconfig.json")
    data_config = {}
    if os.path.exists(data_config_path):
        data_config = read_json(data_config_path, "inputdataconfig.json")
        if not isinstance(data_config, dict):
            raise SageMakerError("inputdataconfig.json: %s holds %s, not a JSON object"
                                 % (data_config_path, type(data_config).__name__))

    enabled = ps_enabled(framework)
    options = framework.get(PSRT_DISTRIBUTION)
    if options is not None and not enabled:
        raise SageMakerError("hyperparameters.json: %s is set but %s is not true; give the estimator "
                             "distribution={\"parameter_server\": {\"enabled\": True}}"
                             % (PSRT_DISTRIBUTION, PS_ENABLED))
    options = ps_options(options) if options is not None else {}

    entry = (environ.get("SM_USER_ENTRY_POINT") or environ.get("SAGEMAKER_PROGRAM")
             or framework.get("sagemaker_program"))
    if not entry or not isinstance(entry, str):
        raise SageMakerError("no script to run: hyperparameters.json has no sagemaker_program (the estimator's "
                             "entry_point) and neither SM_USER_ENTRY_POINT nor SAGEMAKER_PROGRAM is set")
    code = code_directory(environ, base, framework.get("sagemaker_submit_directory"))
    script = os.path.join(code, entry)
    if not os.path.isfile(script):
        raise SageMakerError("the entry point %s is not in the code directory %s (from SM_MODULE_DIR, "
                             "%s/code or sagemaker_submit_directory)" % (entry, code, base))

    local_checkpoints = checkpoint_dir(base, config_dir) if enabled else None
    if local_checkpoints:
        options = checkpoint_options(options, local_checkpoints)

    gpus = num_gpus()
    if enabled and gpus > 1 and "workers_per_host" not in options:
        options["workers_per_host"] = gpus  # one training process per GPU

    args = to_cmd_args(user_hps)
    if entry.endswith(".py"):
        program = [sys.executable, script] + args
    else:
        os.chmod(script, os.stat(script).st_mode | 0o111)  # as the toolkit: a command is made executable
        program = [script] + args
    if enabled:
        distribution = {"parameter_server": dict({"enabled": True}, **options)}
        command = [find_psrt_run(environ), "--hosts=" + ",".join(hosts), "--current-host=" + current]
        if interface:
            command.append("--interface=" + interface)
        command += ["--distribution=" + json.dumps(distribution), "--"] + program
    else:
        command = program

    # The toolkit's variables (sagemaker_training.environment.to_env_vars).
    channels = {name: os.path.join(base, "input", "data", name) for name in data_config}
    for key, value in environ.items():
        if key.startswith("SM_CHANNEL_") and key != "SM_CHANNELS":
            channels.setdefault(key[len("SM_CHANNEL_"):].lower(), value)
    output = os.path.join(base, "output")
    training = {
        "hosts": hosts,
        "current_host": current,
        "current_instance_type": resources.get("current_instance_type", "local"),
        "hps": user_hps,
        "user_args": args,
        "user_entry_point": entry,
        "module_name": entry[:-3] if entry.endswith(".py") else entry,
        "module_dir": code,
        "framework_params": framework,
        "resource_config": resources,
        "input_data_config": data_config,
        "channels": sorted(channels),
        "model_dir": environ.get("SM_MODEL_DIR") or os.path.join(base, "model"),
        "input_dir": os.path.join(base, "input"),
        "input_config_dir": config_dir,
        "output_dir": output,
        "output_data_dir": environ.get("SM_OUTPUT_DATA_DIR") or os.path.join(output, "data"),
        "output_intermediate_dir": os.path.join(output, "intermediate"),
        "num_cpus": os.cpu_count(),
        "num_gpus": gpus,
        "log_level": framework.get("sagemaker_container_log_level", 20),
    }
    if interface:
        training["network_interface_name"] = interface
    env = dict(environ)
    for key, value in training.items():
        env["SM_" + key.upper()] = to_env_value(value)
    env["SM_TRAINING_ENV"] = to_env_value(training)
    for name, path in channels.items():
        env.setdefault("SM_CHANNEL_" + name.upper(), path)
    for key, value in user_hps.items():
        env["SM_HP_" + key.upper()] = to_env_value(value)
    env["CURRENT_HOST"] = current
    for key in ("sagemaker_region", "sagemaker_job_name"):
        if key in framework:
            env[key.upper()] = to_env_value(framework[key])
    # The script runs in the code directory: relative entries would move.
    paths = [code] + [os.path.abspath(p) for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return command, code, env


def run(command, cwd, env):
    """Runs `command`, passing SIGTERM/SIGINT on (SageMaker stops a job with
    SIGTERM) and copying its error output through; returns (exit status,
    the error output's last lines)."""
    tail = collections.deque(maxlen=20)
    child = subprocess.Popen(command, cwd=cwd, env=env, stderr=subprocess.PIPE)

    def copy():
        for line in iter(child.stderr.readline, b""):
            sys.stderr.buffer.write(line)
            sys.stderr.buffer.flush()
            tail.append(line.decode("utf-8", "replace").rstrip())

    copier = threading.Thread(target=copy, daemon=True)
    copier.start()
    forward = lambda sig, frame: child.send_signal(sig)
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    copier.join()
    return (128 - code if code < 0 else code), list(tail)


def write_output_file(base, name, text):
    """output/success or output/failure; a failure file already there (the
    script's own reason) is kept, as the toolkit does."""
    output = os.path.join(base, "output")
    path = os.path.join(output, name)
    try:
        os.makedirs(output, exist_ok=True)
        if name == "failure" and os.path.exists(path):
            return
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        print("psrt-sagemaker: cannot write %s: %s" % (path, e), file=sys.stderr)


def main(argv=None):
    p = argparse.ArgumentParser(prog="psrt-sagemaker", description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true",
                   help="print the command, directory and environment as JSON instead of running them")
    opts = p.parse_args(argv)
    environ = dict(os.environ)
    base = base_dir(environ)
    try:
        command, cwd, env = prepare(environ)
    except SageMakerError as e:
        print("psrt-sagemaker: %s" % e, file=sys.stderr)
        write_output_file(base, "failure", "psrt-sagemaker: %s\n" % e)
        return BAD_INPUT
    if opts.dry_run:
        changed = {k: v for k, v in env.items() if environ.get(k) != v}
        json.dump({"command": command, "cwd": cwd, "env": changed}, sys.stdout, indent=1, sort_keys=True)
        print()
        return 0
    try:
        for d in (env["SM_MODEL_DIR"], env["SM_OUTPUT_DATA_DIR"]):
            os.makedirs(d, exist_ok=True)  # SageMaker makes them; a hand-made root may not
    except OSError as e:
        print("psrt-sagemaker: %s" % e, file=sys.stderr)
        write_output_file(base, "failure", "psrt-sagemaker: %s\n" % e)
        return BAD_INPUT
    print("psrt-sagemaker: host %s of %s: %s" % (env["SM_CURRENT_HOST"], env["SM_HOSTS"], " ".join(command)),
          file=sys.stderr, flush=True)
    code, tail = run(command, cwd, env)
    if code == 0:
        write_output_file(base, "success", "")
        return 0
    reason = "training failed: %s exited with status %d" % (os.path.basename(command[0]), code)
    # SageMaker shows the first 1024 characters: the reason, then the last
    # lines of error output that fit.
    lines = []
    for line in reversed(tail):
        if len(reason) + sum(len(s) + 1 for s in lines) + len(line) + 1 > 1000:
            break
        lines.insert(0, line)
    write_output_file(base, "failure", "\n".join([reason] + lines) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
