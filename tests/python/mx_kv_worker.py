"""KVStore "psrt" used directly (mx.kv.create), as MXNet's own API is used:
init, set_optimizer, push then pull, pushpull. Started by psrt-run with 2
workers; every rank checks the values it reads."""

import sys

import mxnet as mx

import psrt.mxnet  # noqa: F401


def main():
    kv = mx.kv.create("psrt")
    assert kv.type == "psrt" and kv.num_workers == 2, (kv.type, kv.num_workers)
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=1.0))
    value = mx.nd.ones((2, 3)) * (10 if kv.rank == 0 else 99)
    kv.init(3, value)
    assert (value.asnumpy() == 10).all(), value  # rank 0's value everywhere
    # Sync: the mean of the workers' gradients (1 and 2) is applied once.
    kv.push(3, mx.nd.ones((2, 3)) * (kv.rank + 1))
    out = mx.nd.zeros((2, 3))
    kv.pull(3, out=out)
    assert (out.asnumpy() == 10 - 1.5).all(), out
    kv.pushpull(3, mx.nd.ones((2, 3)) * 2, out=out)
    assert (out.asnumpy() == 10 - 1.5 - 2).all(), out
    try:
        kv.pushpull(3, mx.nd.ones((2, 3)))
        raise AssertionError("a pushpull without out was taken")
    except psrt.PsrtError as e:
        assert "update_on_kvstore=True" in str(e), e
    print("rank %d: kvstore checks passed" % kv.rank, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
