#include "planner/plan/plan.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>

#include "planner/support/files.h"

namespace rannc::plan {
namespace {

void tensorToProto(const ir::Tensor &t, proto::Tensor *p) {
  p->set_dtype(std::string(ir::dtypeName(t.dtype)));
  for (int64_t d : t.dims) p->add_dims(d);
  p->set_raw(t.data);
}

Expected<ir::Tensor> tensorFromProto(const proto::Tensor &p, const std::string &where) {
  ir::Tensor t;
  auto dt = ir::parseDType(p.dtype());
  if (!dt) return Error{where + ": unknown dtype '" + p.dtype() + "'"};
  t.dtype = *dt;
  t.dims.assign(p.dims().begin(), p.dims().end());
  t.data = p.raw();
  if (static_cast<int64_t>(t.data.size()) != t.numel() * ir::dtypeSize(t.dtype))
    return Error{where + ": tensor data size does not match its dims"};
  return t;
}

std::string shapeText(const ir::Value &v) { return v.shape_known ? ir::shapeString(v.shape) : "[*]"; }

Expected<ir::Dim> parseDim(const std::string &s) {
  if (s == "?") return ir::Dim::unknown();
  // Forms: N | B | K*B | B+N | B-N | K*B+N | K*B-N
  auto bpos = s.find('B');
  try {
    if (bpos == std::string::npos) {
      size_t used = 0;
      int64_t n = std::stoll(s, &used);
      if (used != s.size()) throw std::invalid_argument(s);
      return ir::Dim::fixed(n);
    }
    int64_t coeff = 1, offset = 0;
    if (bpos > 0) {
      if (s[bpos - 1] != '*') throw std::invalid_argument(s);
      coeff = std::stoll(s.substr(0, bpos - 1));
    }
    std::string rest = s.substr(bpos + 1);
    if (!rest.empty()) {
      size_t used = 0;
      offset = std::stoll(rest, &used);
      if (used != rest.size() || (rest[0] != '+' && rest[0] != '-')) throw std::invalid_argument(s);
    }
    return ir::Dim::batch(coeff, offset);
  } catch (const std::exception &) {
    return Error{"bad dimension '" + s + "' (expected N, B, K*B, K*B+N or ?)"};
  }
}

} // namespace

Expected<ir::Shape> parseShape(const std::string &text, bool &rank_known) {
  rank_known = true;
  if (text == "[*]") {
    rank_known = false;
    return ir::Shape{};
  }
  if (text.size() < 2 || text.front() != '[' || text.back() != ']')
    return Error{"bad shape '" + text + "' (expected e.g. [B,16,64])"};
  ir::Shape shape;
  std::string body = text.substr(1, text.size() - 2);
  if (body.empty()) return shape;
  size_t start = 0;
  while (true) {
    size_t comma = body.find(',', start);
    auto d = parseDim(body.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (!d) return Error{"shape '" + text + "': " + d.error().message};
    shape.push_back(*d);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return shape;
}

proto::Graph graphToProto(const ir::Graph &g) {
  proto::Graph p;
  p.set_name(g.name);
  p.set_opset(g.opset);
  auto addDecl = [&](ir::ValueId id) {
    const ir::Value &v = g.values[id];
    proto::Value *pv = p.add_values();
    pv->set_name(v.name);
    pv->set_kind(std::string(ir::valueKindName(v.kind)));
    pv->set_dtype(std::string(ir::dtypeName(v.dtype)));
    pv->set_shape(shapeText(v));
    if (auto it = g.constant_data.find(id); it != g.constant_data.end())
      tensorToProto(it->second, pv->mutable_data());
  };
  for (ir::ValueId v : g.inputs) addDecl(v);
  for (ir::ValueId v : g.parameters) addDecl(v);
  for (ir::ValueId v : g.constants) addDecl(v);
  for (ir::ValueId v : g.buffers) addDecl(v);
  for (const ir::Node &n : g.nodes) {
    proto::Op *op = p.add_ops();
    op->set_name(n.name);
    op->set_type(n.op_type);
    op->set_domain(n.domain);
    for (ir::ValueId in : n.inputs) op->add_inputs(in == ir::kNoValue ? "" : g.values[in].name);
    for (ir::ValueId out : n.outputs) {
      proto::OpOutput *o = op->add_outputs();
      if (out == ir::kNoValue) continue;
      const ir::Value &v = g.values[out];
      o->set_name(v.name);
      o->set_dtype(std::string(ir::dtypeName(v.dtype)));
      o->set_shape(shapeText(v));
      if (v.batch_blocks != 1) o->set_batch_blocks(v.batch_blocks == 0 ? -1 : v.batch_blocks);
      if (v.compute_dtype != ir::DType::Undefined && v.compute_dtype != v.dtype)
        o->set_compute_dtype(std::string(ir::dtypeName(v.compute_dtype)));
    }
    for (const auto &[name, value] : n.attrs) {
      proto::Attribute *a = op->add_attrs();
      a->set_name(name);
      struct Setter {
        proto::Attribute *a;
        void operator()(int64_t v) { a->set_i(v); }
        void operator()(double v) { a->set_f(v); }
        void operator()(const std::string &v) { a->set_s(v); }
        void operator()(const std::vector<int64_t> &v) { *a->mutable_ints()->mutable_v() = {v.begin(), v.end()}; }
        void operator()(const std::vector<double> &v) { *a->mutable_floats()->mutable_v() = {v.begin(), v.end()}; }
        void operator()(const std::vector<std::string> &v) {
          for (const auto &s : v) a->mutable_strings()->add_v(s);
        }
        void operator()(const ir::Tensor &t) { tensorToProto(t, a->mutable_t()); }
      };
      std::visit(Setter{a}, value);
    }
  }
  p.set_loss(g.loss == ir::kNoValue ? "" : g.values[g.loss].name);
  return p;
}

Expected<ir::Graph> graphFromProto(const proto::Graph &p) {
  ir::Graph g;
  g.name = p.name();
  g.opset = p.opset();
  auto setTypeAndShape = [](ir::Value &v, const std::string &dtype, const std::string &shape,
                            const std::string &where) -> Status {
    auto dt = ir::parseDType(dtype);
    if (!dt) return Error{where + ": unknown dtype '" + dtype + "'"};
    v.dtype = *dt;
    bool rank_known = true;
    auto s = parseShape(shape.empty() ? "[*]" : shape, rank_known);
    if (!s) return Error{where + ": " + s.error().message};
    v.shape = std::move(*s);
    v.shape_known = rank_known;
    return Status::success();
  };
  for (int i = 0; i < p.values_size(); ++i) {
    const proto::Value &pv = p.values(i);
    std::string where = "graph.values[" + std::to_string(i) + "] '" + pv.name() + "'";
    if (g.findValue(pv.name()) != ir::kNoValue) return Error{where + ": declared twice"};
    ir::Value v;
    v.name = pv.name();
    if (Status st = setTypeAndShape(v, pv.dtype(), pv.shape(), where); !st) return Error{st.message()};
    if (pv.kind() == "input") v.kind = ir::ValueKind::Input;
    else if (pv.kind() == "param") v.kind = ir::ValueKind::Parameter;
    else if (pv.kind() == "const") v.kind = ir::ValueKind::Constant;
    else if (pv.kind() == "buffer") v.kind = ir::ValueKind::Buffer;
    else return Error{where + ": kind must be input, param, const or buffer (got '" + pv.kind() + "')"};
    ir::ValueKind kind = v.kind;
    ir::ValueId id = g.addValue(std::move(v));
    if (kind == ir::ValueKind::Input) g.inputs.push_back(id);
    if (kind == ir::ValueKind::Parameter) g.parameters.push_back(id);
    if (kind == ir::ValueKind::Buffer) g.buffers.push_back(id);
    if (kind == ir::ValueKind::Constant) {
      g.constants.push_back(id);
      if (!pv.has_data()) return Error{where + ": constant without data"};
      auto t = tensorFromProto(pv.data(), where);
      if (!t) return t.error();
      g.constant_data.emplace(id, std::move(*t));
    }
  }
  for (int i = 0; i < p.ops_size(); ++i) {
    const proto::Op &op = p.ops(i);
    std::string where = "graph.ops[" + std::to_string(i) + "] '" + op.name() + "'";
    ir::Node n;
    n.name = op.name();
    n.op_type = op.type();
    n.domain = op.domain();
    for (const auto &in : op.inputs()) {
      if (in.empty()) {
        n.inputs.push_back(ir::kNoValue);
        continue;
      }
      ir::ValueId id = g.findValue(in);
      if (id == ir::kNoValue) return Error{where + ": input '" + in + "' is not defined before this op"};
      n.inputs.push_back(id);
    }
    for (const auto &out : op.outputs()) {
      if (out.name().empty()) {
        n.outputs.push_back(ir::kNoValue);
        continue;
      }
      if (g.findValue(out.name()) != ir::kNoValue)
        return Error{where + ": output '" + out.name() + "' is defined twice"};
      ir::Value v;
      v.name = out.name();
      if (Status st = setTypeAndShape(v, out.dtype(), out.shape(), where); !st) return Error{st.message()};
      v.batch_blocks = out.batch_blocks() == 0 ? 1 : out.batch_blocks() < 0 ? 0 : out.batch_blocks();
      if (!out.compute_dtype().empty()) {
        auto cd = ir::parseDType(out.compute_dtype());
        if (!cd || !ir::isFloating(*cd) || !ir::isFloating(v.dtype))
          return Error{where + ": output '" + out.name() + "': compute_dtype '" + out.compute_dtype() +
                       "' is not a floating dtype of a floating value"};
        v.compute_dtype = *cd;
      }
      n.outputs.push_back(g.addValue(std::move(v)));
    }
    for (const auto &a : op.attrs()) {
      ir::AttrValue v;
      switch (a.value_case()) {
      case proto::Attribute::kI: v = a.i(); break;
      case proto::Attribute::kF: v = a.f(); break;
      case proto::Attribute::kS: v = a.s(); break;
      case proto::Attribute::kInts: v = std::vector<int64_t>(a.ints().v().begin(), a.ints().v().end()); break;
      case proto::Attribute::kFloats: v = std::vector<double>(a.floats().v().begin(), a.floats().v().end()); break;
      case proto::Attribute::kStrings:
        v = std::vector<std::string>(a.strings().v().begin(), a.strings().v().end());
        break;
      case proto::Attribute::kT: {
        auto t = tensorFromProto(a.t(), where + " attribute '" + a.name() + "'");
        if (!t) return t.error();
        v = std::move(*t);
        break;
      }
      default: return Error{where + ": attribute '" + a.name() + "' has no value"};
      }
      n.attrs.emplace(a.name(), std::move(v));
    }
    g.addNode(std::move(n));
  }
  g.loss = g.findValue(p.loss());
  if (g.loss == ir::kNoValue) return Error{"graph.loss: '" + p.loss() + "' is not a value of the graph"};
  // Training reduces the loss to one number: an edited plan must not train on a tensor.
  if (const ir::Value &loss = g.values[g.loss];
      (loss.dtype != ir::DType::Undefined && !ir::isFloating(loss.dtype)) || (loss.shape_known && !loss.shape.empty()))
    return Error{"graph.loss: '" + p.loss() + "' is " + std::string(ir::dtypeName(loss.dtype)) + " " +
                 ir::shapeString(loss.shape) + ", the loss must be a scalar float"};
  std::string problem = g.verify();
  if (!problem.empty()) return Error{"graph: " + problem};
  return g;
}

proto::Cluster clusterToProto(const cluster::ClusterSpec &c) {
  proto::Cluster p;
  p.set_num_nodes(c.num_nodes);
  p.set_devices_per_node(c.devices_per_node);
  auto *d = p.mutable_device();
  d->set_type(c.device.type);
  d->set_name(c.device.name);
  d->set_memory_bytes(c.device.memory_bytes);
  d->set_peak_flops(c.device.peak_flops);
  d->set_memory_bandwidth(c.device.memory_bandwidth);
  d->set_compute_efficiency(c.device.compute_efficiency);
  d->set_memory_efficiency(c.device.memory_efficiency);
  d->set_op_overhead_s(c.device.op_overhead_s);
  d->set_peak_flops_tf32(c.device.peak_flops_tf32);
  d->set_peak_flops_fp16(c.device.peak_flops_fp16);
  d->set_peak_flops_bf16(c.device.peak_flops_bf16);
  d->set_runtime_reserve_bytes(c.device.runtime_reserve_bytes);
  p.mutable_intra_node()->set_bandwidth(c.intra_node.bandwidth);
  p.mutable_intra_node()->set_latency_s(c.intra_node.latency_s);
  p.mutable_inter_node()->set_bandwidth(c.inter_node.bandwidth);
  p.mutable_inter_node()->set_latency_s(c.inter_node.latency_s);
  return p;
}

cluster::ClusterSpec clusterFromProto(const proto::Cluster &p) {
  cluster::ClusterSpec c;
  c.num_nodes = p.num_nodes();
  c.devices_per_node = p.devices_per_node();
  c.device = {p.device().type(), p.device().name(), p.device().memory_bytes(), p.device().peak_flops(),
              p.device().memory_bandwidth()};
  if (p.device().compute_efficiency() > 0) c.device.compute_efficiency = p.device().compute_efficiency();
  if (p.device().memory_efficiency() > 0) c.device.memory_efficiency = p.device().memory_efficiency();
  if (p.device().has_op_overhead_s()) c.device.op_overhead_s = p.device().op_overhead_s();
  c.device.peak_flops_tf32 = p.device().peak_flops_tf32();
  c.device.peak_flops_fp16 = p.device().peak_flops_fp16();
  c.device.peak_flops_bf16 = p.device().peak_flops_bf16();
  c.device.runtime_reserve_bytes = p.device().runtime_reserve_bytes();
  c.intra_node = {p.intra_node().bandwidth(), p.intra_node().latency_s()};
  c.inter_node = {p.inter_node().bandwidth(), p.inter_node().latency_s()};
  return c;
}

proto::Schedule scheduleToProto(pipeline::Schedule s) {
  switch (s) {
  case pipeline::Schedule::GPipe: return proto::GPIPE;
  case pipeline::Schedule::OneFOneB: return proto::ONE_F_ONE_B;
  case pipeline::Schedule::ZBH1: return proto::ZB_H1;
  case pipeline::Schedule::ZBH2: return proto::ZB_H2;
  case pipeline::Schedule::Interleaved1F1B: return proto::INTERLEAVED_1F1B;
  }
  return proto::SCHEDULE_UNSPECIFIED;
}

Expected<pipeline::Schedule> scheduleFromProto(proto::Schedule s) {
  for (pipeline::Schedule known : pipeline::kSchedules)
    if (scheduleToProto(known) == s) return known;
  auto protoName = [](pipeline::Schedule k) { return proto::Schedule_Name(scheduleToProto(k)).c_str(); };
  return Error{"schedule: must be " + pipeline::scheduleChoices(protoName)};
}

Expected<std::string> encodePlan(const proto::Plan &plan, const std::string &ext) {
  std::string out;
  if (ext == ".pb") {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    if (!plan.SerializeToCodedStream(&coded)) return Error{"plan serialization failed"};
  } else if (ext == ".pbtxt") {
    if (!google::protobuf::TextFormat::PrintToString(plan, &out)) return Error{"plan text printing failed"};
  } else if (ext == ".json") {
    google::protobuf::util::JsonPrintOptions opts;
    opts.add_whitespace = true;
    opts.preserve_proto_field_names = true;
    auto st = google::protobuf::util::MessageToJsonString(plan, &out, opts);
    if (!st.ok()) return Error{"plan JSON printing failed: " + st.ToString()};
  } else {
    return Error{"unknown plan extension '" + ext + "' (use .pb, .pbtxt or .json)"};
  }
  return out;
}

std::vector<VersionedField> versionedFields(const proto::Plan &plan) {
  std::vector<VersionedField> out;
  if (plan.precision() == "bf16" || plan.precision() == "fp16")
    out.push_back({"precision: " + plan.precision(), 2, "run it in fp32"});
  if (!plan.batchnorm().empty()) // Note [batch statistics]
    out.push_back({"batchnorm: " + plan.batchnorm(), 4, "normalise over each replica's samples alone"});
  if (plan.virtual_stages() > 1) // Note [interleaved 1F1B]
    out.push_back({"virtual_stages: " + std::to_string(plan.virtual_stages()), 5,
                   "refuse its ranks for being in several stages"});
  for (int i = 0; i < plan.stages_size(); ++i) {
    const proto::Stage &s = plan.stages(i);
    const std::string where = "stages[" + std::to_string(i) + "]";
    if (s.zero() != 0)
      out.push_back({where + ".zero: " + std::to_string(s.zero()), 2,
                     "keep the whole optimizer state on every replica, beyond the planned memory"});
    if (s.recompute())
      out.push_back({where + ".recompute: true", 2, "keep every activation, beyond the planned memory"});
    if (s.tensor_parallel() > 1)
      out.push_back({where + ".tensor_parallel: " + std::to_string(s.tensor_parallel()), 3,
                     "run each of its ranks as a whole replica of the stage"});
  }
  std::string first;
  int64_t layouts = 0;
  for (int n = 0; n < plan.graph().ops_size(); ++n) {
    const proto::Op &op = plan.graph().ops(n);
    for (int k = 0; k < op.outputs_size(); ++k)
      if (op.outputs(k).batch_blocks() != 0 && layouts++ == 0)
        first = "graph.ops[" + std::to_string(n) + "].outputs[" + std::to_string(k) +
                "].batch_blocks: " + std::to_string(op.outputs(k).batch_blocks());
  }
  if (layouts > 0)
    out.push_back({first + (layouts > 1 ? " (and " + std::to_string(layouts - 1) + " more op outputs)" : ""), 2,
                   "split such values between replicas as if each sample's rows were contiguous"});
  return out;
}

uint32_t requiredFormatVersion(const proto::Plan &plan) {
  uint32_t v = 1;
  for (const auto &f : versionedFields(plan)) v = std::max(v, f.version);
  return v;
}

Expected<proto::Plan> decodePlan(const std::string &bytes, const std::string &ext, const std::string &path);

namespace {

bool validUtf8(const std::string &s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    i += n;
  }
  return true;
}

/// The path of the first string field under `m` that is not valid UTF-8 ("" if none): protobuf
/// writes such a plan but refuses to read it back.
std::string firstNonUtf8(const google::protobuf::Message &m, const std::string &where) {
  using google::protobuf::FieldDescriptor;
  const auto *refl = m.GetReflection();
  std::vector<const FieldDescriptor *> fields;
  refl->ListFields(m, &fields);
  for (const FieldDescriptor *f : fields) {
    const std::string name = where.empty() ? f->name() : where + "." + f->name();
    const int n = f->is_repeated() ? refl->FieldSize(m, f) : 1;
    for (int i = 0; i < n; ++i) {
      const std::string at = f->is_repeated() ? name + "[" + std::to_string(i) + "]" : name;
      if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
        const auto &sub = f->is_repeated() ? refl->GetRepeatedMessage(m, f, i) : refl->GetMessage(m, f);
        if (std::string bad = firstNonUtf8(sub, at); !bad.empty()) return bad;
      } else if (f->type() == FieldDescriptor::TYPE_STRING) {
        if (!validUtf8(f->is_repeated() ? refl->GetRepeatedString(m, f, i) : refl->GetString(m, f))) return at;
      }
    }
  }
  return "";
}

} // namespace

Status writePlan(const proto::Plan &plan, const std::string &path) {
  // Every plan written reads back (Note [hostile inputs]): a model's names
  // need not be UTF-8, a plan's strings must be.
  if (std::string bad = firstNonUtf8(plan, ""); !bad.empty())
    return Error{path + ": " + bad + " is not valid UTF-8 (a name in the model?); rename it in the model"};
  // A hand edit may have turned a newer field on (Note [plan format versions]);
  // version 0 is no version at all, left for check to report.
  const uint32_t needed = requiredFormatVersion(plan);
  const bool raise = plan.format_version() >= 1 && plan.format_version() < needed;
  proto::Plan raised;
  if (raise) {
    raised = plan;
    raised.set_format_version(needed);
  }
  auto bytes = encodePlan(raise ? raised : plan, extensionOf(path));
  if (!bytes) return Error{path + ": " + bytes.error().message};
  if (auto back = decodePlan(*bytes, extensionOf(path), path); !back)
    return Error{"the plan would not read back, so it was not written: " + back.error().message};
  return writeFileAtomic(path, *bytes);
}

namespace {
/// Collects text-format parse errors with their line numbers.
class TextErrors : public google::protobuf::io::ErrorCollector {
public:
  void AddError(int line, int column, const std::string &message) override {
    if (first.empty()) first = "line " + std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
  }
  std::string first;
};
} // namespace

Expected<proto::Plan> decodePlan(const std::string &bytes, const std::string &ext, const std::string &path) {
  proto::Plan plan;
  if (ext == ".pb") {
    if (!plan.ParseFromString(bytes)) return Error{path + ": not a valid binary plan (protobuf parse failed)"};
  } else if (ext == ".pbtxt") {
    google::protobuf::TextFormat::Parser parser;
    TextErrors errors;
    parser.RecordErrorsTo(&errors);
    if (!parser.ParseFromString(bytes, &plan)) return Error{path + ":" + errors.first};
  } else if (ext == ".json") {
    auto st = google::protobuf::util::JsonStringToMessage(bytes, &plan);
    if (!st.ok()) return Error{path + ": not a valid JSON plan: " + st.ToString()};
  } else {
    return Error{path + ": unknown plan extension '" + ext + "' (use .pb, .pbtxt or .json)"};
  }
  return plan;
}

Expected<proto::Plan> readPlan(const std::string &path) {
  auto bytes = readFile(path);
  if (!bytes) return bytes.error();
  auto plan = decodePlan(*bytes, extensionOf(path), path);
  if (plan && plan->format_version() > kFormatVersion)
    return Error{path + ": format_version: " + std::to_string(plan->format_version()) +
                 " is newer than this rannc understands (it reads 1.." + std::to_string(kFormatVersion) +
                 "); upgrade rannc or re-plan"};
  return plan;
}

int worldSize(const proto::Plan &plan) {
  int n = 0;
  for (const auto &s : plan.stages()) n += s.ranks_size();
  return n / virtualStages(plan); // each rank in that many stages (Note [interleaved 1F1B])
}

int virtualStages(const proto::Plan &plan) { return std::max(1, plan.virtual_stages()); }

int pipelineRanks(const proto::Plan &plan) { return plan.stages_size() / virtualStages(plan); }

int tensorParallel(const proto::Stage &s) { return s.tensor_parallel() > 0 ? s.tensor_parallel() : 1; }

int stageReplicas(const proto::Stage &s) { return s.ranks_size() / tensorParallel(s); }

} // namespace rannc::plan
