#include "planner/plan/sharding_record.h"

#include <string_view>

namespace rannc::plan {
namespace {

// The plan's words for the collectives, in CollectiveKind's order.
constexpr std::string_view kKinds[] = {"copy", "sum", "gather"};

void setSharding(const sharding::ValueSharding &s, proto::Value &v) {
  if (s.axis >= 0) v.set_shard_axis(s.axis);
}

void setSharding(const sharding::ValueSharding &s, proto::OpOutput &o) {
  if (s.axis >= 0) o.set_shard_axis(s.axis);
  o.set_partial(s.partial);
}

} // namespace

void recordSharding(const ir::Graph &g, const sharding::Analysis &a, proto::Graph &out) {
  auto of = [&](std::string_view name) -> const sharding::ValueSharding * {
    const ir::ValueId id = g.findValue(name);
    return id != ir::kNoValue && id < ir::ValueId(a.values.size()) ? &a.values[id] : nullptr;
  };
  for (proto::Value &v : *out.mutable_values())
    if (const auto *s = of(v.name())) setSharding(*s, v);
  for (int n = 0; n < out.ops_size(); ++n) {
    for (proto::OpOutput &o : *out.mutable_ops(n)->mutable_outputs())
      if (const auto *s = of(o.name()); s && !o.name().empty()) setSharding(*s, o);
    if (n < int(a.node_split.size()) && a.node_split[n]) out.mutable_sharding()->add_split_ops(n);
  }
  for (int64_t size : a.cut_sizes) out.mutable_sharding()->add_split_sizes(size);
  for (const sharding::Collective &c : a.collectives) {
    proto::Collective *pc = out.mutable_sharding()->add_collectives();
    pc->set_kind(std::string(kKinds[static_cast<int>(c.kind)]));
    pc->set_value(g.values[c.value].name);
    if (c.kind == sharding::CollectiveKind::GatherAxis) pc->set_axis(c.axis);
    for (ir::NodeId r : c.readers) pc->add_readers(r);
  }
}

bool hasSharding(const proto::Graph &graph) { return graph.has_sharding(); }

Expected<sharding::Analysis> shardingFromProto(const proto::Graph &graph, const ir::Graph &g) {
  sharding::Analysis a;
  a.values.assign(g.values.size(), {});
  a.node_split.assign(g.nodes.size(), false);
  auto set = [&](const std::string &name, bool has_axis, int axis, bool partial) {
    const ir::ValueId id = g.findValue(name);
    if (id != ir::kNoValue) a.values[id] = {has_axis ? axis : -1, partial};
  };
  for (const proto::Value &v : graph.values()) set(v.name(), v.has_shard_axis(), v.shard_axis(), false);
  for (const proto::Op &op : graph.ops())
    for (const proto::OpOutput &o : op.outputs())
      if (!o.name().empty()) set(o.name(), o.has_shard_axis(), o.shard_axis(), o.partial());
  const proto::Sharding &s = graph.sharding();
  for (int n : s.split_ops()) {
    if (n < 0 || n >= int(g.nodes.size()))
      return Error{"graph.sharding.split_ops: op " + std::to_string(n) + " is not in graph.ops"};
    a.node_split[n] = true;
  }
  for (int64_t size : s.split_sizes()) {
    if (size < 1) return Error{"graph.sharding.split_sizes: " + std::to_string(size) + " is not a size"};
    a.cut_sizes.push_back(size);
  }
  for (int i = 0; i < s.collectives_size(); ++i) {
    const proto::Collective &pc = s.collectives(i);
    const std::string where = "graph.sharding.collectives[" + std::to_string(i) + "]";
    sharding::Collective c;
    int kind = 0;
    while (kind < 3 && kKinds[kind] != pc.kind()) ++kind;
    if (kind == 3) return Error{where + ".kind: '" + pc.kind() + "' is not copy, sum or gather"};
    c.kind = static_cast<sharding::CollectiveKind>(kind);
    c.value = g.findValue(pc.value());
    if (c.value == ir::kNoValue) return Error{where + ".value: '" + pc.value() + "' is not a value of the graph"};
    c.axis = pc.axis();
    for (int r : pc.readers()) {
      if (r < 0 || r >= int(g.nodes.size()))
        return Error{where + ".readers: op " + std::to_string(r) + " is not in graph.ops"};
      c.readers.push_back(r);
    }
    a.collectives.push_back(std::move(c));
  }
  return a;
}

} // namespace rannc::plan
