"""Where MXNet's Gluon Trainer and Module meet the "psrt" store: MXNet's
functions that make a kvstore, check a changed rescale_grad and set up
Module's optimizer, each wrapped once (the originals kept, so a reload does
not wrap twice)."""

import mxnet as mx
import mxnet.gluon.trainer
import mxnet.model
import mxnet.module.module

from psrt.mxnet import Psrt


def _create_kvstore(kvstore, num_device, arg_params):
    """MXNet's model._create_kvstore, but "psrt" given as a string is the
    store itself: MXNet drops a store whose name lacks "dist" when a process
    has one device."""
    if isinstance(kvstore, str) and kvstore.lower() == "psrt":
        kvstore = mx.kv.create(kvstore)
    return _mx_create_kvstore(kvstore, num_device, arg_params)


def _check_and_rescale_grad(trainer, scale):
    """Gluon refuses a new rescale_grad (batch size) once a dist store
    started: MXNet's servers hold a copy of the optimizer. psrt applies
    rescale_grad at each push, so it may change (and a sparse-weight model,
    whose first forward starts the store, may step(batch_size))."""
    if isinstance(trainer._kvstore, Psrt):
        trainer._optimizer.rescale_grad = scale
        return
    _mx_check_and_rescale_grad(trainer, scale)


_mx_check_and_rescale_grad = getattr(mxnet.gluon.Trainer._check_and_rescale_grad, "_psrt_original",
                                     mxnet.gluon.Trainer._check_and_rescale_grad)
_check_and_rescale_grad._psrt_original = _mx_check_and_rescale_grad
mxnet.gluon.Trainer._check_and_rescale_grad = _check_and_rescale_grad


def _module_init_optimizer(module, *args, **kwargs):
    """Module.init_optimizer divides the gradients by the global batch
    (batch size times workers) on a dist_sync store, whose servers sum.
    Servers that average (gradient_aggregation "mean", the default) would
    then take steps num_workers times too small: the optimizer's
    rescale_grad is multiplied back, so Module ends where MXNet's dist_sync
    does either way."""
    _mx_module_init_optimizer(module, *args, **kwargs)
    kv, opt = module._kvstore, module._optimizer
    if (isinstance(kv, Psrt) and kv._client.is_sync() and kv._client.averages()
            and not getattr(opt, "_psrt_rescaled", False)):
        opt.rescale_grad *= kv.num_workers
        opt._psrt_rescaled = True


_mx_module_init_optimizer = getattr(mxnet.module.Module.init_optimizer, "_psrt_original",
                                    mxnet.module.Module.init_optimizer)
_module_init_optimizer._psrt_original = _mx_module_init_optimizer
mxnet.module.Module.init_optimizer = _module_init_optimizer

_mx_create_kvstore = getattr(mxnet.model._create_kvstore, "_psrt_original",
                             mxnet.model._create_kvstore)
_create_kvstore._psrt_original = _mx_create_kvstore
for _module in (mxnet.model, mxnet.gluon.trainer, mxnet.module.module):
    _module._create_kvstore = _create_kvstore
