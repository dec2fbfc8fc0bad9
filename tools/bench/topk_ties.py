#!/usr/bin/env python3
"""Whether a survey family's default ONNX export computes another function
than its PyTorch model because of how top-k breaks ties.

ONNX's TopK keeps equal values in index order (the operator's spec: "the
element with the lower index appears first"); PyTorch's torch.topk leaves
the order of equal values to its kernel. A model that picks k of n entries
where more than k are equal (a causal mask's -inf scores, when a query has
fewer than k keys) then selects other entries in the two runtimes, and a
model that reads the selection as a mask computes something else.

For one family of tools/hf_survey.py (the same small config, weights and
first batch), this exports with torch.onnx.export's defaults and prints:
  - the loss of PyTorch's module and of the export as ONNX defines it
    (onnx.reference, ONNX's own evaluator: not rannc);
  - for each TopK of the file, how many rows select another set of indices
    than PyTorch's topk on the same FX node, and whether every such row
    differs only among entries equal to the k-th value (ties).
rannc runs TopK as ONNX defines it (executor/runtime/kernels/indexing.cpp),
so its loss is the ONNX evaluator's. The comparison holds on any CPU: the
ties are exact (-inf), not rounding.

    .venv/bin/python tools/bench/topk_ties.py --family deepseek_v32
"""
import argparse
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import hf_survey as H  # noqa: E402

NAMES = ["input_ids", "attention_mask", "labels"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", default="deepseek_v32", help="a tools/hf_survey.py family (config.model_type)")
    a = ap.parse_args()
    import onnx
    import torch
    from onnx.reference import ReferenceEvaluator
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = H.with_loss(H.model_class(a.family)(H.small_config(a.family))).train()
    data = H.make_data(a.family, np.random.RandomState(1))
    args = tuple(torch.from_numpy(data[n][:H.BATCH]) for n in NAMES)
    feeds = {n: data[n][:H.BATCH] for n in NAMES}
    prog = torch.onnx.export(model, args, input_names=NAMES)  # the defaults, as the survey exports
    m = prog.model_proto
    topk = {}  # ONNX indices output -> FX node name
    for n in m.graph.node:
        fx = {p.key: p.value for p in n.metadata_props}.get("pkg.torch.onnx.fx_node", "")
        name = re.match(r"%(\w+) :", fx)
        if n.op_type == "TopK" and name:
            topk[n.output[1]] = name.group(1)
            m.graph.output.append(onnx.helper.make_empty_tensor_value_info(n.output[1]))
    outs = ReferenceEvaluator(m).run(None, feeds)
    onnx_values = dict(zip([o.name for o in m.graph.output], outs))
    seen = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node):
            r = super().run_node(node)
            seen[node.name] = r
            return r

    with torch.no_grad():
        torch_loss = float(model(*args))
        Recorder(prog.exported_program.module()).run(*args)
    print(f"{a.family}: step-0 loss, PyTorch {torch_loss:.7g}, the ONNX file by onnx.reference "
          f"{float(outs[0]):.7g} (relative {abs(float(outs[0]) - torch_loss) / abs(torch_loss):.1e})")
    if not topk:
        print("no TopK in the file")
    for out, fx in topk.items():
        values, indices = (t.numpy() for t in seen[fx][:2])
        mine = onnx_values[out]
        rows = [(i, j) for i in range(mine.shape[0]) for j in range(mine.shape[1])
                if set(mine[i, j].tolist()) != set(indices[i, j].tolist())]
        # Both are a top k, so a row differs only among ties when every index
        # torch.topk keeps and ONNX does not has the k-th (smallest kept) value.
        def only_ties(i, j):
            kth = values[i, j].min()
            return all(values[i, j, p] == kth for p, x in enumerate(indices[i, j].tolist())
                       if x not in set(mine[i, j].tolist()))
        ties = sum(only_ties(i, j) for i, j in rows)
        print(f"  TopK of '{fx}' (indices {mine.shape}): {len(rows)} of {mine.shape[0] * mine.shape[1]} rows "
              f"select other indices than torch.topk, {ties} of them only among values equal to the k-th")
        if rows:
            i, j = rows[0]
            print(f"    e.g. row {(i, j)}: torch.topk values {values[i, j].tolist()}, indices "
                  f"{indices[i, j].tolist()}; ONNX (lower index first) {mine[i, j].tolist()}")


if __name__ == "__main__":
    main()
