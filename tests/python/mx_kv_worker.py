"""KVStore "psrt" used directly (mx.kv.create), as MXNet's own API is used:
init, set_optimizer, push then pull, pushpull; a plain key-value store
without set_optimizer, set_optimizer after init, gradient compression and
the init values of row_sparse keys. Started by psrt-run with 2 workers;
every rank checks the values it reads."""

import sys
import time

import mxnet as mx
import numpy as np

import psrt
import psrt.mxnet  # noqa: F401


def refused(what, call, *args):
    try:
        call(*args)
    except psrt.PsrtError as e:
        return str(e)
    raise AssertionError("%s was taken" % what)


def optimizer_keys():
    kv = mx.kv.create("psrt")
    assert isinstance(kv, mx.kv.KVStore) and kv.type == "dist_sync_psrt" and kv.num_workers == 2, \
        (kv.type, kv.num_workers)
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
    # Without out, MXNet writes the result into the pushed value.
    grad = mx.nd.ones((2, 3))
    kv.pushpull(3, grad)
    assert (grad.asnumpy() == 10 - 1.5 - 2 - 1).all(), grad


def plain_store():
    """No set_optimizer: the servers keep what is pushed (sync: the mean);
    set_optimizer afterwards runs on the values the keys then hold."""
    kv = mx.kv.create("psrt")  # a second store: keys of its own
    kv.init("a", mx.nd.ones((4,)) * (5 if kv.rank == 0 else 7))
    out = mx.nd.zeros((4,))
    kv.pull("a", out=out)
    assert (out.asnumpy() == 5).all(), out
    kv.push("a", mx.nd.ones((4,)) * (kv.rank + 1))
    kv.pull("a", out=out)
    assert (out.asnumpy() == 1.5).all(), out
    summed = mx.nd.ones((4,)) * (kv.rank + 3)
    kv.pushpull("a", summed)
    assert (summed.asnumpy() == 3.5).all(), summed
    kv.init("b", mx.nd.ones((4,)) * 2)  # first used after set_optimizer
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.5))
    kv.push("a", mx.nd.ones((4,)) * (2 * kv.rank + 1))
    kv.pull("a", out=out)
    assert np.allclose(out.asnumpy(), 3.5 - 0.5 * 2), out
    kv.pushpull("b", mx.nd.ones((4,)) * (kv.rank + 1), out=out)
    assert np.allclose(out.asnumpy(), 2 - 0.5 * 1.5), out
    # A key never initialised: MXNet's own error type, as its kvstore raises.
    try:
        kv.pull("never", out=out)
        raise AssertionError("a pull of a key never initialised was taken")
    except mx.MXNetError as e:
        assert isinstance(e, psrt.PsrtError) and "key never was never initialised" in str(e), e


def compression():
    kv = mx.kv.create("psrt")
    msg = refused("1-bit compression", kv.set_gradient_compression, {"type": "1bit"})
    assert "'1bit' is not supported" in msg and "fp16" in msg, msg
    kv.set_gradient_compression({"type": "fp16"})
    kv.init("h", mx.nd.ones((8,)) * 0.1)
    out = mx.nd.zeros((8,))
    kv.pushpull("h", mx.nd.ones((8,)) / 3, out=out)
    got = out.asnumpy()
    # Pulled as fp16: 1/3 arrives as the nearest half-precision value.
    assert np.allclose(got, 1 / 3, atol=1e-3) and (got == got.astype(np.float16)).all(), got
    msg = refused("compression after init", kv.set_gradient_compression, {"type": "fp16"})
    assert "before the first key" in msg, msg


def two_bit():
    """MXNet's 2-bit quantization: t, 0 or -t per value, the rest carried."""
    kv = mx.kv.create("psrt")
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    kv.init("q", mx.nd.zeros((4,)))
    grad = mx.nd.array([0.3, 0.6, -0.7, 0.1 + 0.2 * kv.rank])
    out = mx.nd.zeros((4,))
    kv.pushpull("q", grad, out=out)  # a plain key: the workers' mean of what they sent
    assert (out.asnumpy() == [0, 0.5, -0.5, 0]).all(), out
    kv.pushpull("q", grad, out=out)  # residuals 0.3, 0.1, -0.2, 0.1|0.3 plus the gradient
    assert (out.asnumpy() == [0.5, 0.5, -0.5, 0.25]).all(), out


