"""psrt jobs under a real Slurm (Debian's slurm-wlm): munged, slurmctld and
two slurmd of one machine (`slurmd -N psrt-n1`, `-N psrt-n2`, NodeAddr
127.0.0.1, a port each), started here in a temporary directory and stopped
after. The node names resolve to 127.0.0.1 inside each slurmd's own mount
namespace, where a hosts file is bound over /etc/hosts, so psrt-run takes the
job's hosts from Slurm's node list as on a cluster and nothing of the
machine's own configuration changes. Both psrt-runs share the machine: the
coordinator's port is a free one and the servers pick free ports."""

import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from jobs import BIN

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo", "unshare")
NODES = ("psrt-n1", "psrt-n2")
PS = '{"parameter_server": {"enabled": true, "mode": "sync", "heartbeat_timeout_s": 5}}'


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


def slurm_conf(d, host, ports):
    return "\n".join([
        "ClusterName=psrt",
        "SlurmctldHost=%s(127.0.0.1)" % host,
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
    ] + ["NodeName=%s NodeAddr=127.0.0.1 Port=%d CPUs=2" % (n, p) for n, p in zip(NODES, ports[1:])] +
        ["PartitionName=psrt Nodes=psrt-n[1-2] Default=YES MaxTime=INFINITE State=UP", ""])


class Slurm:
    """The daemons of a two-node Slurm cluster on this machine."""

    def __init__(self, d):
        self.dir = str(d)
        self.procs = []
        self.env = dict(os.environ, SLURM_CONF=os.path.join(self.dir, "slurm.conf"))

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
        ports = [free_port() for _ in range(3)]
        with open(self.env["SLURM_CONF"], "w") as f:
            f.write(slurm_conf(d, socket.gethostname().split(".")[0], ports))
        with open(os.path.join(d, "hosts"), "w") as f:
            f.write("127.0.0.1 localhost %s\n" % " ".join(NODES))
        os.mkdir(os.path.join(d, "ctld"))
        self.spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", self.env["SLURM_CONF"]])
        for node in NODES:
            # exec: the pid is slurmd's, in a mount namespace of its own.
            self.spawn(node, ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                              'mount --bind "$1" /etc/hosts && exec slurmd -D -N "$2" -f "$3"', "_",
                              os.path.join(d, "hosts"), node, self.env["SLURM_CONF"]])
        wait_for("both Slurm nodes idle", self.nodes_idle, 30, self.log)

    def nodes_idle(self):
        p = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True, text=True,
                           timeout=10)
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

    def run(self, argv, timeout=120):
        return subprocess.run(argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root: slurmd, munged and the mount namespaces of the node names run as root")
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        pytest.skip("%s not installed (scripts/setup.sh s3 installs slurm-wlm and munge)" % ", ".join(missing))
    cluster = Slurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def psrt_run(*args):
    return [os.path.join(BIN, "psrt-run"), "--coordinator-port=%d" % free_port(), "--distribution=" + PS,
            *args, "--", os.path.join(BIN, "psrt-example-linreg"), "--steps=20", "--log-every=10"]


def assert_two_workers(log):
    assert "job succeeded" in log and "on 2 workers" in log, log
    assert log.count("rank 0 final loss") == 1 and log.count("rank 1 final loss") == 1, log


def test_srun_runs_one_job_over_both_nodes(slurm):
    p = slurm.run(["srun", "-N2", "--ntasks-per-node=1", "--time=2"] + psrt_run())
    assert p.returncode == 0, p.stdout + slurm.log()
    assert_two_workers(p.stdout)
    # Each node's psrt-run was its own host of the job: one of them started the coordinator.
    assert "for 1 of 2 hosts" in p.stdout, p.stdout


def test_sbatch_runs_one_job_over_both_nodes(slurm, tmp_path):
    script = tmp_path / "job.sh"
    out = tmp_path / "job.out"
    script.write_text("#!/bin/sh\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
                      "exec srun %s\n" % " ".join("'%s'" % a for a in psrt_run()))
    # --wait: sbatch returns when the job ended, with its exit code.
    p = slurm.run(["sbatch", "--wait", "--time=2", "-o", str(out), str(script)])
    log = out.read_text() if out.exists() else ""
    assert p.returncode == 0, p.stdout + log + slurm.log()
    assert_two_workers(log)


def test_a_step_of_one_node_is_a_job_of_this_host(slurm):
    p = slurm.run(["srun", "-N1", "--ntasks-per-node=1", "--time=1"] + psrt_run("--workers=2"))
    assert p.returncode == 0, p.stdout + slurm.log()
    assert "job succeeded" in p.stdout and "on 2 workers" in p.stdout, p.stdout
    # As --local=1: a token made up, nothing announced beyond loopback.
    assert "no job token" not in p.stdout, p.stdout


def test_several_tasks_per_node_are_refused(slurm):
    p = slurm.run(["srun", "-N1", "-n2", "--time=1"] + psrt_run())
    assert p.returncode != 0, p.stdout
    assert "psrt-run must run once per node" in p.stdout, p.stdout
    assert "final loss" not in p.stdout, p.stdout


def test_local_in_a_step_of_two_nodes_is_refused(slurm):
    p = slurm.run(["srun", "-N2", "--ntasks-per-node=1", "--time=1"] + psrt_run("--local=1"))
    assert p.returncode != 0, p.stdout
    assert p.stdout.count("--local runs the whole job on this machine, but Slurm: this step runs on 2 nodes") == 2, \
        p.stdout
    assert "final loss" not in p.stdout, p.stdout


def test_the_batch_script_alone_is_refused(slurm, tmp_path):
    script = tmp_path / "alone.sh"
    out = tmp_path / "alone.out"
    script.write_text("#!/bin/sh\nexec %s\n" % " ".join("'%s'" % a for a in psrt_run()))
    p = slurm.run(["sbatch", "--wait", "-N2", "--time=1", "-o", str(out), str(script)])
    log = out.read_text() if out.exists() else ""
    assert p.returncode != 0, log
    assert "outside a step of Slurm job" in log and "srun --ntasks-per-node=1" in log, log
    assert "final loss" not in log, log
