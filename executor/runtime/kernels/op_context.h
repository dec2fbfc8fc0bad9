// What an ONNX kernel sees (OpCtx, as ONNX Runtime's OpKernelContext), and
// the conventions every kernel follows.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "executor/comm/comm.h"
#include "planner/ir/ir.h"

// Note [kernel conventions]
// - Float paths use only ATen ops that autograd differentiates; integer and
//   shape arithmetic (axes, sizes, Slice bounds) is plain C++ on values read
//   back from int64 tensors, so shape chains (Shape -> Gather -> Concat ->
//   Reshape) follow the real batch size instead of sizes baked in at import.
// - Integer tensors stay integer: results are cast back where torch promotes
//   (Div truncates, sums of int32 stay int32, Pow keeps the base's type).
// - Tensors created from nothing but sizes (Shape, Size, ConstantOfShape, Range)
//   go on the device of an input; Constant has no input and goes on the CPU.

namespace rannc::runtime::kernels {

using Outputs = std::vector<torch::Tensor>;

/// An error already worded with the node's name and op type.
class OpError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// What a kernel sees: the node, its input tensors and the opset, with checked
/// accessors whose errors name the node.
class OpCtx {
public:
  OpCtx(const ir::Node &node, const std::vector<torch::Tensor> &inputs, int64_t opset,
        comm::Communicator *group = nullptr)
      : node_(node), in_(inputs), opset_(opset), group_(group) {}

  int64_t opset() const { return opset_; }
  /// The stage's tensor-parallel group (Note [tensor parallel collectives] in
  /// tensor_parallel.cpp); null outside a tensor-parallel stage.
  comm::Communicator *group() const { return group_; }

  [[noreturn]] void fail(const std::string &what) const {
    throw OpError("node '" + node_.name + "' (" + node_.op_type + "): " + what);
  }

  size_t numInputs() const { return in_.size(); }
  /// True when input i is given (not omitted, not past the end).
  bool has(size_t i) const { return i < in_.size() && in_[i].defined(); }
  const torch::Tensor &in(size_t i) const {
    if (!has(i)) fail("missing required input " + std::to_string(i));
    return in_[i];
  }
  c10::optional<torch::Tensor> opt(size_t i) const {
    return has(i) ? c10::optional<torch::Tensor>(in_[i]) : c10::nullopt;
  }

  size_t numOutputs() const { return node_.outputs.size(); }
  /// True when output i is consumed (optional outputs may be skipped).
  bool wants(size_t i) const {
    return i < node_.outputs.size() && node_.outputs[i] != ir::kNoValue;
  }

  bool hasAttr(const std::string &name) const { return node_.attrs.count(name) != 0; }
  int64_t attrInt(const std::string &name, int64_t dflt) const {
    const auto *v = attr<int64_t>(name);
    return v ? *v : dflt;
  }
  int64_t attrInt(const std::string &name) const { return *required<int64_t>(name); }
  double attrFloat(const std::string &name, double dflt) const {
    if (!hasAttr(name)) return dflt;
    // An importer may store a whole-number float as an int; both mean the same.
    if (const auto *i = std::get_if<int64_t>(&node_.attrs.at(name))) return double(*i);
    return *attr<double>(name);
  }
  std::string attrString(const std::string &name, const std::string &dflt) const {
    const auto *v = attr<std::string>(name);
    return v ? *v : dflt;
  }
  std::optional<std::vector<int64_t>> attrInts(const std::string &name) const {
    const auto *v = attr<std::vector<int64_t>>(name);
    return v ? std::optional<std::vector<int64_t>>(*v) : std::nullopt;
  }
  std::optional<std::vector<double>> attrFloats(const std::string &name) const {
    const auto *v = attr<std::vector<double>>(name);
    return v ? std::optional<std::vector<double>>(*v) : std::nullopt;
  }
  std::optional<std::vector<std::string>> attrStrings(const std::string &name) const {
    const auto *v = attr<std::vector<std::string>>(name);
    return v ? std::optional<std::vector<std::string>>(*v) : std::nullopt;
  }
  std::vector<int64_t> attrIntsRequired(const std::string &name) const {
    return *required<std::vector<int64_t>>(name);
  }
  const ir::Tensor *attrTensor(const std::string &name) const { return attr<ir::Tensor>(name); }

private:
  template <typename T> const T *attr(const std::string &name) const {
    auto it = node_.attrs.find(name);
    if (it == node_.attrs.end()) return nullptr;
    const T *v = std::get_if<T>(&it->second);
    if (!v) fail("attribute '" + name + "' has the wrong type");
    return v;
  }
  template <typename T> const T *required(const std::string &name) const {
    const T *v = attr<T>(name);
    if (!v) fail("missing required attribute '" + name + "'");
    return v;
  }

  const ir::Node &node_;
  const std::vector<torch::Tensor> &in_;
  int64_t opset_;
  comm::Communicator *group_;
};

} // namespace rannc::runtime::kernels
