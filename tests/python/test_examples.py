"""Every example in examples/ trains a few steps in a real job (psrt-run, 2
workers and 2 servers over loopback), so that none rots. Sizes are cut down
with the examples' own flags; `make demo DEMO=NAME` runs them at full size.

The MXNet example runs under .venv-mxnet's interpreter (its own ctest
entry), the others under .venv's.
"""

import math
import os
import re
import subprocess
import sys

import pytest

from jobs import EXAMPLES, job_command

# Script, the flags that make it small, its first output line's start.
CASES = {
    "torch_resnet18": (["--steps", "3", "--batch", "8", "--log-every", "1"], "example: ResNet-18"),
    "torch_gpt2": (["--steps", "3", "--layers", "2", "--width", "64", "--heads", "2", "--vocab", "1000",
                    "--seq", "32", "--log-every", "1"], "example: GPT-2"),
    "torch_bert_finetune": (["--steps", "3", "--layers", "2", "--width", "64", "--heads", "2", "--vocab", "2000",
                             "--seq", "32", "--log-every", "1"], "example: BERT fine-tuning"),
    "torch_dlrm": (["--steps", "3", "--batch", "64", "--rows", "1000", "--log-every", "1"], "example: DLRM"),
    "keras_resnet": (["--epochs", "1", "--steps", "2", "--batch", "4"], "example: keras.applications.ResNet50"),
    "gluon_resnet": (["--steps", "2", "--batch", "4", "--log-every", "1"], "example: Gluon resnet18_v1"),
}


def needs(module):
    try:
        __import__(module)
        return False
    except ImportError:
        return True


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_trains(name):
    framework = name.split("_")[0]
    module = {"torch": "torch", "keras": "tensorflow", "gluon": "mxnet"}[framework]
    if needs(module):
        pytest.skip("%s is not installed in this interpreter (%s): its own ctest entry runs it" %
                    (module, sys.executable))
    args, first = CASES[name]
    p = subprocess.run(job_command(os.path.join(EXAMPLES, name + ".py"), args), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=280)
    assert p.returncode == 0, p.stdout
    assert first in p.stdout, p.stdout
    done = re.search(r"example: done: loss (\S+) -> (\S+)", p.stdout)
    assert done and all(math.isfinite(float(v)) for v in done.groups()), p.stdout
    assert re.search(r"samples/s [0-9]+|tokens/s [0-9]+", p.stdout), p.stdout
    assert "psrt-run N summary:" in p.stdout, p.stdout