def table_init():
    kv = mx.kv.create("psrt")
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=1.0))
    # A table starts as rank 0's init value: zeros, or rows 0 and 2 of rank 0
    # (rank 1's differ) and zeros for the rows the value lacks.
    kv.init("zeros", mx.nd.sparse.zeros("row_sparse", (6, 2)))
    full = mx.nd.ones((6, 2))
    kv.pull("zeros", out=full)
    assert (full.asnumpy() == 0).all(), full
    kv.init("rows", mx.nd.sparse.row_sparse_array((np.full((2, 2), kv.rank + 5.0, np.float32), [0, 2]),
                                                  shape=(4, 2)))
    full = mx.nd.ones((4, 2))
    kv.pull("rows", out=full)
    assert np.array_equal(full.asnumpy(), [[5, 5], [0, 0], [5, 5], [0, 0]]), full


def barrier():
    """kv._barrier() waits for every worker (rank 1 comes 2 s late; the
    ranks leave the first barrier at nearly the same time)."""
    kv = mx.kv.create("psrt")
    kv._barrier()
    if kv.rank == 1:
        time.sleep(2.0)
    start = time.monotonic()
    kv._barrier()
    waited = time.monotonic() - start
    assert kv.rank == 1 or waited > 1.0, waited


@mx.optimizer.register
class AddGradient(mx.optimizer.Optimizer):
    """An optimizer of the user's own, as MXNet's distributed tests set one
    on their store: weight += rescale_grad * grad."""

    def create_state(self, index, weight):
        return None

    def update(self, index, weight, grad, state):
        weight[:] += grad * self.rescale_grad


def workers_optimizer():
    """set_optimizer with optimizers the servers do not have (the user's
    own, RMSProp): the servers aggregate and every worker's updater steps on
    the aggregate, from rank 0's initial value, as one store would."""
    kv = mx.kv.create("psrt")
    kv.set_optimizer(mx.optimizer.create("addgradient", rescale_grad=2.0))
    kv.init(7, mx.nd.ones((3,)) * (1 if kv.rank == 0 else 50))
    out = mx.nd.zeros((3,))
    for step in range(2):
        kv.push(7, mx.nd.ones((3,)) * (kv.rank + 1))  # the mean, 1.5, times 2
        kv.pull(7, out=out)
        assert np.allclose(out.asnumpy(), 1 + 3.0 * (step + 1)), (step, out)
    rmsprop = mx.optimizer.RMSProp(learning_rate=0.1, gamma1=0.9)
    kv.set_optimizer(rmsprop)
    kv.init(8, mx.nd.ones((3,)) * 2)
    want, updater = mx.nd.ones((3,)) * 2, mx.optimizer.get_updater(mx.optimizer.RMSProp(learning_rate=0.1, gamma1=0.9))
    for step in range(3):
        grad = mx.nd.array([1.0, -2.0, 0.5]) * (kv.rank + 1) * (step + 1)
        kv.pushpull(8, grad, out=out)
        updater(8, mx.nd.array([1.0, -2.0, 0.5]) * 1.5 * (step + 1), want)
        assert np.allclose(out.asnumpy(), want.asnumpy(), atol=1e-6), (step, out, want)


CHECKS = {"optimizer_keys": optimizer_keys, "plain_store": plain_store, "compression": compression,
          "two_bit": two_bit, "table_init": table_init, "barrier": barrier, "workers_optimizer": workers_optimizer}


def main():
    """Runs the checks named as arguments (default: every one), each on a
    store of its own, and says which passed."""
    psrt.init()
    rank = psrt.rank()
    for name in sys.argv[1:] or CHECKS:
        check = CHECKS[name]
        try:
            check()
            print("rank %d: %s passed" % (rank, name), flush=True)
        except Exception as e:  # noqa: BLE001 (each check reports on its own)
            print("rank %d: %s FAILED: %s: %s" % (rank, name, type(e).__name__, e), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
