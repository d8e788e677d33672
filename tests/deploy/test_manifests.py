"""The Kubernetes manifests (deploy/k8s) and images (deploy/docker), checked
offline.

- Every manifest validates against the schemas of a current Kubernetes
  release (kubernetes-validate, strict: unknown fields fail), the TFJob
  against the TFJob CRD of Kubeflow's training operator (schemas/) the way
  the API server applies it with strict field validation.
- The names that tie the resources together agree: the Secret the pods read
  the job token from, the Service that names the Job's pods, the ports the
  servers listen on.
- psrt-run itself resolves the cluster from what each pod gets: the TF_CONFIG
  the operator sets (tfjob_tf_config.py) and the Job's --hosts and index. It
  runs with a directory of stand-in daemons (--bin-dir) that record how they
  were started: host index, host name, coordinator address.

Run by ctest (tests/CMakeLists.txt) with PSRT_BIN_DIR naming the programs.
"""

import copy
import json
import os
import re
import shlex
import stat
import subprocess
import sys

import pytest
import yaml

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (scripts/setup.sh frameworks installs it)")
jsonschema = pytest.importorskip("jsonschema")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
K8S = os.path.join(ROOT, "deploy", "k8s")
DOCKER = os.path.join(ROOT, "deploy", "docker")
CRD = os.path.join(HERE, "schemas", "kubeflow.org_tfjobs.yaml")
BIN = os.environ.get("PSRT_BIN_DIR", os.path.join(ROOT, "build", "bin"))
PSRT_RUN = os.path.join(BIN, "psrt-run")
# The newest release kubernetes-validate knows (it keeps the older ones too).
KUBERNETES_VERSION = "1.37"

sys.path.insert(0, HERE)
import tfjob_tf_config  # noqa: E402


# ---- loading -------------------------------------------------------------------


def load_manifests():
    """{file name: [documents]} for every YAML file in deploy/k8s."""
    out = {}
    for name in sorted(os.listdir(K8S)):
        if name.endswith((".yaml", ".yml")):
            with open(os.path.join(K8S, name)) as f:
                out[name] = [d for d in yaml.safe_load_all(f) if d]
    return out


MANIFESTS = load_manifests()


def documents():
    return [(name, doc) for name, docs in MANIFESTS.items() for doc in docs]


