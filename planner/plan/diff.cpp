#include "planner/plan/diff.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>
#include <string>

#include "planner/plan/plan.h"
#include "planner/plan/show.h"

namespace rannc::plan {
namespace {

std::string change(double a, double b) {
  if (a == 0) return "";
  std::ostringstream os;
  os << " (" << std::showpos << std::fixed << std::setprecision(1) << (b - a) / a * 100 << "%)";
  return os.str();
}

std::string ranks(const proto::Stage &s) {
  std::string r = "[";
  for (int i = 0; i < s.ranks_size(); ++i) r += (i ? ", " : "") + std::to_string(s.ranks(i));
  return r + "]";
}

std::string range(const proto::Stage &s) {
  return "[" + std::to_string(s.op_begin()) + ", " + std::to_string(s.op_end()) + ")";
}

std::string opName(const proto::Plan &p, int i) {
  return i >= 0 && i < p.graph().ops_size() ? "'" + p.graph().ops(i).name() + "'" : "?";
}

/// Deterministic bytes of a sub-message, for equality.
std::string serialized(const google::protobuf::Message &m) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    m.SerializeToCodedStream(&coded);
  }
  return out;
}

class Differ {
public:
  Differ(const proto::Plan &a, const proto::Plan &b, std::ostream &os) : a_(a), b_(b), os_(os) {}

  void run() {
    value("format_version", a_.format_version(), b_.format_version());
    value("global_batch_size", a_.global_batch_size(), b_.global_batch_size());
    value("microbatches", a_.microbatches(), b_.microbatches());
    text("schedule", scheduleName(a_.schedule()), scheduleName(b_.schedule()));
    value("stages", a_.stages_size(), b_.stages_size());
    value("world size", worldSize(a_), worldSize(b_));
    const int common = std::min(a_.stages_size(), b_.stages_size());
    for (int i = 0; i < common; ++i) stageDecisions(i);
    for (int i = common; i < a_.stages_size(); ++i)
      os_ << "stage " << i << ": removed (was ops " << range(a_.stages(i)) << ", ranks " << ranks(a_.stages(i))
          << ")\n";
    for (int i = common; i < b_.stages_size(); ++i)
      os_ << "stage " << i << ": added (ops " << range(b_.stages(i)) << ", ranks " << ranks(b_.stages(i)) << ")\n";
    for (int i = 0; i < common; ++i) stageEstimates(i);
    time("step time", a_.estimates().step_time_s(), b_.estimates().step_time_s());
    const double sa = a_.estimates().step_time_s(), sb = b_.estimates().step_time_s();
    if (sa > 0 && sb > 0 && sa != sb)
      os_ << "samples/s: " << std::fixed << std::setprecision(1) << a_.global_batch_size() / sa << " -> "
          << b_.global_batch_size() / sb << change(a_.global_batch_size() / sa, b_.global_batch_size() / sb) << "\n";
    text("optimizer", a_.estimates().optimizer(), b_.estimates().optimizer());
    text("planner", a_.planner(), b_.planner());
    text("model.path", a_.model().path(), b_.model().path());
    text("model.sha256", a_.model().sha256(), b_.model().sha256());
    if (serialized(a_.cluster()) != serialized(b_.cluster()))
      os_ << "cluster: " << clusterText(a_) << " -> " << clusterText(b_) << "\n";
    graph();
  }

private:
  template <typename T> void value(const std::string &what, T a, T b) {
    if (a != b) os_ << what << ": " << a << " -> " << b << "\n";
  }
  void text(const std::string &what, const std::string &a, const std::string &b) {
    if (a != b) os_ << what << ": " << (a.empty() ? "(none)" : a) << " -> " << (b.empty() ? "(none)" : b) << "\n";
  }
  void time(const std::string &what, double a, double b) {
    if (a != b) os_ << what << ": " << timeText(a) << " -> " << timeText(b) << change(a, b) << "\n";
  }
  void bytes(const std::string &what, int64_t a, int64_t b) {
    if (a != b) os_ << what << ": " << bytesText(double(a)) << " -> " << bytesText(double(b)) << change(a, b) << "\n";
  }

