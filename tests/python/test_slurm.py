"""psrt jobs under a real Slurm (Debian's slurm-wlm): munged, slurmctld and
two slurmd of one machine (`slurmd -N psrt-n1`, `-N psrt-n2`), started here
in a temporary directory and stopped after, in two layouts:

- loopback: both nodes at NodeAddr 127.0.0.1 with a port each; the node names
  resolve to 127.0.0.1 inside each slurmd's own mount namespace (a hosts file
  bound over /etc/hosts). Both psrt-runs share the machine's ports: the
  coordinator's is a free one and the servers pick free ports.
- netns: each node a network namespace of its own (10.214.0.1 and .2, joined
  by a bridge in a third), with Slurm's and psrt's default ports on both, as
  separate machines have them; the names resolve to those addresses through
  the same kind of bound hosts file.

Either way psrt-run takes the job's hosts from Slurm's node list as on a
cluster, and nothing of the machine's own configuration changes."""

import os
import re
import shutil
import signal
import socket
import subprocess
import time

import pytest

from jobs import BIN

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo", "unshare", "nsenter", "ip")
NODES = ("psrt-n1", "psrt-n2")
PS = '{"parameter_server": {"enabled": true, "mode": "sync", "heartbeat_timeout_s": 5%s}}'
SUBNET = "10.214.0."


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, check, timeout, log=""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError("%s within %d s%s" % (what, timeout, ("\n" + log()) if log else ""))


def slurm_conf(d, host, ports, addresses):
    return "\n".join([
        "ClusterName=psrt",
        "SlurmctldHost=%s(%s)" % (host, addresses[0]),
        "SlurmctldPort=%d" % ports[0],
        "AuthType=auth/munge",
        "AuthInfo=socket=%s/munge.sock" % d,
        "CredType=cred/munge",
        "SlurmUser=root",
        "SlurmdUser=root",
        "StateSaveLocation=%s/ctld" % d,
        "SlurmdSpoolDir=%s/slurmd.%%n" % d,
        "SlurmctldPidFile=%s/slurmctld.pid" % d,
        "SlurmdPidFile=%s/slurmd.%%n.pid" % d,
        "SlurmctldLogFile=%s/slurmctld.log" % d,
        "SlurmdLogFile=%s/slurmd.%%n.log" % d,
        # No cgroups in a container: processes are tracked by their parents.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "MpiDefault=none",
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",
    ] + ["NodeName=%s NodeAddr=%s Port=%d CPUs=2" % (n, a, p) for n, a, p in zip(NODES, addresses, ports[1:])] +
        ["PartitionName=psrt Nodes=psrt-n[1-2] Default=YES MaxTime=INFINITE State=UP", ""])


def sh(*argv):
    subprocess.run(argv, check=True, timeout=30, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class Namespaces:
    """Two hosts as network namespaces on a bridge (in a namespace of its
    own)."""

    def __init__(self):
        base = "psrt-slurm-%d" % os.getpid()
        self.bridge, self.hosts = base + "-br", [base + "-%d" % h for h in range(len(NODES))]
        self.made = []

    def create(self):
        sh("ip", "netns", "add", self.bridge)
        self.made.append(self.bridge)
        sh("ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.bridge, "link", "set", "br0", "up")
        for h, ns in enumerate(self.hosts):
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", self.bridge, "link", "add", "b%d" % h, "type", "veth", "peer", "name", "eth0",
               "netns", ns)
            sh("ip", "-n", self.bridge, "link", "set", "b%d" % h, "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", "%s%d/24" % (SUBNET, h + 1), "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")

    def delete(self):
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], timeout=30)

    def exec(self, host):
        # nsenter, not `ip netns exec`, which mounts a /sys without cgroups
        # (slurmd needs them even when it does not use them).
        return ["nsenter", "--net=/run/netns/" + self.hosts[host]]