def the(kind, name=None):
    found = [d for _, d in documents() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, "expected one %s%s in deploy/k8s, found %d" % (kind, " " + name if name else "", len(found))
    return copy.deepcopy(found[0])


def walk(node, path=()):
    """(path, dict) for every mapping inside `node`."""
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from walk(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, path + (i,))


def containers(pod_spec):
    return list(pod_spec.get("initContainers") or []) + list(pod_spec["containers"])


def workload_pods():
    """(label, pod spec) of every pod the manifests make."""
    pods = []
    for _, doc in documents():
        if doc["kind"] == "TFJob":
            for rtype, spec in doc["spec"]["tfReplicaSpecs"].items():
                pods.append(("TFJob %s" % rtype, spec["template"]["spec"]))
        elif doc["kind"] in ("Job", "StatefulSet", "Deployment"):
            pods.append((doc["kind"], doc["spec"]["template"]["spec"]))
    return pods


def distribution(container):
    values = [a.split("=", 1)[1] for a in container["command"] + container.get("args", [])
              if a.startswith("--distribution=")]
    assert len(values) == 1, container["command"]
    return json.loads(values[0])["parameter_server"]


# ---- validators ----------------------------------------------------------------


def validate_kubernetes(doc):
    """Raises kubernetes_validate.ValidationError where the API server's
    schema for `doc` (strict) refuses it."""
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def _strict(schema):
    """The CRD's structural schema as JSON Schema for the API server's strict
    field validation: objects with listed properties take no others, and
    int32/int64 stay in range."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) if k in ("items", "additionalProperties", "anyOf", "allOf", "oneOf", "not") else v
           for k, v in schema.items()}
    if "properties" in schema:
        out["properties"] = {k: _strict(v) for k, v in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    bits = {"int32": 31, "int64": 63}.get(schema.get("format"))
    if bits and schema.get("type") == "integer":
        out.setdefault("minimum", -2 ** bits)
        out.setdefault("maximum", 2 ** bits - 1)
    if schema.get("nullable"):
        out = {"anyOf": [out, {"type": "null"}]}
    return out


def crd_validator():
    with open(CRD) as f:
        crd = yaml.safe_load(f)
    version = [v for v in crd["spec"]["versions"] if v["name"] == "v1"][0]
    return crd, jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


CRD_DOC, TFJOB_SCHEMA = crd_validator()


def validate_tfjob(doc):
    """Raises jsonschema.ValidationError or kubernetes_validate.ValidationError
    where the API server would refuse the TFJob: its CRD's schema, its
    metadata as every object's, and each replica's pod as a pod of this
    Kubernetes release (the operator creates them through the API server)."""
    group, _, version = doc["apiVersion"].partition("/")
    assert group == CRD_DOC["spec"]["group"] and doc["kind"] == CRD_DOC["spec"]["names"]["kind"], doc["apiVersion"]
    assert version in [v["name"] for v in CRD_DOC["spec"]["versions"] if v["served"]]
    TFJOB_SCHEMA.validate(doc)
    validate_kubernetes({"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]})
    for rtype, spec in doc["spec"]["tfReplicaSpecs"].items():
        validate_kubernetes({"apiVersion": "v1", "kind": "PodTemplate",
                             "metadata": {"name": "%s-%s" % (doc["metadata"]["name"], rtype.lower())},
                             "template": spec["template"]})


def validate(doc):
    (validate_tfjob if doc["kind"] == "TFJob" else validate_kubernetes)(doc)


# ---- schemas -------------------------------------------------------------------


def test_every_manifest_validates_against_kubernetes_or_the_tfjob_crd():
    assert {"tfjob.yaml", "job.yaml", "secret.yaml"} <= set(MANIFESTS)
    for name, doc in documents():
        try:
            validate(doc)
        except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as e:
            pytest.fail("%s: %s %s: %s at %s" % (name, doc["kind"], doc["metadata"]["name"], e.message,
                                                 "/".join(map(str, e.absolute_path))))


def test_the_vendored_crd_is_a_valid_crd_for_tfjobs():
    validate_kubernetes(CRD_DOC)
    assert CRD_DOC["metadata"]["name"] == "tfjobs.kubeflow.org"
    assert the("TFJob")["apiVersion"] == "kubeflow.org/v1"


def _set(doc, path, value=None, rename=None):
    """`doc` with the field at `path` replaced by `value`, or renamed."""
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if rename:
        node[rename] = node.pop(path[-1])
    else:
        node[path[-1]] = value
    return doc


WORKER = ("spec", "tfReplicaSpecs", "Worker")
WORKER_CONTAINER = WORKER + ("template", "spec", "containers", 0)


@pytest.mark.parametrize("kind,path,change", [
    ("TFJob", WORKER + ("replicas",), {"rename": "replica"}),
    ("TFJob", WORKER + ("restartPolicy",), {"rename": "restartpolicy"}),
    ("TFJob", ("spec", "tfReplicaSpecs"), {"rename": "tfReplicaSpec"}),
    ("TFJob", WORKER_CONTAINER + ("ports", 0, "containerPort"), {"rename": "containerport"}),
    ("TFJob", WORKER_CONTAINER + ("env", 0, "valueFrom"), {"rename": "valuefrom"}),
    ("TFJob", WORKER + ("template", "metadata"), {"value": {"generateName": "x-"}}),
    ("TFJob", WORKER + ("replicas",), {"value": "2"}),
    ("TFJob", WORKER + ("replicas",), {"value": 2 ** 31}),
    ("TFJob", ("metadata", "name"), {"rename": "nmae"}),
    ("Job", ("spec", "completionMode"), {"rename": "completionmode"}),
    ("Job", ("spec", "template", "spec", "containers", 0, "command"), {"rename": "commands"}),
    ("Job", ("spec", "completions"), {"value": "3"}),
    ("Service", ("spec", "clusterIP"), {"rename": "clusterIp"}),
    ("Secret", ("stringData",), {"rename": "stringdata"}),
])
def test_a_typo_or_a_wrong_type_is_refused(kind, path, change):
    doc = the(kind)
    validate(doc)
    broken = _set(doc, path, **change)
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        validate(broken)


# ---- names that must agree -------------------------------------------------------


def test_the_job_token_comes_from_the_secret_defined_here():
    secret = the("Secret")
    keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
    pods = workload_pods()
    assert pods
    for label, pod in pods:
        refs = [(c["name"], e["name"], e["valueFrom"]["secretKeyRef"]) for c in containers(pod)
                for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})]
        assert ("PSRT_JOB_TOKEN" in [name for _, name, _ in refs]), "%s: no PSRT_JOB_TOKEN from a Secret" % label
        for container, env, ref in refs:
            assert ref["name"] == secret["metadata"]["name"], (label, container, env, ref)
            assert ref["key"] in keys, (label, container, env, ref, sorted(keys))
    # Nothing else in the manifests names a Secret that is not defined here.
    for name, doc in documents():
        for path, node in walk(doc):
            for key in ("secretKeyRef", "secretRef", "secret"):
                ref = node.get(key)
                if isinstance(ref, dict) and ("name" in ref or "secretName" in ref):
                    assert ref.get("name", ref.get("secretName")) == secret["metadata"]["name"], (name, path, key)


def test_the_service_names_the_jobs_pods():
    job, service = the("Job"), the("Service")
    pod = job["spec"]["template"]
    assert service["spec"]["clusterIP"] == "None", "pod DNS names need a headless Service"
    selector = service["spec"]["selector"]
    labels = pod["metadata"]["labels"]
    assert selector and all(labels.get(k) == v for k, v in selector.items()), (selector, labels)
    assert pod["spec"]["subdomain"] == service["metadata"]["name"]
    # Every port the pods declare is one the Service names.
    service_ports = {p["port"] for p in service["spec"]["ports"]}
    for c in pod["spec"]["containers"]:
        assert {p["containerPort"] for p in c.get("ports", [])} <= service_ports


def test_the_jobs_hosts_are_its_pods_stable_names():
    job, service = the("Job"), the("Service")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"], "every host must run at once"
    (container,) = spec["template"]["spec"]["containers"]
    hosts = [a.split("=", 1)[1] for a in container["command"] if a.startswith("--hosts=")]
    assert len(hosts) == 1
    want = ["%s-%d.%s" % (job["metadata"]["name"], i, service["metadata"]["name"]) for i in range(spec["completions"])]
    assert hosts[0].split(",") == want
    index_env = {e["name"]: e for e in container["env"]}["PSRT_HOST_INDEX"]
    assert index_env["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert "--current-host=$(PSRT_HOST_INDEX)" in container["command"]


def _quantity_bytes(q):
    units = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "K": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9}
    m = re.fullmatch(r"(\d+)([KMG]i?)?", str(q))
    assert m, "unreadable quantity %r" % q
    return int(m.group(1)) * units.get(m.group(2) or "", 1)


def test_every_pod_gives_dev_shm_memory_beyond_the_containers_64_mb():
    """A host's training processes sum in /dev/shm, and every worker keeps
    its transport region there (32 MiB): a container's default 64 MB is
    too small past one process. Each pod mounts a memory-backed emptyDir
    there, sized."""
    pods = workload_pods()
    assert pods
    for label, pod in pods:
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod["containers"]:
            mounts = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
            assert len(mounts) == 1, "%s: container %s mounts nothing at /dev/shm" % (label, c["name"])
            volume = volumes.get(mounts[0]["name"])
            assert volume and volume.get("emptyDir", {}).get("medium") == "Memory", (label, volume)
            assert _quantity_bytes(volume["emptyDir"]["sizeLimit"]) >= 256 * 2 ** 20, (label, volume)


def test_ports_are_the_ones_psrt_listens_on():
    coordinator_port = psrt_default("coordinator-port")
    for label, pod in workload_pods():
        for c in pod["containers"]:
            ps = distribution(c)
            base = ps.get("server_port_base")
            assert base, "%s: without server_port_base the servers' ports are not known in advance" % label
            servers = ps.get("servers_per_host", 1)
            ports = {p["containerPort"]: p.get("name") for p in c.get("ports", [])}
            assert ports.get(int(coordinator_port)) == "coordinator", (label, ports)
            # gRPC, then the data channels (psrt-run --dry-run says the same).
            for port in range(base, base + 2 * servers):
                assert port in ports, (label, port, ports)
            if label.startswith("TFJob"):
                # TF_CONFIG names this port; it is the first server's.
                assert {v: k for k, v in ports.items()}.get("tfjob-port") == base, (label, ports)


def test_tfjob_follows_the_operators_rules_and_psrts():
    tfjob = the("TFJob")
    specs = tfjob["spec"]["tfReplicaSpecs"]
    # psrt numbers hosts from the chief, worker and ps jobs (common/cluster.h);
    # Master and Evaluator would put jobs into TF_CONFIG that it refuses.
    assert set(specs) <= {"Chief", "Worker", "PS"}, sorted(specs)
    assert "Chief" in specs and specs["Chief"].get("replicas", 1) == 1
    commands = set()
    for rtype, spec in specs.items():
        assert spec["restartPolicy"] in ("Always", "OnFailure", "Never", "ExitCode"), rtype
        named = [c for c in spec["template"]["spec"]["containers"] if c["name"] == tfjob_tf_config.DEFAULT_CONTAINER]
        assert len(named) == 1 and named[0].get("image"), \
            "%s: the operator sets TF_CONFIG only in a container named %r" % (rtype, tfjob_tf_config.DEFAULT_CONTAINER)
        commands.add(json.dumps(named[0]["command"]))
    assert len(commands) == 1, "every host runs the same psrt-run command"


# ---- TF_CONFIG as the operator writes it ------------------------------------------


def test_tf_config_is_the_operators_byte_for_byte():
    # What pkg/controller.v1/tensorflow writes for this job (Go's
    # encoding/json: compact, map keys sorted, fields cluster, task,
    # environment).
    tfjob = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "j", "namespace": "ns"},
             "spec": {"tfReplicaSpecs": {
                 "ps": {"template": {"spec": {"containers": [{"name": "tensorflow", "image": "i"}]}}},
                 "Worker": {"replicas": 2, "template": {"spec": {"containers": [
                     {"name": "tensorflow", "image": "i", "ports": [{"name": "tfjob-port", "containerPort": 3333}]}]}}},
                 "CHIEF": {"replicas": 1, "template": {"spec": {"containers": [
                     {"name": "other", "image": "i", "ports": [{"name": "tfjob-port", "containerPort": 4444}]},
                     {"name": "tensorflow", "image": "i"}]}}}}}}
    got = tfjob_tf_config.replicas(tfjob)
    cluster = ('{"chief":["j-chief-0.ns.svc:2222"],"ps":["j-ps-0.ns.svc:2222"],'
               '"worker":["j-worker-0.ns.svc:3333","j-worker-1.ns.svc:3333"]}')
    assert [(r.type, r.index, r.host) for r in got] == [
        ("chief", 0, "j-chief-0.ns.svc"), ("worker", 0, "j-worker-0.ns.svc"),
        ("worker", 1, "j-worker-1.ns.svc"), ("ps", 0, "j-ps-0.ns.svc")]
    assert got[2].tf_config == '{"cluster":%s,"task":{"type":"worker","index":1},"environment":"cloud"}' % cluster
    assert tfjob_tf_config.tf_config(tfjob, "PS", 0, "ns", "cluster.local") == (
        '{"cluster":%s,"task":{"type":"ps","index":0},"environment":"cloud"}'
        % cluster.replace(".svc:", ".svc.cluster.local:"))
    sparse = copy.deepcopy(tfjob)
    sparse["spec"]["enableDynamicWorker"] = True
    assert tfjob_tf_config.tf_config(sparse, "worker", 1, "ns") == (
        '{"sparseCluster":{"worker":{"1":"j-worker-1.ns.svc:3333"},"ps":["j-ps-0.ns.svc:2222"]},'
        '"task":{"type":"worker","index":1}}')
    # One replica in all: the operator sets no TF_CONFIG.
    single = {"metadata": {"name": "j"}, "spec": {"tfReplicaSpecs": {"Worker": {"replicas": 1, "template": {}}}}}
    assert tfjob_tf_config.tf_config(single, "worker", 0, "default") is None


def test_the_command_line_prints_one_line_per_replica():
    out = subprocess.run([sys.executable, os.path.join(HERE, "tfjob_tf_config.py"), "--namespace", "team",
                          os.path.join(K8S, "tfjob.yaml")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=True).stdout
    lines = [line.split(" ", 3) for line in out.splitlines()]
    tfjob = the("TFJob")
    namespace = tfjob["metadata"].get("namespace", "team")
    assert [(t, int(i), h) for t, i, h, _ in lines] == \
        [(r.type, r.index, r.host) for r in tfjob_tf_config.replicas(tfjob, namespace)]
    for t, i, host, config in lines:
        config = json.loads(config)
        assert config["task"] == {"type": t, "index": int(i)}
        assert config["environment"] == "cloud"
        assert config["cluster"][t][int(i)].rsplit(":", 1)[0] == host
        assert host.endswith(".%s.svc" % namespace)


# ---- psrt-run resolves what each pod gets -------------------------------------------

STAND_IN = """#!/bin/sh
# Records how psrt-run started it (one line, written at once: the daemons run
# side by side), then exits as a finished daemon would.
line=$0
for a in "$@"; do line="$line $(printf '%s' "$a" | tr ' ' '_')"; done
printf '%s\\n' "$line" >> "$PSRT_TEST_LOG"
"""


def needs_psrt_run():
    if not os.access(PSRT_RUN, os.X_OK):
        pytest.skip("no %s: build psrt first (make build)" % PSRT_RUN)


def psrt_default(flag):
    """The default psrt-run prints for --FLAG in its --help."""
    needs_psrt_run()
    text = subprocess.run([PSRT_RUN, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    m = re.search(r"--%s\n.*?\(default: ([^)]*)\)" % re.escape(flag), text, re.S)
    assert m, text
    return m.group(1).strip('"')


def expand(value, env):
    """Kubernetes' $(VAR) expansion in a container's command ($$ escapes)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)


