// The YAML adapter: the only file that includes yaml-cpp. Every yaml-cpp
// exception stops here and becomes an Error naming the file and line.
#include <algorithm>
#include <climits>
#include <cmath>
#include <initializer_list>
#include <sstream>
#include <utility>
#include <vector>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "planner/cluster/cluster.h"
#include "planner/cluster/detail.h"
#include "planner/support/files.h"

namespace rannc::cluster {
namespace {

using detail::Quantity;

/// What a node holds, for "must be X, got Y" messages.
std::string describe(const YAML::Node &n) {
  switch (n.Type()) {
  case YAML::NodeType::Scalar: return "'" + n.Scalar() + "'";
  case YAML::NodeType::Sequence: return "a sequence";
  case YAML::NodeType::Map: return "a mapping";
  default: return "nothing";
  }
}

std::string join(std::initializer_list<const char *> names) {
  std::string out;
  for (const char *n : names) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

/// One `key: value` of a mapping. Errors about the value point at the key's
/// line: a null value has no position of its own, and a block mapping's
/// position is that of its first key.
struct Entry {
  std::string key;
  YAML::Node value;
  YAML::Mark mark;
  std::string path; ///< "device.memory"
};

/// A mapping whose keys have been checked against the ones it may hold.
struct Section {
  std::string path; ///< "" for the top level, else "device", "links.intra_node", ...
  YAML::Mark mark;  ///< the section's key (or the document start): where missing keys are reported
  std::vector<Entry> entries;

  const Entry *find(const std::string &key) const {
    for (const auto &e : entries)
      if (e.key == key) return &e;
    return nullptr;
  }
  std::string place() const { return path.empty() ? "at top level" : "in " + path; }
};

/// Where each document of a stream starts; ignores everything else.
class DocumentStarts : public YAML::EventHandler {
public:
  std::vector<YAML::Mark> starts;

  void OnDocumentStart(const YAML::Mark &mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark &, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark &, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark &, const std::string &, YAML::anchor_t, const std::string &) override {}
  void OnSequenceStart(const YAML::Mark &, const std::string &, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark &, const std::string &, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

class Parser {
public:
  explicit Parser(std::string where) : where_(std::move(where)) {}

  Expected<ClusterSpec> parse(const std::string &text);

private:
  Error error(const YAML::Mark &m, const std::string &message) const {
    if (m.is_null() || m.line < 0) return Error{where_ + ": " + message};
    return Error{where_ + ":" + std::to_string(m.line + 1) + ": " + message};
  }
  Error missing(const Section &s, const std::string &key, const std::string &why = "") const {
    return error(s.mark, "missing key '" + key + "' " + s.place() + (why.empty() ? "" : " (" + why + ")"));
  }

  Expected<Section> section(const YAML::Node &node, const YAML::Mark &mark, const std::string &path,
                            std::initializer_list<const char *> known) const;
  Expected<std::string> scalar(const Entry &e, const std::string &expected) const;
  Expected<int> positiveInt(const Entry &e) const;
  Expected<double> quantity(const Entry &e, Quantity q, bool zero_ok) const;
  Expected<double> fraction(const Entry &e) const;
  Status device(const Entry &e, ClusterSpec &c, bool &preset) const;
  Status peakFlops(const Entry &e, DeviceSpec &d, bool preset) const;
  Status links(const Section &top, ClusterSpec &c, bool preset) const;
  Status link(const Entry &e, LinkSpec &l, bool preset) const;

  std::string where_;
};

Expected<Section> Parser::section(const YAML::Node &node, const YAML::Mark &mark, const std::string &path,
                                  std::initializer_list<const char *> known) const {
  Section s{path, mark, {}};
  if (!node.IsMap())
    return error(mark, (path.empty() ? "a cluster description" : path) + " must be a mapping, got " + describe(node));
  for (const auto &kv : node) { // a pair of Nodes, by value: it->first would dangle
    const YAML::Node k = kv.first;
    if (!k.IsScalar()) return error(k.Mark(), "a key " + s.place() + " must be a name, got " + describe(k));
    const std::string &name = k.Scalar();
    if (std::find_if(known.begin(), known.end(), [&](const char *n) { return name == n; }) == known.end())
      return error(k.Mark(), "unknown key '" + name + "' " + s.place() + " (known: " + join(known) + ")");
    if (const Entry *first = s.find(name))
      return error(k.Mark(), "duplicate key '" + name + "' " + s.place() + " (first on line " +
                                 std::to_string(first->mark.line + 1) + ")");
    s.entries.push_back({name, kv.second, k.Mark(), path.empty() ? name : path + "." + name});
  }
  return s;
}

Expected<std::string> Parser::scalar(const Entry &e, const std::string &expected) const {
  if (!e.value.IsScalar()) return error(e.mark, e.path + " must be " + expected + ", got " + describe(e.value));
  return e.value.Scalar();
}

Expected<int> Parser::positiveInt(const Entry &e) const {
  auto s = scalar(e, "a positive integer");
  if (!s) return s.error();
  const std::string &t = *s;
  bool digits =
      !t.empty() && t.size() <= 9 && std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || std::stoi(t) < 1) return error(e.mark, e.path + " must be a positive integer, got '" + t + "'");
  return std::stoi(t);
}

Expected<double> Parser::quantity(const Entry &e, Quantity q, bool zero_ok) const {
  static const char *const expected[] = {"a size (e.g. 40GiB)", "FLOP/s (e.g. 19.5T)", "a bandwidth (e.g. 300GB/s)",
                                         "a duration (e.g. 5us)"};
  auto s = scalar(e, expected[static_cast<int>(q)]);
  if (!s) return s.error();
  auto v = detail::parseQuantity(*s, q);
  if (!v) return error(e.mark, e.path + ": " + v.error().message);
  if (*v < 0 || (*v == 0 && !zero_ok))
    return error(e.mark, e.path + " must be " + (zero_ok ? "zero or positive" : "positive") + ", got '" + *s + "'");
  return *v;
}

Expected<double> Parser::fraction(const Entry &e) const {
  auto s = scalar(e, "a fraction in (0, 1]");
  if (!s) return s.error();
  char *end = nullptr;
  double v = std::strtod(s->c_str(), &end);
  if (s->empty() || end != s->c_str() + s->size() || !(v > 0 && v <= 1))
    return error(e.mark, e.path + " must be a fraction in (0, 1], got '" + *s + "'");
  return v;
}

Expected<ClusterSpec> Parser::parse(const std::string &text) {
  // Count the documents first, with a bound: yaml-cpp 0.7 reports an empty
  // document forever at a token it cannot place, such as a stray ','
  // (jbeder/yaml-cpp#1040), so YAML::LoadAll would never return.
  std::istringstream in(text);
  YAML::Parser events(in);
  DocumentStarts docs;
  for (int i = 0; i < 3 && events.HandleNextDocument(docs); ++i) {
  }
  for (size_t i = 1; i < docs.starts.size(); ++i) {
    if (docs.starts[i].pos != docs.starts[i - 1].pos) continue;
    size_t pos = static_cast<size_t>(docs.starts[i].pos);
    bool shown = pos < text.size() && text[pos] > ' ' && text[pos] < 127;
    return error(docs.starts[i],
                 std::string("YAML syntax error: unexpected ") + (shown ? "'" + text.substr(pos, 1) + "'" : "token"));
  }
  if (docs.starts.size() > 1) return error(docs.starts[1], "expected one YAML document, found a second one");
  const YAML::Node root = YAML::Load(text);
  if (root.IsNull())
    return Error{where_ + ": empty cluster description (expected nodes, devices_per_node, device, links; "
                          "see docs/cluster.md)"};

  auto top = section(root, root.Mark(), "", {"nodes", "devices_per_node", "device", "links"});
  if (!top) return top.error();
  ClusterSpec c;
  for (const auto &[key, field] :
       {std::pair{"nodes", &c.num_nodes}, std::pair{"devices_per_node", &c.devices_per_node}}) {
    const Entry *e = top->find(key);
    if (!e) return missing(*top, key);
    auto n = positiveInt(*e);
    if (!n) return n.error();
    *field = *n;
  }
  if (int64_t{c.num_nodes} * c.devices_per_node > INT_MAX)
    return error(top->find("nodes")->mark, "nodes x devices_per_node is too large (" +
                                               std::to_string(int64_t{c.num_nodes} * c.devices_per_node) + ")");
  const Entry *dev = top->find("device");
  if (!dev) return missing(*top, "device");
  bool preset = false;
  if (Status st = device(*dev, c, preset); !st) return Error{st.message()};
  if (Status st = links(*top, c, preset); !st) return Error{st.message()};
  return c;
}

Status Parser::device(const Entry &e, ClusterSpec &c, bool &preset) const {
  auto s = section(e.value, e.mark, "device",
                   {"preset", "type", "name", "memory", "peak_flops", "memory_bandwidth", "compute_efficiency",
                    "memory_efficiency", "op_overhead", "runtime_reserve"});
  if (!s) return s.error();
  DeviceSpec &d = c.device;
  // The preset first: the other keys override its fields.
  if (const Entry *p = s->find("preset")) {
    auto name = scalar(*p, "a preset name");
    if (!name) return name.error();
    if (!detail::applyPreset(*name, c.devices_per_node, c))
      return error(p->mark, "device.preset: unknown preset '" + *name + "' (known: " + detail::presetList() + ")");
    preset = true;
  }
  const std::string needed = "required without a preset";
  if (const Entry *t = s->find("type")) {
    auto type = scalar(*t, "cpu or cuda");
    if (!type) return type.error();
    if (*type != "cpu" && *type != "cuda")
      return error(t->mark, "device.type must be cpu or cuda, got '" + *type + "'");
    // A preset's reserve is for its own type; a changed type takes its own.
    if (!preset || *type != d.type) d.runtime_reserve_bytes = detail::defaultRuntimeReserve(*type);
    d.type = *type;
  } else if (!preset) {
    return missing(*s, "type", needed);
  }
  if (const Entry *n = s->find("name")) {
    auto name = scalar(*n, "a name");
    if (!name) return name.error();
    if (name->empty()) return error(n->mark, "device.name must not be empty");
    d.name = *name;
  } else if (!preset) {
    d.name = d.type;
  }
  if (const Entry *m = s->find("memory")) {
    auto bytes = quantity(*m, Quantity::kBytes, false);
    if (!bytes) return bytes.error();
    if (*bytes >= 0x1p63) return error(m->mark, "device.memory is out of range");
    d.memory_bytes = std::max<int64_t>(1, std::llround(*bytes));
  } else if (!preset) {
    return missing(*s, "memory", needed);
  }
  if (const Entry *f = s->find("peak_flops")) {
    if (Status st = peakFlops(*f, d, preset); !st) return st;
  } else if (!preset) {
    return missing(*s, "peak_flops", needed);
  }
  if (const Entry *b = s->find("memory_bandwidth")) {
    auto bw = quantity(*b, Quantity::kBandwidth, false);
    if (!bw) return bw.error();
    d.memory_bandwidth = *bw;
  } else if (!preset) {
    return missing(*s, "memory_bandwidth", needed);
  }
  // Optional everywhere: the defaults of DeviceSpec (docs/cost-model.md).
  for (auto [key, field] : {std::pair{"compute_efficiency", &d.compute_efficiency},
                            std::pair{"memory_efficiency", &d.memory_efficiency}}) {
    const Entry *f = s->find(key);
    if (!f) continue;
    auto v = fraction(*f);
    if (!v) return v.error();
    *field = *v;
  }
  if (const Entry *o = s->find("op_overhead")) {
    auto t = quantity(*o, Quantity::kDuration, true);
    if (!t) return t.error();
    d.op_overhead_s = *t;
  }
  if (const Entry *r = s->find("runtime_reserve")) {
    auto bytes = quantity(*r, Quantity::kBytes, true);
    if (!bytes) return bytes.error();
    if (*bytes >= 0x1p63) return error(r->mark, "device.runtime_reserve is out of range");
    d.runtime_reserve_bytes = std::llround(*bytes);
    if (d.runtime_reserve_bytes >= d.memory_bytes)
      return error(r->mark, "device.runtime_reserve (" + formatByteSize(d.runtime_reserve_bytes) +
                                ") leaves nothing of device.memory (" + formatByteSize(d.memory_bytes) + ")");
  }
  return Status::success();
}

Status Parser::peakFlops(const Entry &e, DeviceSpec &d, bool preset) const {
  // A plain figure is the fp32 peak; a mapping gives it per precision.
  if (e.value.IsScalar()) {
    auto v = quantity(e, Quantity::kFlops, false);
    if (!v) return v.error();
    d.peak_flops = *v;
    return Status::success();
  }
  auto s = section(e.value, e.mark, e.path, {"fp32", "tf32", "fp16", "bf16"});
  if (!s) return s.error();
  if (!preset && !s->find("fp32")) return missing(*s, "fp32", "required without a preset");
  const std::pair<const char *, double *> fields[] = {{"fp32", &d.peak_flops},
                                                      {"tf32", &d.peak_flops_tf32},
                                                      {"fp16", &d.peak_flops_fp16},
                                                      {"bf16", &d.peak_flops_bf16}};
  for (const auto &[key, field] : fields) {
    const Entry *f = s->find(key);
    if (!f) continue;
    // 0 says the device has no such arithmetic; fp32 it must have.
    auto v = quantity(*f, Quantity::kFlops, field != &d.peak_flops);
    if (!v) return v.error();
    *field = *v;
  }
  return Status::success();
}

Status Parser::links(const Section &top, ClusterSpec &c, bool preset) const {
  // A link no rank pair uses (one device per node, one node) may be left out.
  const bool intra_used = c.devices_per_node > 1, inter_used = c.num_nodes > 1;
  const Entry *e = top.find("links");
  if (!e) {
    if (!preset && (intra_used || inter_used))
      return missing(top, "links", "required for more than one device without a preset");
    return Status::success();
  }
  auto s = section(e->value, e->mark, "links", {"intra_node", "inter_node"});
  if (!s) return s.error();
  if (const Entry *l = s->find("intra_node")) {
    if (Status st = link(*l, c.intra_node, preset); !st) return st;
  } else if (!preset && intra_used) {
    return missing(*s, "intra_node", "required for devices_per_node > 1 without a preset");
  }
  if (const Entry *l = s->find("inter_node")) {
    if (Status st = link(*l, c.inter_node, preset); !st) return st;
  } else if (!preset && inter_used) {
    return missing(*s, "inter_node", "required for nodes > 1 without a preset");
  }
  return Status::success();
}

Status Parser::link(const Entry &e, LinkSpec &l, bool preset) const {
  auto s = section(e.value, e.mark, e.path, {"bandwidth", "latency"});
  if (!s) return s.error();
  if (const Entry *b = s->find("bandwidth")) {
    auto bw = quantity(*b, Quantity::kBandwidth, false);
    if (!bw) return bw.error();
    l.bandwidth = *bw;
  } else if (!preset) {
    return missing(*s, "bandwidth", "required without a preset");
  }
  if (const Entry *t = s->find("latency")) {
    auto lat = quantity(*t, Quantity::kDuration, true);
    if (!lat) return lat.error();
    l.latency_s = *lat;
  } else if (!preset) {
    return missing(*s, "latency", "required without a preset");
  }
  return Status::success();
}

void emitLink(YAML::Emitter &out, const char *key, const LinkSpec &l) {
  out << YAML::Key << key << YAML::Value << YAML::Flow << YAML::BeginMap;
  out << YAML::Key << "bandwidth" << YAML::Value << formatBandwidth(l.bandwidth);
  out << YAML::Key << "latency" << YAML::Value << formatDuration(l.latency_s);
  out << YAML::EndMap;
}

} // namespace

Expected<ClusterSpec> parseClusterYaml(const std::string &text, const std::string &where) {
  Parser parser(where);
  try {
    return parser.parse(text);
  } catch (const YAML::ParserException &e) {
    std::string at = e.mark.is_null() ? where : where + ":" + std::to_string(e.mark.line + 1);
    return Error{at + ": YAML syntax error: " + e.msg};
  } catch (const YAML::Exception &e) {
    std::string at = e.mark.is_null() ? where : where + ":" + std::to_string(e.mark.line + 1);
    return Error{at + ": " + e.msg};
  } catch (const std::exception &e) {
    return Error{where + ": cannot read the cluster description: " + e.what()};
  }
}

Expected<ClusterSpec> loadClusterFile(const std::string &path) {
  auto text = readFile(path);
  if (!text) return text.error();
  return parseClusterYaml(*text, path);
}

std::string toYaml(const ClusterSpec &c) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "nodes" << YAML::Value << c.num_nodes;
  out << YAML::Key << "devices_per_node" << YAML::Value << c.devices_per_node;
  out << YAML::Key << "device" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "type" << YAML::Value << c.device.type;
  out << YAML::Key << "name" << YAML::Value << c.device.name;
  out << YAML::Key << "memory" << YAML::Value << formatByteSize(c.device.memory_bytes);
  out << YAML::Key << "peak_flops" << YAML::Value << YAML::Flow << YAML::BeginMap;
  out << YAML::Key << "fp32" << YAML::Value << formatFlops(c.device.peak_flops);
  out << YAML::Key << "tf32" << YAML::Value << formatFlops(c.device.peak_flops_tf32);
  out << YAML::Key << "fp16" << YAML::Value << formatFlops(c.device.peak_flops_fp16);
  out << YAML::Key << "bf16" << YAML::Value << formatFlops(c.device.peak_flops_bf16);
  out << YAML::EndMap;
  out << YAML::Key << "memory_bandwidth" << YAML::Value << formatBandwidth(c.device.memory_bandwidth);
  // Six significant digits: 0.8, not 0.80000000000000004.
  auto fraction = [](double v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };
  out << YAML::Key << "compute_efficiency" << YAML::Value << fraction(c.device.compute_efficiency);
  out << YAML::Key << "memory_efficiency" << YAML::Value << fraction(c.device.memory_efficiency);
  out << YAML::Key << "op_overhead" << YAML::Value << formatDuration(c.device.op_overhead_s);
  // A cuda device always says it (its 0 is not the default); cpu only when set.
  if (c.device.type == "cuda" || c.device.runtime_reserve_bytes != 0)
    out << YAML::Key << "runtime_reserve" << YAML::Value << formatByteSize(c.device.runtime_reserve_bytes);
  out << YAML::EndMap;
  // Links no rank pair uses are left out, as a cluster file may leave them.
  const bool intra = c.devices_per_node > 1 || c.intra_node.bandwidth > 0;
  const bool inter = c.num_nodes > 1 || c.inter_node.bandwidth > 0;
  if (intra || inter) {
    out << YAML::Key << "links" << YAML::Value << YAML::BeginMap;
    if (intra) emitLink(out, "intra_node", c.intra_node);
    if (inter) emitLink(out, "inter_node", c.inter_node);
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

} // namespace rannc::cluster