class Slurm:
    """The daemons of a two-node Slurm cluster on this machine; with
    `namespaces`, each node in one of them."""

    def __init__(self, d, namespaces=None):
        self.dir = str(d)
        self.procs = []
        # srun hands this environment to the tasks (as the sbatch example's
        # token): psrt-run logs at info.
        self.env = dict(os.environ, SLURM_CONF=os.path.join(self.dir, "slurm.conf"), PSRT_LOG_LEVEL="info",
                        PSRT_JOB_TOKEN=os.urandom(16).hex())
        self.ns = namespaces
        # Slurm's commands run where slurmctld is: the first node.
        self.client = namespaces.exec(0) if namespaces else []

    def log(self):
        parts = []
        for name in sorted(os.listdir(self.dir)):
            if name.endswith((".log", ".out")):
                with open(os.path.join(self.dir, name), errors="replace") as f:
                    parts.append("--- %s\n%s" % (name, f.read()[-3000:]))
        return "\n".join(parts)

    def spawn(self, name, argv):
        out = open(os.path.join(self.dir, name + ".out"), "w")
        self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                           start_new_session=True))

    def start(self):
        d = self.dir
        with open(os.path.join(d, "munge.key"), "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(os.path.join(d, "munge.key"), 0o600)
        self.spawn("munged", ["munged", "--foreground", "--force", "--key-file=%s/munge.key" % d,
                              "--socket=%s/munge.sock" % d, "--pid-file=%s/munged.pid" % d,
                              "--log-file=%s/munged.log" % d, "--seed-file=%s/munge.seed" % d])
        wait_for("munged's socket", lambda: os.path.exists(os.path.join(d, "munge.sock")), 30, self.log)
        if self.ns:
            ports, addresses = [6817, 6818, 6818], ["%s%d" % (SUBNET, h + 1) for h in range(len(NODES))]
        else:
            ports, addresses = [free_port() for _ in range(3)], ["127.0.0.1"] * len(NODES)
        with open(self.env["SLURM_CONF"], "w") as f:
            f.write(slurm_conf(d, socket.gethostname().split(".")[0], ports, addresses))
        with open(os.path.join(d, "hosts"), "w") as f:
            f.write("127.0.0.1 localhost\n" + "".join("%s %s\n" % (a, n) for a, n in zip(addresses, NODES)))
        os.mkdir(os.path.join(d, "ctld"))
        self.spawn("slurmctld", self.client + ["slurmctld", "-D", "-c", "-f", self.env["SLURM_CONF"]])
        for h, node in enumerate(NODES):
            # exec: the pid is slurmd's, in a mount namespace of its own.
            self.spawn(node, (self.ns.exec(h) if self.ns else []) +
                       ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        'mount --bind "$1" /etc/hosts && exec slurmd -D -N "$2" -f "$3"', "_",
                        os.path.join(d, "hosts"), node, self.env["SLURM_CONF"]])
        wait_for("both Slurm nodes idle", self.nodes_idle, 30, self.log)

    def nodes_idle(self):
        p = subprocess.run(self.client + ["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True,
                           text=True, timeout=10)
        return sorted(p.stdout.split()) == sorted(["idle", "idle", *NODES])

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def run(self, argv, timeout=120, drop=()):
        env = {k: v for k, v in self.env.items() if k not in drop}
        return subprocess.run(self.client + argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)

    def psrt_run(self, *args):
        """psrt-run of the example: in namespaces with psrt's default and
        fixed ports on both nodes, on loopback with free ones."""
        ports = [] if self.ns else ["--coordinator-port=%d" % free_port()]
        ps = PS % (', "server_port_base": 7100' if self.ns else "")
        example = [os.path.join(BIN, "psrt-example-linreg"), "--steps=20", "--log-every=10"]
        return [os.path.join(BIN, "psrt-run")] + ports + ["--distribution=" + ps, *args, "--"] + example


@pytest.fixture(scope="module", params=["loopback", "netns"])
def slurm(request, tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root: slurmd, munged and the namespaces of the nodes run as root")
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        pytest.skip("%s not installed (scripts/setup.sh s3 installs slurm-wlm, munge and iproute2)"
                    % ", ".join(missing))
    namespaces = Namespaces() if request.param == "netns" else None
    cluster = Slurm(tmp_path_factory.mktemp("slurm"), namespaces)
    try:
        if namespaces:
            namespaces.create()
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        if namespaces:
            namespaces.delete()


def assert_two_workers(log):
    assert "job succeeded" in log and "on 2 workers" in log, log
    assert log.count("rank 0 final loss") == 1 and log.count("rank 1 final loss") == 1, log


def test_srun_runs_one_job_over_both_nodes(slurm):
    p = slurm.run(["srun", "-N2", "--ntasks-per-node=1", "--time=2"] + slurm.psrt_run())
    assert p.returncode == 0, p.stdout + slurm.log()
    assert_two_workers(p.stdout)
    # Each node's psrt-run was its own host of the job, named as Slurm names it: the first node
    # runs the coordinator, each node a server (in namespaces both on port 7100).
    assert p.stdout.count("for 1 of 2 hosts; coordinator at psrt-n1:") == 2, p.stdout
    ports = ("7100", "7100") if slurm.ns else (r"\d+", r"\d+")
    for i, node in enumerate(NODES):
        assert re.search(r"registered server %d on %s at %s:%s " % (i, node, node, ports[i]), p.stdout), p.stdout


def test_sbatch_runs_one_job_over_both_nodes(slurm, tmp_path):
    script = tmp_path / "job.sh"
    out = tmp_path / "job.out"
    script.write_text("#!/bin/sh\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
                      "exec srun %s\n" % " ".join("'%s'" % a for a in slurm.psrt_run()))
    # --wait: sbatch returns when the job ended, with its exit code.
    p = slurm.run(["sbatch", "--wait", "--time=2", "-o", str(out), str(script)])
    log = out.read_text() if out.exists() else ""
    assert p.returncode == 0, p.stdout + log + slurm.log()
    assert_two_workers(log)


def test_a_step_of_one_node_is_a_job_of_this_host(slurm):
    p = slurm.run(["srun", "-N1", "--ntasks-per-node=1", "--time=1"] + slurm.psrt_run("--workers=2"),
                  drop=["PSRT_JOB_TOKEN"])
    assert p.returncode == 0, p.stdout + slurm.log()
    assert "job succeeded" in p.stdout and "on 2 workers" in p.stdout, p.stdout
    # As --local=1: a token made up, nothing announced beyond loopback.
    assert "no job token" not in p.stdout, p.stdout


def test_several_tasks_per_node_are_refused(slurm):
    p = slurm.run(["srun", "-N1", "-n2", "--time=1"] + slurm.psrt_run())
    assert p.returncode != 0, p.stdout
    assert "psrt-run must run once per node" in p.stdout, p.stdout
    assert "final loss" not in p.stdout, p.stdout


def test_local_in_a_step_of_two_nodes_is_refused(slurm):
    p = slurm.run(["srun", "-N2", "--ntasks-per-node=1", "--time=1"] + slurm.psrt_run("--local=1"))
    assert p.returncode != 0, p.stdout
    assert p.stdout.count("--local runs the whole job on this machine, but Slurm: this step runs on 2 nodes") == 2, \
        p.stdout
    assert "final loss" not in p.stdout, p.stdout


def test_the_batch_script_alone_is_refused(slurm, tmp_path):
    script = tmp_path / "alone.sh"
    out = tmp_path / "alone.out"
    script.write_text("#!/bin/sh\nexec %s\n" % " ".join("'%s'" % a for a in slurm.psrt_run()))
    p = slurm.run(["sbatch", "--wait", "-N2", "--time=1", "-o", str(out), str(script)])
    log = out.read_text() if out.exists() else ""
    assert p.returncode != 0, log
    assert "outside a step of Slurm job" in log and "srun --ntasks-per-node=1" in log, log
    assert "final loss" not in log, log
