"""NDArrays to and from the host buffers the C API takes: dense copies,
row-sparse gradients as (ids, rows) pieces, writes into every device's
array."""

import mxnet as mx
import numpy as np

import psrt


def _is_sparse(value):
    return getattr(value, "stype", "default") == "row_sparse"


def _row_pieces(key, value, scale):
    """(ids, rows) host copies of row_sparse gradient(s), times `scale`."""
    pieces = []
    for v in _outputs(value):
        if not _is_sparse(v):
            raise psrt.PsrtError("psrt kvstore: key %s is a table: push a row_sparse gradient "
                                 "(got a %s NDArray)"
                                 % (key, getattr(v, "stype", type(v).__name__)))
        rows = v.data.asnumpy().astype(np.float32, copy=False)
        if scale != 1.0:
            rows = rows * np.float32(scale)
        pieces.append((v.indices.asnumpy().astype(np.int64), rows))
    return pieces


def _write_rows(dst, ids, rows):
    """Rows of `ids` into `dst`: a row_sparse NDArray holds exactly them, a
    dense one has them overwritten. Gluon pulls inside autograd.record()
    (the forward pass); the copy is no part of the graph, as MXNet's own
    kvstore's is not."""
    with mx.autograd.pause():
        if _is_sparse(dst):
            mx.nd.sparse.row_sparse_array((rows, ids), shape=dst.shape, ctx=dst.context,
                                          dtype=dst.dtype).copyto(dst)
        else:
            full = dst.asnumpy()
            full[ids] = rows
            _assign(dst, full)


def _dense(value):
    return value.tostype("default") if _is_sparse(value) else value


def _nonzero_rows(value):
    """(ids, rows) of a row_sparse value's rows that are not all zeros (the
    rows a table starting at zeros needs to be sent)."""
    ids, rows = value.indices.asnumpy(), value.data.asnumpy()
    keep = np.any(rows != 0, axis=1)
    return ids[keep], rows[keep]


def _first(value):
    """MXNet passes one NDArray or a list (one per device); psrt keeps one."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise psrt.PsrtError("psrt kvstore: an empty list of arrays")
        if len(value) == 1:  # one device: the callers copy to the host
            return _dense(value[0])
        # Gradients of several devices are summed, as MXNet's local kvstore does.
        total = _dense(value[0]).copyto(mx.cpu())
        for v in value[1:]:
            total += _dense(v).as_in_context(mx.cpu())
        return total
    return _dense(value)


def _scaled(value, scale):
    """A host copy of the gradient(s) in `value`, times `scale`."""
    # asnumpy() returns a fresh array: a float32 one needs no second copy.
    grad = np.asarray(_first(value).asnumpy(), dtype=np.float32)
    if scale != 1.0:
        np.multiply(grad, scale, out=grad)
    return grad


def _outputs(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _assign(dst, value):
    """A host array into an NDArray; through an NDArray copy, which (unlike
    a numpy assignment) also takes arrays in MKL-DNN's layout (convolution
    weights after a forward pass)."""
    staged = mx.nd.empty(dst.shape, ctx=dst.context, dtype=dst.dtype)
    staged._sync_copyfrom(np.ascontiguousarray(value, dtype=dst.dtype).reshape(dst.shape))
    staged.copyto(dst)


def _write(out, value):
    for dst in _outputs(out):
        _assign(dst, value)
