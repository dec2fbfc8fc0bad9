// How an ATen (or prim) operator call is written into an IR node's attributes
// (Note [aten argument encoding]): the LibTorch front ends encode with these
// names, the runtime (executor/runtime/kernels/aten.cpp) decodes with them.
// Torch-free, so both sides and the planner share the one definition.
#pragma once

#include <cstddef>
#include <string>

namespace rannc::ir::aten_args {

// Note [aten argument encoding]
// An ATen node (domain "aten", op_type the schema name such as "aten::linear")
// carries attribute "overload" (the overload name) and "nargs" (the number of
// operator arguments). Argument i is described by attribute "t<i>":
//   - "tensor", "int", "float", "bool", "scalar", "ints", "wrapped_int" or
//     "wrapped_float": a value read from the graph, the node's next IR input
//     (ints, floats and int lists produced at run time, such as aten::size's,
//     are 0-d or 1-d tensors; a wrapped one is such a number where the schema
//     wants a Tensor);
//   - "tensors": a list of "v<i>" IR inputs; "opt_tensors" for Tensor?[],
//     "m<i>" marking which of its "v<i>" elements are tensors, the rest None;
//   - "c:<kind>": a constant in attribute "v<i>", kinds int, float, bool,
//     str, device, ints, floats, bools, none, and wrapped_int/wrapped_float
//     (a Python number passed as a Tensor).
// An op whose Tensor[] result the model unpacks gets one IR output per
// element, "list_out" their count. The runtime rebuilds the interpreter's
// stack from that and calls the operator through LibTorch's registry, so
// TorchScript and torch.export models run on one path with autograd.

/// Node attributes: the overload name, the argument count, the unpacked-list length.
inline const std::string kOverload = "overload", kNargs = "nargs", kListOut = "list_out";

/// Argument kinds read from the graph (the node's next IR inputs).
inline const std::string kTensor = "tensor", kInt = "int", kFloat = "float", kBool = "bool", kScalar = "scalar",
                         kInts = "ints", kTensors = "tensors", kOptTensors = "opt_tensors";
/// A symbolic int or float computed at run time where the schema wants a
/// Tensor (`x * torch.sym_min(n, 256)` is aten.mul.Tensor): passed as a
/// wrapped-number tensor, promoted as PyTorch promotes a Python number.
inline const std::string kWrappedInt = "wrapped_int", kWrappedFloat = "wrapped_float";

/// The prefix of a constant argument's kind; the constant kinds.
inline const std::string kConstPrefix = "c:";
inline const std::string kConstNone = "c:none", kConstBool = "c:bool", kConstInt = "c:int", kConstFloat = "c:float",
                         kConstStr = "c:str", kConstDevice = "c:device", kConstInts = "c:ints",
                         kConstFloats = "c:floats", kConstBools = "c:bools", kConstWrappedInt = "c:wrapped_int",
                         kConstWrappedFloat = "c:wrapped_float";

/// The attribute holding argument i's kind ("t<i>").
inline std::string kindKey(size_t i) { return "t" + std::to_string(i); }
/// The attribute holding argument i's constant or list length ("v<i>").
inline std::string valueKey(size_t i) { return "v" + std::to_string(i); }
/// The attribute marking which elements of an "opt_tensors" argument i are tensors ("m<i>").
inline std::string maskKey(size_t i) { return "m" + std::to_string(i); }

} // namespace rannc::ir::aten_args
