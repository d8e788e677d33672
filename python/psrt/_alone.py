"""psrt.init() in a process that psrt-run did not start (``python train.py``):
a job of one worker on this machine, as ``hvd.init()`` is a job of one.

``psrt-run --local=1`` starts in the background with the job's daemons (the
coordinator, a server, the agent) and a relay as its training process
(psrt/_relay.py), which hands this process the environment a training
process gets. This process then trains through the servers as it would in
any job: the same optimizer on the servers, the same checkpoints. When it
exits, the relay exits with its code and the job ends, daemons included;
should it die without a word, the relay sees that and the job fails.

The distribution is $PSRT_DISTRIBUTION when set, else psrt-run's default
({"parameter_server": {"enabled": true}}: sync).
"""

import atexit
import os
import shutil
import sys
import tempfile

from psrt import _relay
from psrt._programs import find_programs

_PROGRAMS = ("psrt-run", "psrt-coordinator", "psrt-server", "psrt-worker")
START_TIMEOUT_S = 60.0
# The job's end after this process's: a final checkpoint may be written.
END_TIMEOUT_S = 60.0


class Job:
    """The background job: start() it, then end() it with this process's
    exit code."""

    def __init__(self, error):
        self._error = error  # the exception class to raise
        self._dir = None
        self._run = None

    def start(self):
        """Starts the job; returns the environment of its training process."""
        try:
            bin_dir = find_programs(_PROGRAMS)
        except FileNotFoundError as e:
            raise self._error("psrt.init(): a job of one needs psrt's programs: %s" % e) from None
        self._dir = tempfile.mkdtemp(prefix="psrt-alone-")
        argv = [os.path.join(bin_dir, "psrt-run"), "--local=1"]
        if os.environ.get("PSRT_DISTRIBUTION"):
            argv.append("--distribution=" + os.environ["PSRT_DISTRIBUTION"])
        argv += ["--", sys.executable, "-c", _relay.RELAY, self._dir, str(os.getpid())]
        self._run = _relay.Process("psrt-run", argv, dict(os.environ))
        return self._environment()

    def _environment(self):
        def gone():
            if self._run.proc.poll() is None:
                return None
            status = self._run.wait(1.0)
            return "exited with code %d before its training process started:\n%s" % (status["code"],
                                                                                       status["output"])

        try:
            return _relay.take_environment(self._dir, 0, START_TIMEOUT_S, gone, "it")
        except (RuntimeError, TimeoutError) as e:
            self._run.stop()
            self._cleanup()
            raise self._error("psrt.init(): psrt-run --local=1 (a job of one): %s" % e) from None

    def end(self, code):
        """This process is done: the relay exits with `code`, and the job
        ends (within END_TIMEOUT_S, else its processes are stopped)."""
        if self._run is None:
            return
        _relay.end_relay(self._dir, 0, code)
        status = self._run.wait(END_TIMEOUT_S)
        if status["code"] is None:
            self._run.stop()
        self._cleanup()
        self._run = None

    def _cleanup(self):
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def start(error):
    """Starts a job of one, puts its environment into os.environ and ends
    the job when the interpreter exits. Returns the job."""
    job = Job(error)
    os.environ.update(job.start())
    failed = []
    previous = sys.excepthook

    def note_failure(*exc_info):
        failed.append(exc_info)
        previous(*exc_info)

    sys.excepthook = note_failure  # an uncaught exception fails the job
    # Registered before the client's finish (atexit runs last in first).
    atexit.register(lambda: job.end(1 if failed else 0))
    return job