  void stageDecisions(int i) {
    const auto &x = a_.stages(i), &y = b_.stages(i);
    const std::string stage = "stage " + std::to_string(i);
    if (x.op_begin() != y.op_begin() || x.op_end() != y.op_end()) {
      const int dn = (y.op_end() - y.op_begin()) - (x.op_end() - x.op_begin());
      os_ << stage << ": ops " << range(x) << " -> " << range(y) << " (" << (dn >= 0 ? "+" : "") << dn << " ops";
      if (x.op_begin() != y.op_begin()) os_ << ", now starts at " << opName(b_, y.op_begin());
      if (x.op_end() != y.op_end()) os_ << ", now ends at " << opName(b_, y.op_end() - 1);
      os_ << ")\n";
    }
    if (ranks(x) != ranks(y)) {
      os_ << stage << ": ranks " << ranks(x) << " -> " << ranks(y);
      if (stageReplicas(x) != stageReplicas(y))
        os_ << " (replicas " << stageReplicas(x) << " -> " << stageReplicas(y) << ")";
      os_ << "\n";
    }
    if (tensorParallel(x) != tensorParallel(y))
      os_ << stage << ": tensor_parallel " << tensorParallel(x) << " -> " << tensorParallel(y) << "\n";
  }

  void stageEstimates(int i) {
    const auto &x = a_.stages(i).estimates(), &y = b_.stages(i).estimates();
    const std::string stage = "stage " + std::to_string(i) + ": ";
    time(stage + "forward", x.fwd_time_s(), y.fwd_time_s());
    time(stage + "backward", x.bwd_time_s(), y.bwd_time_s());
    time(stage + "all-reduce", x.allreduce_time_s(), y.allreduce_time_s());
    value(stage + "parameters", x.num_params(), y.num_params());
    bytes(stage + "peak memory", x.peak_memory_bytes(), y.peak_memory_bytes());
    bytes(stage + "parameter memory", x.param_bytes(), y.param_bytes());
    bytes(stage + "gradient memory", x.grad_bytes(), y.grad_bytes());
    bytes(stage + "optimizer state", x.optimizer_bytes(), y.optimizer_bytes());
    bytes(stage + "activations", x.activation_bytes(), y.activation_bytes());
    bytes(stage + "working memory", x.working_bytes(), y.working_bytes());
    bytes(stage + "recompute stash", x.recompute_stash_bytes(), y.recompute_stash_bytes());
    bytes(stage + "buffers", x.buffer_bytes(), y.buffer_bytes());
    bytes(stage + "memory capacity", x.memory_capacity_bytes(), y.memory_capacity_bytes());
  }

  static std::string clusterText(const proto::Plan &p) {
    const auto &c = p.cluster();
    return std::to_string(c.num_nodes()) + "x" + std::to_string(c.devices_per_node()) + " " + c.device().name() + " (" +
           bytesText(double(c.device().memory_bytes())) + ")";
  }

  void graph() {
    const auto &x = a_.graph(), &y = b_.graph();
    if (serialized(x) == serialized(y)) return;
    value("graph ops", x.ops_size(), y.ops_size());
    value("graph values", x.values_size(), y.values_size());
    const int n = std::min(x.ops_size(), y.ops_size());
    for (int i = 0; i < n; ++i)
      if (serialized(x.ops(i)) != serialized(y.ops(i))) {
        os_ << "graph: first differing op is graph.ops[" << i << "] ('" << x.ops(i).name() << "' -> '"
            << y.ops(i).name() << "')\n";
        return;
      }
    if (x.ops_size() == y.ops_size()) os_ << "graph: the value declarations or the loss differ\n";
  }

  const proto::Plan &a_, &b_;
  std::ostream &os_;
};

} // namespace

bool printPlanDiff(const proto::Plan &a, const proto::Plan &b, std::ostream &os) {
  if (*encodePlan(a, ".pb") == *encodePlan(b, ".pb")) {
    os << "plans are identical\n";
    return true;
  }
  std::ostringstream body;
  Differ(a, b, body).run();
  os << (body.str().empty() ? "plans differ only in fields diff does not show\n" : body.str());
  return false;
}

} // namespace rannc::plan
