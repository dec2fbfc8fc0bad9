// ATen and prim operators of TorchScript and torch.export graphs (ir::isAten
// nodes), called through the
// JIT's operator registry with a stack rebuilt from the node's argument
// description (Note [aten argument encoding] in planner/ir/aten_args.h).
#include <torch/csrc/jit/runtime/operator.h>

#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "executor/runtime/batch_statistics.h"
#include "executor/runtime/ops.h"
#include "planner/ir/aten_args.h"

namespace rannc::runtime {
namespace {

namespace args = ir::aten_args;

[[noreturn]] void fail(const ir::Node &n, const std::string &what) {
  throw std::runtime_error("node '" + n.name + "' (" + n.op_type + "): " + what);
}

template <typename T>
const T &attr(const ir::Node &n, const std::string &key) {
  auto it = n.attrs.find(key);
  if (it == n.attrs.end()) fail(n, "missing attribute '" + key + "'");
  const T *v = std::get_if<T>(&it->second);
  if (!v) fail(n, "attribute '" + key + "' has the wrong type");
  return *v;
}

std::shared_ptr<torch::jit::Operator> findOperator(const ir::Node &n) {
  static std::mutex mu;
  static std::unordered_map<std::string, std::shared_ptr<torch::jit::Operator>> cache;
  const std::string &overload = attr<std::string>(n, args::kOverload);
  const std::string key = n.op_type + "." + overload;
  registerLibraryOps();
  std::lock_guard<std::mutex> lock(mu);
  auto &op = cache[key];
  if (!op) op = torch::jit::findOperatorFor(c10::OperatorName(n.op_type, overload));
  if (!op) fail(n, "this LibTorch has no operator " + key);
  return op;
}

/// A Python number passed as a Tensor: a 0-d tensor marked as a wrapped
/// number, so type promotion treats it as PyTorch treats `x * 2`.
c10::IValue wrappedNumber(at::Tensor t) {
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return c10::IValue(t);
}

c10::IValue constant(const ir::Node &n, const std::string &kind, const std::string &vi) {
  if (kind == args::kConstNone) return c10::IValue();
  if (kind == args::kConstBool) return c10::IValue(attr<int64_t>(n, vi) != 0);
  if (kind == args::kConstInt) return c10::IValue(attr<int64_t>(n, vi));
  if (kind == args::kConstFloat) return c10::IValue(attr<double>(n, vi));
  if (kind == args::kConstWrappedInt) return wrappedNumber(at::scalar_tensor(attr<int64_t>(n, vi), at::kLong));
  if (kind == args::kConstWrappedFloat) return wrappedNumber(at::scalar_tensor(attr<double>(n, vi), at::kDouble));
  if (kind == args::kConstStr) return c10::IValue(attr<std::string>(n, vi));
  if (kind == args::kConstDevice) return c10::IValue(c10::Device(attr<std::string>(n, vi)));
  if (kind == args::kConstInts) return c10::IValue(attr<std::vector<int64_t>>(n, vi));
  if (kind == args::kConstFloats) return c10::IValue(attr<std::vector<double>>(n, vi));
  if (kind == args::kConstBools) {
    c10::List<bool> v;
    for (int64_t b : attr<std::vector<int64_t>>(n, vi)) v.push_back(b != 0);
    return c10::IValue(v);
  }
  fail(n, "unknown constant kind '" + kind.substr(args::kConstPrefix.size()) + "'");
}

std::vector<int64_t> toInts(const torch::Tensor &t) {
  torch::Tensor c = t.to(torch::kCPU, torch::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

/// An operator result as tensors: ints, floats and bools become 0-d tensors,
/// int lists 1-d int64 tensors, so every IR value is a tensor.
void pushResult(const ir::Node &n, const c10::IValue &v, std::vector<torch::Tensor> &out) {
  if (v.isTensor()) out.push_back(v.toTensor());
  else if (v.isInt()) out.push_back(torch::scalar_tensor(v.toInt(), torch::kLong));
  else if (v.isDouble()) out.push_back(torch::scalar_tensor(v.toDouble(), torch::kDouble));
  else if (v.isBool()) out.push_back(torch::scalar_tensor(v.toBool(), torch::kBool));
  else if (v.isIntList()) out.push_back(torch::tensor(v.toIntVector(), torch::kLong));
  else if (v.isNone()) out.emplace_back();
  else if (v.isTensorList()) // split/chunk/unbind: one IR output per element ("list_out")
    for (const at::Tensor &t : v.toTensorVector()) out.push_back(t);
  else fail(n, std::string("returned a ") + v.tagKind() + ", which the IR cannot hold");
}

} // namespace

std::vector<c10::IValue> atenArguments(const ir::Node &n, const std::vector<torch::Tensor> &inputs) {
  const int64_t nargs = attr<int64_t>(n, args::kNargs);
  torch::jit::Stack stack;
  size_t next = 0;
  auto take = [&]() -> const torch::Tensor & {
    if (next >= inputs.size()) fail(n, "has fewer inputs than its arguments need");
    return inputs[next++];
  };
  for (int64_t i = 0; i < nargs; ++i) {
    const std::string &kind = attr<std::string>(n, args::kindKey(i));
    const std::string vi = args::valueKey(i);
    if (kind.rfind(args::kConstPrefix, 0) == 0) stack.push_back(constant(n, kind, vi));
    else if (kind == args::kTensor) stack.emplace_back(take());
    else if (kind == args::kInt) stack.emplace_back(take().item<int64_t>());
    else if (kind == args::kFloat) stack.emplace_back(take().item<double>());
    else if (kind == args::kBool) stack.emplace_back(take().item<bool>());
    else if (kind == args::kWrappedInt) stack.push_back(wrappedNumber(at::scalar_tensor(take().item<int64_t>(), at::kLong)));
    else if (kind == args::kWrappedFloat) stack.push_back(wrappedNumber(at::scalar_tensor(take().item<double>(), at::kDouble)));
    else if (kind == args::kInts) stack.emplace_back(toInts(take()));
    else if (kind == args::kScalar) {
      const torch::Tensor &t = take();
      stack.emplace_back(t.is_floating_point() ? c10::IValue(t.item<double>()) : c10::IValue(t.item<int64_t>()));
    } else if (kind == args::kTensors) {
      c10::List<at::Tensor> list;
      for (int64_t k = 0; k < attr<int64_t>(n, vi); ++k) list.push_back(take());
      stack.emplace_back(list);
    } else if (kind == args::kOptTensors) { // Tensor?[]: "m<i>" marks the elements that are tensors
      c10::List<std::optional<at::Tensor>> list;
      for (int64_t present : attr<std::vector<int64_t>>(n, args::maskKey(i)))
        list.push_back(present ? std::optional<at::Tensor>(take()) : std::nullopt);
      stack.emplace_back(list);
    } else {
      fail(n, "unknown argument kind '" + kind + "'");
    }
  }
  return stack;
}

// Note [view of a relaid tensor]
// torch.export records the graph of one traced run: a `.contiguous()` that
// was a no-op there (attention's output after transpose(1, 2), which CPU
// SDPA already lays out that way) is not in the program, and the aten.view
// after it assumes the traced layout. Here a kernel may lay a tensor out
// otherwise (another SDPA backend for another mask, a tensor received from
// the previous stage), and view would refuse the strides. reshape is view
// wherever view works (the same alias, so in-place ops through it behave
// alike) and a copy of the same values where it would not, so rannc runs
// aten::view as reshape.
std::vector<torch::Tensor> runAtenOp(const ir::Node &n, const std::vector<torch::Tensor> &inputs) {
  torch::jit::Stack stack = atenArguments(n, inputs);
  std::vector<torch::Tensor> out;
  if (n.op_type == "prim::ListConstruct") { // of ints, some computed
    std::vector<int64_t> items;
    for (const auto &v : stack) items.push_back(v.toInt());
    out.push_back(torch::tensor(items, torch::kLong));
    return out;
  }
  // Note [view of a relaid tensor]: aten::view runs as reshape.
  if (n.op_type == "aten::view" && attr<std::string>(n, args::kOverload).empty() && stack.size() == 2 &&
      stack[0].isTensor() && stack[1].isIntList()) {
    out.push_back(stack[0].toTensor().reshape(stack[1].toIntVector()));
    return out;
  }
  try {
    findOperator(n)->getOperation()(stack);
  } catch (const c10::Error &e) {
    fail(n, e.what_without_backtrace());
  }
  for (const auto &v : stack) pushResult(n, v, out);
  if (auto it = n.attrs.find(args::kListOut); it != n.attrs.end() && int64_t(out.size()) != std::get<int64_t>(it->second))
    fail(n, "returned " + std::to_string(out.size()) + " tensors, the traced graph unpacked " +
                std::to_string(std::get<int64_t>(it->second)));
  return out;
}

} // namespace rannc::runtime
