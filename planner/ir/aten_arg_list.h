// An ATen node's arguments decoded from its attributes (Note [aten argument
// encoding] in aten_args.h), for the planner's readers of ATen nodes: the
// sharding rules and the import audit. Apart from aten_args.h, which the
// executor's LibTorch kernels include, so that this stays out of their builds.
#pragma once

#include <string>
#include <vector>

#include "planner/ir/ir.h"

namespace rannc::ir {

/// One ATen operator argument: its kind, the node inputs it reads, or its constant.
struct AtenArg {
  std::string kind;
  std::vector<int> inputs;                 ///< node input indices ("tensor", "ints", lists, ...)
  const AttrValue *constant = nullptr;     ///< "c:*" kinds
};

/// The arguments of ATen node `n`; empty when its encoding cannot be read.
std::vector<AtenArg> atenArgs(const Node &n);

} // namespace rannc::ir
