"""Rank 1 of an elastic sync job (min 1, max 2) joins while rank 0 is inside a
step: rank 0 has pushed step 0 of "weight" but not yet of "bias", so rank 1
pulls "weight" at version 1 and "bias" at version 0. Rank 0 pushes the rest
of its step once rank 1 has registered, then both make steps 1 and 2; rank 1
trains with psrt.torch.DistributedOptimizer throughout. Each rank prints the
versions and the weights it ends with. Usage: torch_join_mid_step.py DIR
(where the ranks leave their markers)."""

import os
import sys
import time

import numpy as np
import torch

import psrt
import psrt.torch
from psrt import _host
from psrt.torch.optimizer import _server_optimizer


def wait_for(path, what):
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit("rank %d: %s did not happen within 60 s (no %s)" % (psrt.rank(), what, path))
        time.sleep(0.02)


def main():
    markers = sys.argv[1]
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.ones(8, 4), torch.zeros(8, 1)
    if int(os.environ["PSRT_RANK"]) == 1:
        wait_for(os.path.join(markers, "half-step"), "rank 0's half step")
    psrt.init()
    client = psrt.client()
    if psrt.rank() == 0:
        # Rank 0 drives its steps by hand, to stop between two keys.
        host = _host.HostVariables(client, psrt.Compression.job_default)
        cfg = _server_optimizer(opt, opt.param_groups[0])
        params = dict(model.named_parameters())
        for name, p in params.items():
            host.register(name, p.detach().numpy(), cfg)
        grads = {name: np.ones(p.shape, np.float32) for name, p in params.items()}
        host.push_pull(["weight"], [grads["weight"]])
        open(os.path.join(markers, "half-step"), "w").close()
        wait_for(os.path.join(markers, "registered"), "rank 1's registration")
        host.push_pull(["bias"], [grads["bias"]])
        for _ in range(2):
            out = host.push_pull(["weight", "bias"], [grads["weight"], grads["bias"]])
        weights = [o.ravel() for o in out]
    else:
        # Rank 0 never averages gradients into .grad: neither does rank 1.
        opt = psrt.torch.DistributedOptimizer(opt, model.named_parameters(), mean_grads=False)
        print("rank 1: pulled weight at version %d, bias at version %d"
              % (client.pulled_version("weight"), client.pulled_version("bias")), flush=True)
        open(os.path.join(markers, "registered"), "w").close()
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        opt.synchronize()
        weights = [p.detach().numpy().ravel() for p in model.parameters()]
    print("rank %d: versions weight %d bias %d, weights %s"
          % (psrt.rank(), client.pulled_version("weight"), client.pulled_version("bias"),
             np.concatenate(weights).round(6).tolist()), flush=True)


if __name__ == "__main__":
    main()
