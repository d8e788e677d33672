"""Where MXNet's Gluon Trainer and Module meet the "psrt" store: MXNet's
functions that make a Trainer and a kvstore, end a Trainer's reduction,
check a changed rescale_grad and set up Module's optimizer, each wrapped once (the originals kept, so a
reload does not wrap twice)."""

import mxnet as mx
import mxnet.gluon.trainer
import mxnet.model
import mxnet.module.module

import psrt
from psrt.mxnet import Psrt


def _is_psrt(kvstore):
    return isinstance(kvstore, Psrt) or (isinstance(kvstore, str) and kvstore.lower() == "psrt")


def _trainer_init(trainer, *args, **kwargs):
    """Gluon's Trainer, whose store then starts at once where the model's
    parameters are initialised: Gluon starts it in the first step(), after
    that step's forward and backward ran on the worker's own weights, so a
    restored job's first gradient (and, with workers drawing other initial
    weights, every job's) would not be taken at the job's weights. A
    restored job whose parameters wait for their shapes (deferred
    initialisation) is refused, saying so."""
    _mx_trainer_init(trainer, *args, **kwargs)
    if not _is_psrt(trainer._kvstore_params["kvstore"]):
        return
    params = trainer._params
    if any(p._deferred_init for p in params) or any(p._data is None for p in params):
        if psrt.init().restored_step() > 0:
            waiting = [p.name for p in params if p._deferred_init or p._data is None]
            raise psrt.PsrtError(
                "psrt kvstore: a restored job's Trainer needs initialised parameters, so that the first "
                "step runs on the restored weights; %s wait for their shapes (deferred initialisation): "
                "give the layers their input sizes (in_units, in_channels) or run the model once before "
                "making the Trainer" % ", ".join(waiting[:4]))
        return
    trainer._init_kvstore()
    trainer._init_params()


def _create_kvstore(kvstore, num_device, arg_params):
    """MXNet's model._create_kvstore, but "psrt" given as a string is the
    store itself: MXNet drops a store whose name lacks "dist" when a process
    has one device."""
    if _is_psrt(kvstore) and isinstance(kvstore, str):
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


def _allreduce_grads(trainer):
    """Gluon's Trainer pushpulls every parameter: the store's step ends."""
    _mx_allreduce_grads(trainer)
    if isinstance(trainer._kvstore, Psrt):
        trainer._kvstore._end_step()


_mx_allreduce_grads = getattr(mxnet.gluon.Trainer._allreduce_grads, "_psrt_original",
                              mxnet.gluon.Trainer._allreduce_grads)
_allreduce_grads._psrt_original = _mx_allreduce_grads
mxnet.gluon.Trainer._allreduce_grads = _allreduce_grads

_mx_trainer_init = getattr(mxnet.gluon.Trainer.__init__, "_psrt_original", mxnet.gluon.Trainer.__init__)
_trainer_init._psrt_original = _mx_trainer_init
mxnet.gluon.Trainer.__init__ = _trainer_init

_mx_create_kvstore = getattr(mxnet.model._create_kvstore, "_psrt_original",
                             mxnet.model._create_kvstore)
_create_kvstore._psrt_original = _mx_create_kvstore
for _module in (mxnet.model, mxnet.gluon.trainer, mxnet.module.module):
    _module._create_kvstore = _create_kvstore
