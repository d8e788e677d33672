"""benchmarks/coordinator_load against a real psrt-coordinator, small: the
played job starts, heartbeats, takes a membership epoch, checkpoints through
the played servers and ends, so that the load generator (and the
coordinator's checkpoint rounds over many servers) cannot rot between
`make bench` runs. Its figures are not judged here."""

import json
import os
import subprocess
import tempfile

from jobs import BIN


def test_a_played_job_of_32_hosts_checkpoints_and_succeeds():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "load.json")
        p = subprocess.run([os.path.join(BIN, "coordinator_load"), "--hosts=32", "--seconds=2", "--step-ms=100",
                            "--checkpoint-every=2", "--json=" + out],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        assert p.returncode == 0, p.stdout
        with open(out) as f:
            (result,) = json.load(f)["results"]
    assert "failed" not in result, result
    assert result["hosts"] == 32 and result["processes"] == 96
    # Every played process registered, and the 32 training processes passed
    # the barrier.
    assert result["register"]["count"] == 96 and result["barrier"]["count"] == 32, result
    assert result["heartbeat"]["count"] > 0 and result["heartbeat_errors"] == 0, result
    # 2 s at a step every 100 ms and a checkpoint every 2 steps: the rounds
    # over 32 servers committed several.
    assert result["checkpoints"] >= 2, result
    # The failed training process's epoch reached every server.
    assert result["epoch_to_every_server_s"] > 0, result
