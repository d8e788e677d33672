"""A training process that stands in for one running elsewhere: the pieces
that psrt.ray's actors and a job of one started by psrt.init() share.

psrt's agent (psrt-worker) starts the RELAY as a training process. It hands
its environment (PSRT_COORDINATOR, PSRT_RANK, PSRT_JOB_TOKEN, ...) to the
process that really trains, through a directory, and exits with the code
that process writes there once it is done, so the agent reports its end to
the coordinator as it would a training process's exit.
"""

import collections
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1
_TAIL_LINES = 40
# How long stopped programs get to exit before SIGKILL.
STOP_GRACE_S = 5.0

# argv: the directory, then (optional) the pid of the process that trains:
# should it die without a word, the relay exits 1 and the job ends.
RELAY = r"""
import json, os, sys, time
d, local = sys.argv[1], os.environ["PSRT_LOCAL_RANK"]
watched = int(sys.argv[2]) if len(sys.argv) > 2 else 0
env = {k: v for k, v in os.environ.items() if k.startswith("PSRT_")}
with open(os.path.join(d, "env.%s.tmp" % local), "w") as f:
    json.dump(env, f)
os.rename(os.path.join(d, "env.%s.tmp" % local), os.path.join(d, "env.%s.json" % local))
code = os.path.join(d, "exit.%s" % local)
while not os.path.exists(code):
    if not os.path.isdir(d):
        sys.exit(1)
    if watched:
        try:
            os.kill(watched, 0)
        except ProcessLookupError:
            sys.exit(1)
    time.sleep(0.05)
with open(code) as f:
    sys.exit(int(f.read()))
"""


def take_environment(job_dir, local_rank, timeout_s, gone, starter):
    """The environment the relay of `local_rank` left in `job_dir`, removed
    once read (it holds the job token). `gone()` says why it never will come
    (the program that starts the relay exited), else None: RuntimeError
    with that; TimeoutError after timeout_s, naming `starter`."""
    path = os.path.join(job_dir, "env.%d.json" % local_rank)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                env = json.load(f)
            os.remove(path)
            return env
        why = gone()
        if why:
            raise RuntimeError(why)
        time.sleep(0.05)
    raise TimeoutError("%s did not start the training process of local rank %d within %g s (waited for %s)"
                       % (starter, local_rank, timeout_s, path))


def write_atomically(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def end_relay(job_dir, local_rank, code):
    """Lets the relay of `local_rank` exit with `code`, once."""
    path = os.path.join(job_dir, "exit.%d" % local_rank)
    if os.path.isdir(job_dir) and not os.path.exists(path):
        write_atomically(path, str(code))


class Process:
    """A psrt program run by a Python process (a Ray actor, or psrt.init()
    outside psrt-run). Its output goes to the process's (Ray shows it at the
    driver), the last lines are kept for error messages, and it gets SIGTERM
    when the process dies."""

    def __init__(self, name, argv, env, on_exit=None):
        self.name = name
        self.tail = collections.deque(maxlen=_TAIL_LINES)
        libc = ctypes.CDLL(None, use_errno=True)
        parent = os.getpid()

        def die_with_parent():
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # the parent died before prctl
                os._exit(127)

        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
                                     text=True, errors="replace")
        self._reader = threading.Thread(target=self._pass_on, args=(on_exit,), daemon=True)
        self._reader.start()

    def _pass_on(self, on_exit):
        for line in self.proc.stdout:
            self.tail.append(line)
            sys.stdout.write(line)
            sys.stdout.flush()
        code = self.proc.wait()
        if on_exit is not None:
            on_exit(code, self.output())

    def output(self):
        return "".join(self.tail)

    def status(self):
        """{"name", "code" (None while it runs), "output" (its last lines)}."""
        return {"name": self.name, "code": self.proc.poll(), "output": self.output()}

    def wait(self, timeout_s):
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        self._reader.join(timeout=1.0)
        return self.status()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=1.0)
        return self.status()


