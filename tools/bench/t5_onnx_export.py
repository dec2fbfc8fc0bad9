#!/usr/bin/env python3
"""Where T5's default dynamo ONNX export fails inside PyTorch.

Exports models/zoo.py's hf_t5 (T5ForConditionalGeneration from a small
config, called as users call it, the batch and the sequence dynamic) with
torch.export.export(strict=False), then runs the two steps torch.onnx.export
runs next (torch/onnx/_internal/exporter/_core.py,
_prepare_exported_program_for_export): the ONNX decompositions, and the type
promotion pass that re-runs the decomposed graph on fake tensors. Prints the
strides the decomposition recorded from T5Attention's
`reshape(*input_shape, -1)` (modeling_t5.py), now an aten.view, back to the
attention (aten.scaled_dot_product_attention), and what the re-run says,
for backed_size_oblivious off and on (the exporter's own setting is on).
docs/front-ends.md explains the result.

    .venv/bin/python tools/bench/t5_onnx_export.py
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models"))
import zoo  # noqa: E402
from make_model import dynamic_shapes  # noqa: E402


def main():
    from torch.onnx._internal.exporter import _fx_passes, _registration
    torch.manual_seed(0)
    model = zoo.HFT5().train()
    example = (torch.randint(4, model.vocab, (8, model.seq_len)), torch.randint(4, model.vocab, (8, model.seq_len)))
    names = ["input_ids", "labels"]
    program = torch.export.export(model, example, dynamic_shapes=dynamic_shapes(model, names), strict=False)
    registry = _registration.ONNXRegistry.from_torchlib()
    print(f"torch {torch.__version__}")
    for oblivious in (False, True):
        with torch.fx.experimental._config.patch(backed_size_oblivious=oblivious):
            decomposed = _fx_passes.decompose_with_registry(program, registry)
            views = [n for n in decomposed.graph.nodes if n.target == torch.ops.aten.view.default
                     and "modeling_t5.py" in (n.meta.get("stack_trace") or "")
                     and "reshape(*input_shape, -1)" in (n.meta.get("stack_trace") or "")]
            first = views[0] if views else None
            print(f"backed_size_oblivious={oblivious}: the decomposition's recorded strides, from the view back:")
            node = first
            while node is not None:
                print(f"  {node.name} = {node.target}: shape {tuple(node.meta['val'].shape)}, "
                      f"strides {tuple(node.meta['val'].stride())}")
                if node.target not in (torch.ops.aten.view.default, torch.ops.aten.transpose.int):
                    break
                node = node.args[0]
            try:
                _fx_passes.insert_type_promotion_nodes(decomposed.graph_module)
                print("  type promotion re-run: ok")
            except Exception as e:  # the exporter's failure is the result
                print(f"  type promotion re-run: {type(e).__name__}: {str(e).strip().splitlines()[0]}")


if __name__ == "__main__":
    main()
