"""psrt: parameter-server training.

Framework plugins live in subpackages (``import psrt.torch as psrt``); this
module holds what they share: the connection to the job that ``psrt-run``
started, and the compression choices.
"""

import atexit
import enum
import os
import sys

# The C API links Debian's gRPC, protobuf and Abseil; frameworks bring their
# own copies of the same libraries and TensorFlow exports them to every
# library loaded after it. RTLD_DEEPBIND makes psrt's libraries resolve
# their own symbols first, so the two never mix, whichever is imported first.
_flags = sys.getdlopenflags()
sys.setdlopenflags(_flags | os.RTLD_DEEPBIND)
try:
    from psrt import _psrt
finally:
    sys.setdlopenflags(_flags)
from psrt import _alone  # noqa: E402

PsrtError = _psrt.PsrtError

_client = None


class Compression(enum.Enum):
    """How gradients travel to the servers (and weights back)."""

    none = _psrt.COMPRESSION_NONE
    fp16 = _psrt.COMPRESSION_FP16
    bf16 = _psrt.COMPRESSION_BF16
    job_default = _psrt.COMPRESSION_JOB_DEFAULT


def init():
    """Connects this training process to its job; idempotent.

    Reads what ``psrt-run`` and its agents put in the environment
    (``PSRT_COORDINATOR``, ``PSRT_RANK``, ``PSRT_JOB_TOKEN``), registers with
    the coordinator and waits at the readiness barrier. In a process psrt-run
    did not start (``python train.py``) it first starts a job of one worker
    on this machine in the background (psrt/_alone.py), as ``hvd.init()``
    makes a job of one: the script trains as it would in a job.
    """
    global _client
    if _client is None:
        if not os.environ.get("PSRT_COORDINATOR"):
            print("psrt.init(): not started by psrt-run: training as a job of one worker on this "
                  "machine (psrt-run --local=1 in the background; $PSRT_DISTRIBUTION sets its "
                  "distribution). Launch with psrt-run for more workers.", file=sys.stderr, flush=True)
            _alone.start(PsrtError)
        _client = _psrt.Client()
        # The job's summary gets this process's totals as it exits (the
        # interpreter may never destroy the client).
        atexit.register(_client.finish)
    return _client


def client():
    """The connection init() made; an error before init()."""
    if _client is None:
        raise PsrtError("psrt is not initialised: call psrt.init() first")
    return _client


def rank():
    return client().rank()


def size():
    return client().num_workers()


def num_servers():
    return client().num_servers()


def active_workers():
    """Workers taking part now: fewer than size() once some left or, in an
    elastic job, before all joined."""
    return client().active_workers()


def local_rank():
    """This process's index on its host (PSRT_LOCAL_RANK)."""
    client()
    return int(os.environ.get("PSRT_LOCAL_RANK", "0"))


def is_sync():
    return client().is_sync()


def restored_step():
    """The step a job started from a checkpoint resumes at (0 when fresh)."""
    return client().restored_step()
