"""MXNet optimizers as psrt's servers run them: the settings of a dense
key's and of a table's optimizer, or a refusal saying why not."""

import mxnet as mx

import psrt


def _server_optimizer(opt):
    """Server-side settings equivalent to an MXNet optimizer (its
    clip_gradient is applied by the plugin), or a refusal."""
    lr, wd = float(opt.learning_rate), float(opt.wd)
    if isinstance(opt, mx.optimizer.NAG):
        return {"name": "sgd", "lr": lr, "momentum": float(opt.momentum), "nesterov": True,
                "weight_decay": wd}
    if isinstance(opt, mx.optimizer.SGD):
        return {"name": "sgd", "lr": lr, "momentum": float(opt.momentum), "weight_decay": wd}
    if isinstance(opt, mx.optimizer.Adam):
        return {"name": "adam", "lr": lr, "beta1": float(opt.beta1), "beta2": float(opt.beta2),
                "eps": float(opt.epsilon), "weight_decay": wd}
    if isinstance(opt, mx.optimizer.AdaGrad):
        return {"name": "adagrad", "lr": lr, "eps": float(opt.float_stable_eps),
                "weight_decay": wd}
    raise psrt.PsrtError("psrt kvstore: %s cannot run on the parameter servers; use sgd, nag, adam "
                         "or adagrad" % type(opt).__name__)


def _table_optimizer(opt):
    """The row-wise form of an MXNet optimizer for a table, or a refusal."""
    if opt.clip_gradient is not None:
        raise psrt.PsrtError("psrt kvstore: clip_gradient is not supported for tables (row_sparse "
                             "weights): the servers update their rows from the aggregated "
                             "gradient; set clip_gradient=None")
    lr, wd = float(opt.learning_rate), float(opt.wd)
    if isinstance(opt, mx.optimizer.Ftrl):
        # MXNet's denominator (beta + sqrt(n)) / lr + wd is the servers' (TF's)
        # sqrt(n) / lr + 2 * (l2 + beta / (2 * lr)) with l2 = wd / 2.
        return {"name": "ftrl", "lr": lr, "l1": float(opt.lamda1), "l2": wd / 2,
                "ftrl_beta": float(opt.beta), "initial_accumulator_value": 0.0}
    if wd:
        raise psrt.PsrtError("psrt kvstore: weight decay (wd=%g) is not supported for tables: the "
                             "servers' row-wise optimizers have none (ftrl takes wd as its l2); "
                             "use wd=0" % wd)
    plain_sgd = (isinstance(opt, mx.optimizer.SGD) and not isinstance(opt, mx.optimizer.NAG)
                 and not opt.momentum)
    if plain_sgd:
        return {"name": "sgd", "lr": lr}
    if isinstance(opt, mx.optimizer.Adam) and opt.lazy_update:
        return {"name": "adam", "lr": lr, "beta1": float(opt.beta1), "beta2": float(opt.beta2),
                "eps": float(opt.epsilon)}
    if isinstance(opt, mx.optimizer.AdaGrad):
        # MXNet divides by sqrt(history + eps) with history from 0; the
        # servers add eps after the root, so eps becomes the history's start.
        return {"name": "adagrad", "lr": lr,
                "initial_accumulator_value": float(opt.float_stable_eps), "eps": 0.0}
    lazy = "(lazy_update=False)" if isinstance(opt, mx.optimizer.Adam) else ""
    raise psrt.PsrtError("psrt kvstore: %s%s is not row-wise, so it cannot update a table; use sgd "
                         "without momentum, adam with lazy_update=True, adagrad or ftrl"
                         % (type(opt).__name__, lazy))


def _check_rows_of_dense(key, opt):
    """A row_sparse gradient of a dense weight (Embedding(sparse_grad=True)):
    the servers update every row, as MXNet's optimizers do with
    lazy_update=False; refuse where MXNet's lazy update (only the gradient's
    rows) would give other weights."""
    if opt is None or isinstance(opt, mx.optimizer.NAG):  # MXNet's NAG updates every row
        return
    wd = float(opt.wd)
    plain_sgd = (isinstance(opt, mx.optimizer.SGD) and not isinstance(opt, mx.optimizer.NAG)
                 and not opt.momentum)
    row_local = (plain_sgd or isinstance(opt, mx.optimizer.AdaGrad)) and not wd
    if row_local or not getattr(opt, "lazy_update", isinstance(opt, mx.optimizer.AdaGrad)):
        return
    raise psrt.PsrtError("psrt kvstore: key %s has a dense weight and row_sparse gradients: "
                         "MXNet's %s with lazy_update=True changes only the gradient's rows, the "
                         "servers update every row. Create the optimizer with lazy_update=False "
                         "(the servers' update), or use sgd without momentum or wd"
                         % (key, type(opt).__name__))


def _scales_gradient(config):
    """SGD with momentum (not Nesterov's): a changed rate scales the pushed
    gradient instead of the servers' rate (_learning_rates.py)."""
    return (config["name"] == "sgd" and config.get("momentum", 0.0) > 0
            and not config.get("nesterov"))


def _without_lr(config):
    # The learning rate reaches registered keys by itself (set_learning_rate).
    return {k: v for k, v in config.items() if k != "lr"}