def run_host(tmp_path, command, env):
    """Runs the pod's psrt-run command with stand-in daemons; returns
    {program: {flag: value}} of what it started."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("psrt-coordinator", "psrt-worker", "psrt-server"):
        path = bin_dir / name
        path.write_text(STAND_IN)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    log = tmp_path / "started.log"
    if log.exists():
        log.unlink()
    assert command[0] == "psrt-run", command
    argv = [PSRT_RUN, "--bin-dir=%s" % bin_dir] + command[1:]
    clean = {k: v for k, v in os.environ.items()
             if k not in ("TF_CONFIG", "SM_HOSTS", "SM_CURRENT_HOST", "PSRT_INTERFACE", "PSRT_ADVERTISE_ADDRESS")}
    clean.update(env, PSRT_TEST_LOG=str(log))
    p = subprocess.run(argv, env=clean, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode == 0, "%s\n%s" % (" ".join(shlex.quote(a) for a in argv), p.stdout)
    started = {}
    for line in log.read_text().splitlines():
        program, *args = line.split(" ")
        flags = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
        started[os.path.basename(program)] = flags
    return started


def check_host(started, hosts, index, coordinator_port):
    worker = started["psrt-worker"]
    assert worker["host-index"] == str(index), worker
    assert worker["host"] == hosts[index], worker
    assert worker["coordinator"] == "%s:%s" % (hosts[0], coordinator_port), worker
    if index == 0:
        assert started["psrt-coordinator"]["hosts"] == ",".join(hosts)
        assert started["psrt-coordinator"]["port"] == coordinator_port
    else:
        assert "psrt-coordinator" not in started, "only host 0 runs the coordinator"


def test_psrt_run_resolves_the_tf_config_of_every_tfjob_replica(tmp_path):
    needs_psrt_run()
    coordinator_port = psrt_default("coordinator-port")
    tfjob = the("TFJob")
    replicas = tfjob_tf_config.replicas(tfjob)
    token = list(the("Secret")["stringData"].values())[0]
    # common/cluster.h: the hosts of the chief, worker and ps jobs, in that
    # order, ports stripped.
    cluster = json.loads(replicas[0].tf_config)["cluster"]
    hosts = [a.rsplit(":", 1)[0] for job in ("chief", "worker", "ps") for a in cluster.get(job, [])]
    assert [r.host for r in replicas] == hosts
    specs = {t.lower(): s for t, s in tfjob["spec"]["tfReplicaSpecs"].items()}
    for r in replicas:
        (container,) = [c for c in specs[r.type]["template"]["spec"]["containers"] if c["name"] == "tensorflow"]
        started = run_host(tmp_path, container["command"], {"TF_CONFIG": r.tf_config, "PSRT_JOB_TOKEN": token})
        check_host(started, hosts, hosts.index(r.host), coordinator_port)


def test_psrt_run_resolves_the_hosts_of_every_job_index(tmp_path):
    needs_psrt_run()
    coordinator_port = psrt_default("coordinator-port")
    job = the("Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    hosts = [a.split("=", 1)[1] for a in container["command"] if a.startswith("--hosts=")][0].split(",")
    token = list(the("Secret")["stringData"].values())[0]
    for index in range(job["spec"]["completions"]):
        # What the kubelet gives the container: its env, the completion index
        # from the pod's annotation, then $(VAR) expanded in the command.
        env = {}
        for e in container["env"]:
            if "value" in e:
                env[e["name"]] = expand(e["value"], env)
            elif e["valueFrom"].get("fieldRef", {}).get("fieldPath", "").endswith("job-completion-index']"):
                env[e["name"]] = str(index)
            elif "secretKeyRef" in e["valueFrom"]:
                env[e["name"]] = token
        command = [expand(a, env) for a in container["command"]]
        started = run_host(tmp_path, command, env)
        check_host(started, hosts, index, coordinator_port)


def test_psrt_run_refuses_a_tf_config_with_a_master(tmp_path):
    # Why tfjob.yaml says Chief: a Master replica puts a "master" job into
    # TF_CONFIG, which psrt does not number as a host.
    needs_psrt_run()
    tfjob = the("TFJob")
    specs = tfjob["spec"]["tfReplicaSpecs"]
    specs["Master"] = specs.pop("Chief")
    r = tfjob_tf_config.replicas(tfjob)[0]
    container = specs["Master"]["template"]["spec"]["containers"][0]
    env = {k: v for k, v in os.environ.items() if k not in ("SM_HOSTS", "SM_CURRENT_HOST")}
    env["TF_CONFIG"] = r.tf_config
    p = subprocess.run([PSRT_RUN, "--bin-dir=%s" % tmp_path] + container["command"][1:], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert p.returncode != 0 and "unknown job 'master'" in p.stdout, p.stdout


# ---- images ----------------------------------------------------------------------


def dockerfile(name):
    with open(os.path.join(DOCKER, name)) as f:
        text = f.read().replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def cmake_source_dirs():
    """Top-level folders whose files CMakeLists.txt compiles."""
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        text = f.read()
    paths = re.findall(r"(?:\$\{CMAKE_SOURCE_DIR\}/)?\b([a-z_]+)/[\w/${}.]*\.(?:cc|cu|proto)\b", text)
    return set(paths)


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda"])
def test_images_build_with_the_projects_own_steps(name):
    lines = dockerfile(name)
    froms = [line.split()[1] for line in lines if line.startswith("FROM ")]
    assert len(froms) >= 2, "a build stage and a run-time stage"
    if name.endswith(".cuda"):
        assert all(f.startswith("nvidia/cuda:") for f in froms), froms
    else:
        assert all(f == "debian:12" for f in froms), froms
    runs = " ".join(line for line in lines if line.startswith("RUN "))
    assert "scripts/setup.sh" in runs
    assert re.search(r"pip install [^&]*\s\.(\s|$)", runs), "pip builds pyproject.toml"
    copied = set()
    for line in lines:
        if line.startswith("COPY ") and "--from=" not in line:
            sources = line.split()[1:-1]
            for src in sources:
                assert os.path.exists(os.path.join(ROOT, src)), "%s copies %s, which is not in the repository" % (name, src)
                copied.add(src.rstrip("/"))
    for needed in sorted(cmake_source_dirs() | {"CMakeLists.txt", "pyproject.toml", "README.md", "scripts/setup.sh"}):
        assert needed in copied or any(needed.startswith(c + "/") for c in copied), \
            "%s does not copy %s, which the build reads" % (name, needed)
    # SageMaker runs `docker run IMAGE train`: no ENTRYPOINT in the way, and
    # an executable train on PATH.
    assert not any(line.startswith("ENTRYPOINT") for line in lines)
    train = [line.split()[1] for line in lines if line.startswith("COPY ") and line.split()[-1] == "/usr/local/bin/train"]
    assert len(train) == 1 and os.access(os.path.join(ROOT, train[0]), os.X_OK), train
    # The manifests' training script is in the image.
    examples = [line.split() for line in lines if line.startswith("COPY ") and line.split()[1] == "examples"]
    assert examples and examples[0][-1] == "/opt/psrt/examples"
    for label, pod in workload_pods():
        for c in pod["containers"]:
            for arg in c["command"]:
                if arg.startswith("/opt/psrt/examples/"):
                    assert os.path.exists(os.path.join(ROOT, "examples", arg[len("/opt/psrt/examples/"):])), \
                        (label, arg)
