#!/usr/bin/env python3
"""Write a weightless ONNX training graph of an enlarged model, in seconds.

RaNNC's evaluation plans BERT and ResNet far larger than any machine here can
hold (up to ~100 billion parameters). Planning needs only the graph and the
shapes, so this script builds the graph directly with onnx.helper and never
materializes a weight: every initializer carries its dims and dtype, and
either points to an external data file that does not exist (--weights
external, the default) or holds no data at all (--weights none). rannc-plan
plans such a file like any other; rannc-exec trains it only with
--init-weights SEED (Note [weightless models], docs/weightless-models.md).

Usage:
  .venv/bin/python models/make_large.py bert -o OUT.onnx
      [--layers 24] [--hidden 1024] [--heads 16] [--ffn 4*hidden]
      [--seq-len 512] [--vocab 30522] [--weights external|none]
  .venv/bin/python models/make_large.py gpt -o OUT.onnx
      [--megatron 1.7b|3.6b|...|1008b | --layers L --hidden H --heads A]
      [--seq-len 2048] [--vocab 51200] [--dropout 0.1] [--untied]
  .venv/bin/python models/make_large.py resnet -o OUT.onnx
      [--depth 50] [--width 1] [--image-size 224] [--classes 1000]

BERT (post-LN encoder, masked-LM loss over every position) has inputs
input_ids and labels [batch, seq-len]; GPT (Megatron-LM's pre-LN causal
decoder, output layer tied to the word embedding; --megatron NAME takes the
shape of a row of Megatron-LM's weak-scaling table, MEGATRON_ROWS) the same
inputs, with sequence 2,048 and vocabulary 51,200 unless told; ResNet (torchvision's layout,
BatchNorm in training mode) has x [batch, 3, S, S] and y [batch]. The batch
dimension is symbolic. A summary line {"params": ..., "buffers": ..., ...}
goes to stdout as JSON. Needs only the onnx package (no torch).
"""

import argparse
import json
import math
import os
import sys

try:
    import onnx
    from onnx import TensorProto, helper
except ImportError as e:
    sys.exit(f"make_large.py: error: {e}; run it with .venv/bin/python (tools/setup.sh makes it)")

OPSET = 17


class Builder:
    """Accumulates nodes and initializers; initializers never hold data."""

    def __init__(self, weights, data_file):
        self.nodes, self.inits = [], []
        self.weights, self.data_file = weights, data_file
        self.params = self.buffer_elems = 0
        self.offset = 0  # byte offset in the (absent) external data file
        self._n = 0

    def name(self, hint):
        self._n += 1
        return f"{hint}_{self._n}"

    def init(self, name, dims, buffer=False):
        """A float32 initializer with dims only, or pointing to absent external data."""
        t = onnx.TensorProto()
        t.name = name
        t.data_type = TensorProto.FLOAT
        t.dims.extend(dims)
        numel = math.prod(dims)
        if self.weights == "external":
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", self.data_file), ("offset", str(self.offset)), ("length", str(4 * numel))):
                e = t.external_data.add()
                e.key, e.value = k, v
            self.offset += 4 * numel
        self.inits.append(t)
        if buffer:
            self.buffer_elems += numel
        else:
            self.params += numel
        return name

    def const(self, values, dtype=TensorProto.INT64, dims=None):
        """A Constant node (recomputed by every stage, never a parameter)."""
        out = self.name("const")
        dims = [len(values)] if dims is None else dims
        self.nodes.append(helper.make_node("Constant", [], [out],
                                           value=helper.make_tensor(out + "_value", dtype, dims, values)))
        return out

    def op(self, op_type, inputs, n_out=1, **attrs):
        outs = [self.name(op_type) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=outs[0] + "_node", **attrs))
        return outs[0] if n_out == 1 else outs


# --------------------------------------------------------------------------- BERT

