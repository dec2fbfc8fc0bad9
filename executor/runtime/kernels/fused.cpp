// The kernels of the nodes the import's pattern fusion writes (domain
// "rannc.fused", Note [pattern fusion] in planner/import/fuse.cpp): each is
// the one ATen composite PyTorch itself runs for the module the exporter
// decomposed, so autograd differentiates it and saves what that kernel saves
// (the flash or memory-efficient attention keeps no score matrix).
// Note [kernel conventions] in op_context.h holds for every kernel here.
#include "executor/runtime/kernels/helpers.h"
#include "executor/runtime/kernels/fused.h"
#include "planner/ir/fused_ops.h"

namespace rannc::runtime::kernels {
namespace {

/// scaled_dot_product_attention(q, k, v, mask, scale): the key arrives as
/// the exporter transposed it for its MatMul when `key_transposed` is set; an
/// additive float mask takes the query's type (autocast may have lowered it).
Outputs opScaledDotProductAttention(const OpCtx &c) {
  const torch::Tensor &q = c.in(0), &v = c.in(2);
  torch::Tensor k = c.in(1);
  if (q.dim() < 2 || k.dim() < 2 || v.dim() < 2) c.fail("query, key and value need at least 2 dimensions");
  if (c.attrInt("key_transposed", 0) != 0) k = k.transpose(-2, -1);
  std::optional<torch::Tensor> mask;
  if (c.has(3) && c.hasAttr("mask_fill")) { // a masked fill (Note [pattern fusion]) as an additive mask
    const torch::Tensor cond = c.in(3).to(torch::kBool);
    const torch::Tensor fill = torch::full({}, c.attrFloat("mask_fill", 0), q.options());
    mask = torch::where(c.attrInt("mask_fill_where", 1) != 0 ? cond : cond.logical_not(), fill, torch::zeros_like(fill));
  } else if (c.has(3)) {
    mask = c.in(3);
    if (mask->is_floating_point() && mask->scalar_type() != q.scalar_type()) mask = mask->to(q.scalar_type());
  }
  const double scale = c.attrFloat("scale", 1.0);
  // The flash and memory-efficient kernels want equal batch dimensions; the
  // math kernel broadcasts them as MatMul did.
  torch::Tensor qq = q, kk = k.to(q.scalar_type()), vv = v.to(q.scalar_type());
  if (qq.sizes().slice(0, qq.dim() - 2) != kk.sizes().slice(0, kk.dim() - 2) ||
      kk.sizes().slice(0, kk.dim() - 2) != vv.sizes().slice(0, vv.dim() - 2)) {
    const auto qk = at::infer_size(qq.sizes().slice(0, qq.dim() - 2), kk.sizes().slice(0, kk.dim() - 2));
    const auto all = at::infer_size(qk, vv.sizes().slice(0, vv.dim() - 2));
    const std::vector<int64_t> batch(all.begin(), all.end());
    auto widen = [&](const torch::Tensor &t) {
      std::vector<int64_t> s = batch;
      s.push_back(t.size(-2));
      s.push_back(t.size(-1));
      return t.expand(s);
    };
    qq = widen(qq);
    kk = widen(kk);
    vv = widen(vv);
  }
  // CPU's flash kernel takes operands whose last axis is dense; others fall
  // back to the math kernel, which saves the score matrix (measured: Note
  // [what autograd saves] in planner/cost/cost.cpp). A key the exporter
  // transposed from a dense [.., S, E] is a view that passes; a key made
  // [.., E, S] dense is copied, a K-sized copy saved instead of the view.
  for (torch::Tensor *t : {&qq, &kk, &vv})
    if (t->size(-1) > 1 && t->stride(-1) != 1) *t = t->contiguous();
  return {at::scaled_dot_product_attention(qq, kk, vv, mask, 0.0, false, scale)};
}

Outputs opRMSNormalization(const OpCtx &c) {
  const torch::Tensor &x = c.in(0), &w = c.in(1);
  if (normAxis(c, c.attrInt("axis", -1), x.dim()) != x.dim() - 1) c.fail("only the last axis is supported");
  return {at::rms_norm(x, {x.size(-1)}, w, c.attrFloat("epsilon", 1e-5))};
}

Outputs opSiLU(const OpCtx &c) { return {torch::silu(c.in(0))}; }

} // namespace

std::vector<KernelDef> fusedKernels() {
  return {
      {ir::kRMSNormalization, 2, 2, opRMSNormalization},
      {ir::kScaledDotProductAttention, 3, 4, opScaledDotProductAttention},
      {ir::kSiLU, 1, 1, opSiLU},
  };
}

} // namespace rannc::runtime::kernels
