#include "planner/ir/aten_arg_list.h"

#include "planner/ir/aten_args.h"

namespace rannc::ir {

namespace aa = aten_args;

std::vector<AtenArg> atenArgs(const Node &n) {
  std::vector<AtenArg> args;
  auto nargs = n.attrs.find(aa::kNargs);
  if (nargs == n.attrs.end() || !std::holds_alternative<int64_t>(nargs->second)) return args;
  size_t next = 0;
  for (size_t i = 0; i < static_cast<size_t>(std::get<int64_t>(nargs->second)); ++i) {
    AtenArg a;
    auto k = n.attrs.find(aa::kindKey(i));
    if (k == n.attrs.end() || !std::holds_alternative<std::string>(k->second)) return {};
    a.kind = std::get<std::string>(k->second);
    auto v = n.attrs.find(aa::valueKey(i));
    if (a.kind.rfind(aa::kConstPrefix, 0) == 0) {
      if (v != n.attrs.end()) a.constant = &v->second;
    } else if (a.kind == aa::kTensors || a.kind == aa::kOptTensors) {
      int64_t count = 0;
      if (a.kind == aa::kTensors && v != n.attrs.end() && std::holds_alternative<int64_t>(v->second))
        count = std::get<int64_t>(v->second);
      if (a.kind == aa::kOptTensors) {
        auto m = n.attrs.find(aa::maskKey(i));
        if (m != n.attrs.end())
          if (const auto *mask = std::get_if<std::vector<int64_t>>(&m->second))
            for (int64_t b : *mask) count += b != 0;
      }
      for (int64_t j = 0; j < count; ++j) a.inputs.push_back(static_cast<int>(next++));
    } else {
      a.inputs.push_back(static_cast<int>(next++));
    }
    args.push_back(std::move(a));
  }
  return next == n.inputs.size() ? args : std::vector<AtenArg>{};
}

} // namespace rannc::ir
