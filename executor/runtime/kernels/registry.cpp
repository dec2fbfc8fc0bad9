// The kernel table, merged from the families' lists, and runOp, which checks a
// node against the op set and the kernel's arity before running it.
#include "executor/runtime/kernels/registry.h"

#include "executor/runtime/kernels/fused.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "executor/runtime/batch_statistics.h"
#include "executor/runtime/ops.h"
#include "planner/ir/batch_norm.h"
#include "planner/ir/fused_ops.h"
#include "planner/ir/op_set.h"

namespace rannc::runtime {
namespace kernels {

const std::vector<KernelDef> &kernelTable() {
  static const std::vector<KernelDef> kTable = [] {
    std::vector<KernelDef> all;
    for (auto family : {elementwiseKernels, reduceKernels, softmaxKernels, linalgKernels, normalizationKernels,
                        tensorShapeKernels, creationKernels, indexingKernels, convPoolKernels, lossDropoutKernels,
                        randomKernels, resizeKernels, signalKernels, recurrentKernels,
                        tensorParallelKernels, fusedKernels}) {
      std::vector<KernelDef> k = family();
      all.insert(all.end(), k.begin(), k.end());
    }
    std::sort(all.begin(), all.end(), [](const KernelDef &a, const KernelDef &b) { return a.type < b.type; });
    auto twice = std::adjacent_find(all.begin(), all.end(),
                                    [](const KernelDef &a, const KernelDef &b) { return a.type == b.type; });
    if (twice != all.end())
      throw std::logic_error("rannc::runtime: op type '" + std::string(twice->type) + "' has two kernels");
    return all;
  }();
  return kTable;
}

const KernelDef *findKernel(std::string_view type) {
  const auto &table = kernelTable();
  auto it = std::lower_bound(table.begin(), table.end(), type,
                             [](const KernelDef &k, std::string_view t) { return k.type < t; });
  return it != table.end() && it->type == type ? &*it : nullptr;
}

} // namespace kernels

using kernels::KernelDef;
using kernels::kVariadic;
using kernels::OpCtx;
using kernels::OpError;
using kernels::Outputs;

std::vector<torch::Tensor> runOp(const ir::Node &node, const std::vector<torch::Tensor> &inputs, int64_t opset,
                                 comm::Communicator *group) {
  // Note [batch statistics scope]: the trainer's replicas, where it opened one.
  if (comm::Communicator *replicas = batchStatisticsGroup(); replicas && ir::computesBatchStatistics(node))
    return runSyncBatchNorm(node, inputs, opset, *replicas);
  if (ir::isAten(node)) return runAtenOp(node, inputs);
  OpCtx c(node, inputs, opset, group);
  // Domain "rannc": the tensor-parallel collectives (kernels/tensor_parallel.cpp).
  // Domain "rannc.fused": the kernels the import's fusion writes (kernels/fused.cpp).
  if (!node.domain.empty() && node.domain != "ai.onnx" && !ir::isRannc(node) && !ir::isFused(node))
    c.fail("unsupported domain '" + node.domain + "'");
  const KernelDef *k = kernels::findKernel(node.op_type);
  const ir::OpInfo *info = ir::findOp(node.op_type);
  if (!k || !info) c.fail("unsupported op type");
  if (opset < info->min_opset || opset > info->max_opset)
    c.fail("opset " + std::to_string(opset) + " is outside the supported range " +
           std::to_string(info->min_opset) + ".." + std::to_string(info->max_opset));
  if (inputs.size() != node.inputs.size())
    c.fail("given " + std::to_string(inputs.size()) + " tensors for " +
           std::to_string(node.inputs.size()) + " inputs");
  int n = int(inputs.size());
  if (n < k->min_inputs || (k->max_inputs != kVariadic && n > k->max_inputs))
    c.fail("expects " + std::to_string(k->min_inputs) + ".." +
           (k->max_inputs == kVariadic ? std::string("any") : std::to_string(k->max_inputs)) +
           " inputs, got " + std::to_string(n));

  Outputs out;
  try {
    out = k->fn(c);
  } catch (const OpError &) {
    throw;
  } catch (const c10::Error &e) {
    c.fail(e.what_without_backtrace());
  } catch (const std::exception &e) {
    c.fail(e.what());
  }
  out.resize(std::max(out.size(), node.outputs.size()));
  for (size_t i = 0; i < node.outputs.size(); ++i)
    if (c.wants(i) && !out[i].defined()) c.fail("does not produce output " + std::to_string(i));
  out.resize(node.outputs.size());
  for (size_t i = 0; i < out.size(); ++i)
    if (!c.wants(i)) out[i] = torch::Tensor();
  return out;
}

std::vector<std::string> kernelOpTypes() {
  std::vector<std::string> types;
  for (const KernelDef &k : kernels::kernelTable()) types.emplace_back(k.type);
  return types;
}

} // namespace rannc::runtime
