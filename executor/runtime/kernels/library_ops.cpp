// Custom operators of model libraries that torch.export keeps as calls
// (Note [library custom ops]), registered with LibTorch's dispatcher so that
// they run through the one ATen path (kernels/aten.cpp) like any ATen op.
#include <torch/library.h>

#include <mutex>
#include <vector>

#include "executor/runtime/ops.h"

namespace rannc::runtime {
namespace {

// Note [library custom ops]
// A model library may wrap a computation in a custom operator
// (torch.library.custom_op) so torch.compile treats it as opaque; torch.export
// then keeps it as one call, "torch.ops.<namespace>.<name>.default", that
// LibTorch alone cannot run. rannc registers the ones it knows under the same
// name, each a CompositeImplicitAutograd function of ATen ops that
// reproduces the library's Python definition: autograd differentiates it,
// the interpreter, profiler and conformance run it through the operator
// registry as they run aten::mm, and the importer finds its schema there.
// Shapes come from running it (Note [torch.export lowering]), FLOPs from
// planner/cost/flops.cpp's table, and tensor parallelism leaves it whole
// (an op without a rule is never cut: Note [sharding rules are conservative]).
//
// transformers::grouped_mm_fallback(input [S, K], weight [E, K, N], offs [E])
// is transformers' mixture-of-experts matmul (integrations/moe.py) when
// torch._grouped_mm cannot be used, which includes every float32 export: the
// rows are sorted by expert, offs the cumulative row counts, and rows
// [offs[i-1], offs[i]) are multiplied by weight[i]; the rows past offs[E-1]
// are zero. Its backward, a custom op of its own there, is the matching
// per-expert pair of products, which autograd derives here from the same mm
// calls (mm's backward: grad @ weight[i]^T and rows^T @ grad). The rows are
// split once (split_with_sizes, whose backward is one cat) and the experts
// unbound once (unbind, whose backward is one stack), so the backward never
// builds a full-size zero gradient per expert.
at::Tensor groupedMmFallback(const at::Tensor &input, const at::Tensor &weight, const at::Tensor &offs) {
  TORCH_CHECK(input.dim() == 2, "grouped_mm_fallback: input must be 2-d (S, K), got ", input.sizes());
  TORCH_CHECK(weight.dim() == 3, "grouped_mm_fallback: weight must be 3-d (E, K, N), got ", weight.sizes());
  TORCH_CHECK(offs.dim() == 1 && offs.size(0) == weight.size(0),
              "grouped_mm_fallback: offs must hold one offset per expert (", weight.size(0), "), got ", offs.sizes());
  TORCH_CHECK(input.size(1) == weight.size(1), "grouped_mm_fallback: input has ", input.size(1),
              " columns, weight's experts ", weight.size(1), " rows");
  TORCH_CHECK(offs.scalar_type() == at::kInt || offs.scalar_type() == at::kLong,
              "grouped_mm_fallback: offs must be int32 or int64, got ", offs.scalar_type());
  const at::Tensor ends = offs.to(at::kCPU, at::kLong).contiguous(); // one host sync, as the fallback's tolist()
  const int64_t rows = input.size(0), experts = weight.size(0);
  std::vector<int64_t> sizes;
  int64_t start = 0;
  for (int64_t i = 0; i < experts; ++i) {
    const int64_t end = ends.data_ptr<int64_t>()[i];
    TORCH_CHECK(end >= start && end <= rows, "grouped_mm_fallback: offs must be non-decreasing and at most ", rows,
                ", got ", end, " after ", start);
    sizes.push_back(end - start);
    start = end;
  }
  sizes.push_back(rows - start);
  const std::vector<at::Tensor> groups = input.split_with_sizes(sizes, 0);
  const std::vector<at::Tensor> expert = weight.unbind(0);
  std::vector<at::Tensor> parts;
  for (int64_t i = 0; i < experts; ++i) parts.push_back(at::mm(groups[i], expert[i]));
  parts.push_back(at::zeros({rows - start, weight.size(2)}, input.options()));
  return at::cat(parts, 0);
}

} // namespace

void registerLibraryOps() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Never destroyed: the dispatcher keeps the registration for the process's life.
    static auto *transformers =
        new torch::Library(torch::Library::DEF, "transformers", std::nullopt, __FILE__, __LINE__);
    transformers->def("grouped_mm_fallback(Tensor input, Tensor weight, Tensor offs) -> Tensor",
                      TORCH_FN(groupedMmFallback));
  });
}

} // namespace rannc::runtime
