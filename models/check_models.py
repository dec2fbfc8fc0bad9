#!/usr/bin/env python3
"""Sanity-check directories written by make_model.py.

  .venv/bin/python models/check_models.py DIR [DIR ...]

For each DIR: onnx.checker, lists the op types, and evaluates model.onnx with a
tiny NumPy interpreter (independent of torch's exporter) on the first batch of
DIR/data at two batch sizes; the batch-B result must equal step 0 of
reference_sgd.json. This proves the exported graph, the initializers and the
data agree with the reference losses before any C++ is involved.
Exit 1 on any mismatch.
"""

import json
import math
import os
import sys

import numpy as np
import onnx
from onnx import numpy_helper

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _sce_loss(logits, labels, ignore_index=None, reduction="mean"):
    # SoftmaxCrossEntropyLoss for [N, C] logits, [N] labels (what the zoo exports).
    logp = np.log(_softmax(logits.astype(np.float64), 1))
    keep = np.ones(labels.shape, bool) if ignore_index is None else labels != ignore_index
    picked = -logp[np.arange(len(labels)), np.where(keep, labels, 0)] * keep
    if reduction == "mean":
        return np.float32(picked.sum() / keep.sum())
    if reduction == "sum":
        return np.float32(picked.sum())
    return picked.astype(np.float32)


def _layer_norm(x, w, b, axis=-1, epsilon=1e-5):
    axes = tuple(range(axis % x.ndim, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    return ((x - mu) / np.sqrt(var + epsilon) * w + b).astype(x.dtype)


def _gemm(a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):
    y = alpha * (a.T if transA else a) @ (b.T if transB else b)
    return (y + beta * c if c is not None else y).astype(a.dtype)


def _unsqueeze(x, axes):
    for ax in sorted(int(a) % (x.ndim + len(axes)) for a in axes):
        x = np.expand_dims(x, ax)
    return x


def _reshape(x, shape, allowzero=0):
    shape = [x.shape[i] if (s == 0 and not allowzero) else int(s) for i, s in enumerate(shape)]
    return x.reshape(shape)


OPS = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Div": lambda a, b: a / b,
    "Pow": lambda a, b: np.power(a, b).astype(a.dtype),
    "Sqrt": np.sqrt,
    "Relu": lambda x: np.maximum(x, 0).astype(x.dtype),
    "Erf": lambda x: _erf(x).astype(x.dtype),
    "MatMul": np.matmul,
    "Gemm": _gemm,
    "Transpose": lambda x, perm=None: np.transpose(x, perm),
    "Shape": lambda x: np.array(x.shape, np.int64),
    "Gather": lambda x, i, axis=0: np.take(x, i, axis=axis),
    "Unsqueeze": lambda x, axes: _unsqueeze(x, axes),
    "Concat": lambda *xs, axis: np.concatenate(xs, axis=axis),
    "Reshape": _reshape,
    "Cast": lambda x, to: x.astype(onnx.mapping.TENSOR_TYPE_TO_NP_TYPE[to]),
    "Range": lambda s, l, d: np.arange(s, l, d, dtype=s.dtype),
    "Greater": np.greater,
    "Where": np.where,
    "ReduceMean": lambda x, axes=None, keepdims=1: x.mean(
        axis=None if axes is None else tuple(axes), keepdims=bool(keepdims)).astype(x.dtype),
    "Softmax": lambda x, axis=-1: _softmax(x, axis).astype(x.dtype),
    "LayerNormalization": _layer_norm,
    "SoftmaxCrossEntropyLoss": _sce_loss,
}


def evaluate(model, feeds):
    env = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    env.update(feeds)
    for n in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
        if n.op_type == "Constant":
            env[n.output[0]] = numpy_helper.to_array(attrs["value"])
            continue
        if n.op_type not in OPS:
            raise NotImplementedError(f"node {n.name}: op {n.op_type} not in the checker")
        out = OPS[n.op_type](*[env[i] for i in n.input if i], **attrs)
        env[n.output[0]] = np.asarray(out)
    return env[model.graph.output[0].name]


def check_dir(d):
    m = onnx.load(os.path.join(d, "model.onnx"))
    onnx.checker.check_model(m)
    ops = sorted({n.op_type for n in m.graph.node})
    ref = json.load(open(os.path.join(d, "reference_sgd.json")))
    adam = json.load(open(os.path.join(d, "reference_adam.json")))
    names = [i.name for i in m.graph.input]
    data = {nm: np.load(os.path.join(d, "data", nm + ".npy")) for nm in names}
    bsz = ref["batch_size"]
    got = float(evaluate(m, {nm: data[nm][:bsz] for nm in names}))
    want = ref["losses"][0]
    ok = abs(got - want) <= 1e-5 * max(1.0, abs(want))
    # A different batch size must also run: the batch axis is symbolic.
    evaluate(m, {nm: data[nm][:3] for nm in names})
    print(f"{d}: opset {m.opset_import[0].version} nodes {len(m.graph.node)} "
          f"inputs {[(nm, str(data[nm].dtype), list(data[nm].shape)) for nm in names]}")
    print(f"  ops {ops}")
    print(f"  numpy-onnx loss {got:.6f} vs torch {want:.6f} -> {'OK' if ok else 'MISMATCH'}")
    print(f"  sgd  {[round(x, 4) for x in ref['losses']]}")
    print(f"  adam {[round(x, 4) for x in adam['losses']]}")
    return ok, set(ops)


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: check_models.py DIR [DIR ...]")
    all_ok, union = True, set()
    for d in sys.argv[1:]:
        ok, ops = check_dir(d)
        all_ok &= ok
        union |= ops
    print(f"union of ops: {sorted(union)}")
    sys.exit(0 if all_ok else 1)


if __name__ == "__main__":
    main()