def bert(b, a):
    H, A, S, V, L = a.hidden, a.heads, a.seq_len, a.vocab, a.layers
    F = a.ffn or 4 * H
    D = H // A
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", S]),
              helper.make_tensor_value_info("labels", TensorProto.INT64, ["batch", S])]

    def linear(x, prefix, n_in, n_out):
        w = b.init(prefix + ".weight", [n_in, n_out])
        return b.op("Add", [b.op("MatMul", [x, w]), b.init(prefix + ".bias", [n_out])])

    def layer_norm(x, prefix):
        return b.op("LayerNormalization", [x, b.init(prefix + ".weight", [H]), b.init(prefix + ".bias", [H])],
                    axis=-1, epsilon=1e-12)

    x = b.op("Gather", [b.init("embeddings.word_embeddings.weight", [V, H]), "input_ids"])
    x = b.op("Add", [x, b.init("embeddings.position_embeddings.weight", [S, H])])
    x = layer_norm(x, "embeddings.LayerNorm")
    heads_shape = b.const([0, S, A, D])
    merged_shape = b.const([0, S, H])
    scale = b.const([1.0 / math.sqrt(D)], TensorProto.FLOAT, [])
    half, one = b.const([0.5], TensorProto.FLOAT, []), b.const([1.0], TensorProto.FLOAT, [])
    sqrt2 = b.const([math.sqrt(2.0)], TensorProto.FLOAT, [])
    for i in range(L):
        p = f"encoder.layer.{i}"
        q, k, v = (b.op("Reshape", [linear(x, f"{p}.attention.self.{n}", H, H), heads_shape])
                   for n in ("query", "key", "value"))
        q = b.op("Transpose", [q], perm=[0, 2, 1, 3])
        k = b.op("Transpose", [k], perm=[0, 2, 3, 1])
        v = b.op("Transpose", [v], perm=[0, 2, 1, 3])
        probs = b.op("Softmax", [b.op("Mul", [b.op("MatMul", [q, k]), scale])], axis=-1)
        ctx = b.op("Transpose", [b.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        ctx = b.op("Reshape", [ctx, merged_shape])
        x = layer_norm(b.op("Add", [x, linear(ctx, f"{p}.attention.output.dense", H, H)]),
                       f"{p}.attention.output.LayerNorm")
        h = linear(x, f"{p}.intermediate.dense", H, F)
        gelu = b.op("Mul", [b.op("Mul", [h, half]), b.op("Add", [b.op("Erf", [b.op("Div", [h, sqrt2])]), one])])
        x = layer_norm(b.op("Add", [x, linear(gelu, f"{p}.output.dense", F, H)]), f"{p}.output.LayerNorm")
    logits = b.op("Reshape", [linear(x, "cls.predictions.decoder", H, V), b.const([-1, V])])
    labels = b.op("Reshape", ["labels", b.const([-1])])
    b.nodes.append(helper.make_node("SoftmaxCrossEntropyLoss", [logits, labels], ["loss"], name="loss_node",
                                    reduction="mean"))
    return inputs


# --------------------------------------------------------------------------- GPT

# Note [Megatron's table]
# Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
# Clusters Using Megatron-LM" (SC'21, arXiv 2104.04473), Table 1: GPT models
# of sequence 2,048 and vocabulary 51,200 on A100-80GB GPUs (Selene), mixed
# precision, activation recomputation. Per row: attention heads, hidden size,
# layers, tensor- and pipeline-parallel size, GPUs, global batch, and the
# achieved teraFLOP/s per GPU (data-parallel size = GPUs / (TP x PP)). The
# step time the table implies is derived from these by
# tools/bench/megatron_table.py (megatronStep), never written down here.
MEGATRON_ROWS = {
    #          heads  hidden layers TP  PP  GPUs  batch  TF/s per GPU
    "1.7b":   (24,    2304,  24,    1,  1,  32,   512,   137),
    "3.6b":   (32,    3072,  30,    2,  1,  64,   512,   138),
    "7.5b":   (32,    4096,  36,    4,  1,  128,  512,   142),
    "18.4b":  (48,    6144,  40,    8,  1,  256,  1024,  135),
    "39.1b":  (64,    8192,  48,    8,  2,  512,  1536,  138),
    "76.1b":  (80,    10240, 60,    8,  4,  1024, 1792,  140),
    "145.6b": (96,    12288, 80,    8,  8,  1536, 2304,  148),
    "310.1b": (128,   16384, 96,    8,  16, 1920, 2160,  155),
    "529.6b": (128,   20480, 105,   8,  35, 2520, 2520,  163),
    "1008b":  (160,   25600, 128,   8,  64, 3072, 3072,  163),
}


def gpt(b, a):
    """Megatron-LM's GPT: learned positions, pre-LN layers (attention with a
    causal mask and dropout on the probabilities; a GeLU MLP of 4 x hidden),
    a final LayerNorm and logits against the word embedding (tied unless
    --untied), cross-entropy over every position (labels come pre-shifted)."""
    H, A, S, V, L = a.hidden, a.heads, a.seq_len, a.vocab, a.layers
    F = a.ffn or 4 * H
    D = H // A
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", S]),
              helper.make_tensor_value_info("labels", TensorProto.INT64, ["batch", S])]
    ratio = b.const([a.dropout], TensorProto.FLOAT, [])
    training = b.const([True], TensorProto.BOOL, [])

    def dropout(x):
        return b.op("Dropout", [x, ratio, training], n_out=2)[0] if a.dropout > 0 else x

    def linear(x, prefix, n_in, n_out):
        w = b.init(prefix + ".weight", [n_in, n_out])
        return b.op("Add", [b.op("MatMul", [x, w]), b.init(prefix + ".bias", [n_out])])

    def layer_norm(x, prefix):
        return b.op("LayerNormalization", [x, b.init(prefix + ".weight", [H]), b.init(prefix + ".bias", [H])],
                    axis=-1, epsilon=1e-5)

    wte = b.init("embedding.word_embeddings.weight", [V, H])
    x = b.op("Gather", [wte, "input_ids"])
    x = dropout(b.op("Add", [x, b.init("embedding.position_embeddings.weight", [S, H])]))
    heads_shape = b.const([0, S, A, D])
    merged_shape = b.const([0, S, H])
    scale = b.const([1.0 / math.sqrt(D)], TensorProto.FLOAT, [])
    # The causal mask as an additive bias: -10000 above the diagonal (Megatron's
    # fill value, which fp16 holds), 0 elsewhere; no batch axis, made once per pass.
    future = b.op("Trilu", [b.op("ConstantOfShape", [b.const([S, S])],
                                 value=helper.make_tensor("fill", TensorProto.FLOAT, [1], [-10000.0])),
                            b.const([1], dims=[])], upper=1)
    half, one = b.const([0.5], TensorProto.FLOAT, []), b.const([1.0], TensorProto.FLOAT, [])
    sqrt2 = b.const([math.sqrt(2.0)], TensorProto.FLOAT, [])
    for i in range(L):
        p = f"layers.{i}"
        h = layer_norm(x, f"{p}.input_layernorm")
        q, k, v = (b.op("Reshape", [linear(h, f"{p}.attention.{n}", H, H), heads_shape])
                   for n in ("query", "key", "value"))
        q = b.op("Transpose", [q], perm=[0, 2, 1, 3])
        k = b.op("Transpose", [k], perm=[0, 2, 3, 1])
        v = b.op("Transpose", [v], perm=[0, 2, 1, 3])
        scores = b.op("Add", [b.op("Mul", [b.op("MatMul", [q, k]), scale]), future])
        probs = dropout(b.op("Softmax", [scores], axis=-1))
        ctx = b.op("Transpose", [b.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        ctx = b.op("Reshape", [ctx, merged_shape])
        x = b.op("Add", [x, dropout(linear(ctx, f"{p}.attention.dense", H, H))])
        h = linear(layer_norm(x, f"{p}.post_attention_layernorm"), f"{p}.mlp.dense_h_to_4h", H, F)
        gelu = b.op("Mul", [b.op("Mul", [h, half]), b.op("Add", [b.op("Erf", [b.op("Div", [h, sqrt2])]), one])])
        x = b.op("Add", [x, dropout(linear(gelu, f"{p}.mlp.dense_4h_to_h", F, H))])
    x = layer_norm(x, "final_layernorm")
    head = b.init("output_layer.weight", [V, H]) if a.untied else wte
    logits = b.op("MatMul", [x, b.op("Transpose", [head], perm=[1, 0])])
    logits = b.op("Reshape", [logits, b.const([-1, V])])
    labels = b.op("Reshape", ["labels", b.const([-1])])
    b.nodes.append(helper.make_node("SoftmaxCrossEntropyLoss", [logits, labels], ["loss"], name="loss_node",
                                    reduction="mean"))
    return inputs


# --------------------------------------------------------------------------- ResNet

BLOCKS = {18: ("basic", [2, 2, 2, 2]), 34: ("basic", [3, 4, 6, 3]), 50: ("bottleneck", [3, 4, 6, 3]),
          101: ("bottleneck", [3, 4, 23, 3]), 152: ("bottleneck", [3, 8, 36, 3])}


def resnet(b, a):
    kind, counts = BLOCKS[a.depth]
    S, W = a.image_size, a.width
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, S, S]),
              helper.make_tensor_value_info("y", TensorProto.INT64, ["batch"])]

    def conv_bn(x, prefix, c_in, c_out, k, stride, relu=True):
        x = b.op("Conv", [x, b.init(prefix + ".conv.weight", [c_out, c_in, k, k])], kernel_shape=[k, k],
                 strides=[stride, stride], pads=[k // 2] * 4)
        # Training mode: outputs 1 and 2 are the updated running statistics.
        y, _, _ = b.op("BatchNormalization",
                       [x, b.init(prefix + ".bn.weight", [c_out]), b.init(prefix + ".bn.bias", [c_out]),
                        b.init(prefix + ".bn.running_mean", [c_out], buffer=True),
                        b.init(prefix + ".bn.running_var", [c_out], buffer=True)],
                       n_out=3, epsilon=1e-5, momentum=0.9, training_mode=1)
        return b.op("Relu", [y]) if relu else y

    x = conv_bn("x", "stem", 3, 64 * W, 7, 2)
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = 64 * W
    expansion = 4 if kind == "bottleneck" else 1
    for stage, n in enumerate(counts):
        width = 64 * W * 2 ** stage
        for j in range(n):
            p = f"layer{stage + 1}.{j}"
            stride = 2 if stage > 0 and j == 0 else 1
            c_out = width * expansion
            if kind == "basic":
                h = conv_bn(x, p + ".a", c_in, width, 3, stride)
                h = conv_bn(h, p + ".b", width, c_out, 3, 1, relu=False)
            else:
                h = conv_bn(x, p + ".a", c_in, width, 1, 1)
                h = conv_bn(h, p + ".b", width, width, 3, stride)
                h = conv_bn(h, p + ".c", width, c_out, 1, 1, relu=False)
            shortcut = x if stride == 1 and c_in == c_out else conv_bn(x, p + ".down", c_in, c_out, 1, stride,
                                                                       relu=False)
            x = b.op("Relu", [b.op("Add", [h, shortcut])])
            c_in = c_out
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    logits = b.op("Gemm", [x, b.init("fc.weight", [a.classes, c_in]), b.init("fc.bias", [a.classes])], transB=1)
    b.nodes.append(helper.make_node("SoftmaxCrossEntropyLoss", [logits, "y"], ["loss"], name="loss_node",
                                    reduction="mean"))
    return inputs


# --------------------------------------------------------------------------- main

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", choices=["bert", "gpt", "resnet"])
    p.add_argument("-o", "--out", required=True, help="the .onnx file to write")
    p.add_argument("--weights", choices=["external", "none"], default="external",
                   help="external: initializers point to OUT.weights, which is never written; none: dims only")
    g = p.add_argument_group("bert and gpt")
    g.add_argument("--layers", type=int, default=24)
    g.add_argument("--hidden", type=int, default=1024)
    g.add_argument("--heads", type=int, default=16)
    g.add_argument("--ffn", type=int, help="feed-forward size (default 4 x hidden)")
    g.add_argument("--seq-len", type=int, help="default 512 (bert), 2048 (gpt)")
    g.add_argument("--vocab", type=int, help="default 30522 (bert), 51200 (gpt)")
    g = p.add_argument_group("gpt")
    g.add_argument("--megatron", choices=list(MEGATRON_ROWS),
                   help="layers, hidden and heads of a row of Megatron-LM's table (overrides those flags)")
    g.add_argument("--dropout", type=float, default=0.1, help="Megatron's hidden and attention dropout; 0: none")
    g.add_argument("--untied", action="store_true", help="an output layer of its own, not the word embedding")
    g = p.add_argument_group("resnet")
    g.add_argument("--depth", type=int, default=50, choices=sorted(BLOCKS))
    g.add_argument("--width", type=int, default=1, help="channel multiplier (RaNNC's widened ResNets)")
    g.add_argument("--image-size", type=int, default=224)
    g.add_argument("--classes", type=int, default=1000)
    a = p.parse_args(argv)
    if a.megatron:
        if a.model != "gpt":
            p.error("--megatron applies to gpt only")
        a.heads, a.hidden, a.layers = MEGATRON_ROWS[a.megatron][:3]
    if a.seq_len is None:
        a.seq_len = 2048 if a.model == "gpt" else 512
    if a.vocab is None:
        a.vocab = 51200 if a.model == "gpt" else 30522
    if not 0 <= a.dropout < 1:
        p.error("--dropout must be in [0, 1)")
    for flag in ("layers", "hidden", "heads", "seq_len", "vocab", "width", "image_size", "classes"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1")
    if a.ffn is not None and a.ffn < 1:
        p.error("--ffn must be >= 1")
    if a.hidden % a.heads:
        p.error(f"--hidden {a.hidden} must be divisible by --heads {a.heads}")
    return a


def main(argv=None):
    a = parse_args(argv)
    data_file = os.path.basename(a.out) + ".weights"
    b = Builder(a.weights, data_file)
    inputs = {"bert": bert, "gpt": gpt, "resnet": resnet}[a.model](b, a)
    graph = helper.make_graph(b.nodes, f"{a.model}_large", inputs,
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], initializer=b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="make_large.py")
    if a.weights == "external" and os.path.exists(os.path.join(os.path.dirname(a.out) or ".", data_file)):
        sys.exit(f"make_large.py: error: {data_file} exists next to {a.out}; the model would read it as its weights")
    blob = model.SerializeToString()
    tmp = a.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(blob)
    os.replace(tmp, a.out)  # never leave a half-written model behind
    print(json.dumps({"model": a.model, "params": b.params, "buffers": b.buffer_elems, "nodes": len(b.nodes),
                      "initializers": len(b.inits), "file_bytes": len(blob), "weights": a.weights}))


if __name__ == "__main__":
    main()
