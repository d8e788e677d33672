r"""The digits demo as a SageMaker training script, run by psrt-sagemaker.

The training is torch_digits.py's (keep the two files together in the code
directory). What SageMaker adds: the data comes from the channel "train"
(SM_CHANNEL_TRAIN) when there is one, as CSV files of rows "label,64 pixels
0-16" (scikit-learn's digits otherwise), and rank 0 saves the trained
model's state_dict as model.pth in SM_MODEL_DIR, which SageMaker uploads as
the model artifact. The estimator's hyperparameters arrive as arguments
(--epochs 12); with distribution={"parameter_server": {"enabled": True}} and
source_dir holding both scripts, SageMaker writes this hyperparameters.json,
and psrt-sagemaker runs the script under psrt-run on every host:

    {"epochs": "12", "psrt_distribution": "{\"compression\": \"fp16\"}",
     "sagemaker_program": "\"sagemaker_digits.py\"",
     "sagemaker_submit_directory": "\"s3://bucket/job/source/sourcedir.tar.gz\"",
     "sagemaker_parameter_server_enabled": "true", "sagemaker_region": "\"us-east-1\""}
"""

import argparse
import glob
import os
import sys

import numpy as np
import torch
from sklearn.datasets import load_digits

import psrt.torch as psrt
import torch_digits


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    torch_digits.add_arguments(p)
    p.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAIN"),
                   help="directory of CSV files (default: SM_CHANNEL_TRAIN, else scikit-learn's digits)")
    p.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR"),
                   help="where rank 0 saves model.pth (default: SM_MODEL_DIR)")
    return p.parse_args()


def read_channel(directory):
    """Labels and pixels from every CSV file in `directory`."""
    files = sorted(glob.glob(os.path.join(directory, "*.csv")))
    if not files:
        raise SystemExit("sagemaker_digits: no .csv files in the channel %s" % directory)
    rows = np.concatenate([np.loadtxt(f, delimiter=",", ndmin=2) for f in files])
    return rows[:, 1:], rows[:, 0].astype(np.int64)


def main():
    args = parse_args()
    psrt.init()  # psrt: join the job psrt-run started
    x, y = read_channel(args.train) if args.train else load_digits(return_X_y=True)
    if psrt.rank() == 0:
        print("sagemaker_digits: %d samples from %s" % (len(y), args.train or "scikit-learn"), flush=True)
    x_train, x_test, y_train, y_test = torch_digits.split(x, y)
    model = torch_digits.train(args, x_train, y_train)
    if psrt.rank() != 0:
        return 0
    # The weights live on the servers; state_dict() waits for the last ones.
    if args.model_dir:
        path = os.path.join(args.model_dir, "model.pth")
        torch.save(model.state_dict(), path)
        print("sagemaker_digits: saved %s" % path, flush=True)
    return torch_digits.evaluate(args, model, x_test, y_test)


if __name__ == "__main__":
    sys.exit(main())
