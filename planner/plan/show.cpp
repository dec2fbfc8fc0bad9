#include "planner/plan/show.h"

#include <nlohmann/json.hpp>

#include <iomanip>
#include <sstream>

#include "planner/plan/plan.h"

namespace rannc::plan {
namespace {

std::string mib(int64_t bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << double(bytes) / (1 << 20);
  return os.str();
}

std::string ms(double s) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(3) << s * 1e3;
  return os.str();
}

std::string rankList(const proto::Stage &s) {
  std::string r;
  for (int x : s.ranks()) r += (r.empty() ? "" : ",") + std::to_string(x);
  return r;
}

} // namespace

const char *scheduleName(proto::Schedule s) {
  switch (s) {
  case proto::GPIPE: return "gpipe";
  case proto::ONE_F_ONE_B: return "1f1b";
  default: return "unspecified";
  }
}

void printPlanTable(const proto::Plan &plan, std::ostream &os) {
  const auto &ops = plan.graph().ops();
  os << "model       " << plan.model().path() << " (sha256 " << plan.model().sha256().substr(0, 12) << ")\n";
  os << "cluster     " << plan.cluster().num_nodes() << " node(s) x " << plan.cluster().devices_per_node() << " "
     << plan.cluster().device().name() << "\n";
  os << "world size  " << worldSize(plan) << ", " << plan.stages_size() << " stage(s), batch "
     << plan.global_batch_size() << " in " << plan.microbatches() << " micro-batch(es), schedule "
     << scheduleName(plan.schedule()) << ", planner " << plan.planner() << "\n\n";
  os << std::left << std::setw(6) << "stage" << std::setw(8) << "ranks" << std::setw(7) << "ops" << std::setw(28)
     << "first op" << std::setw(28) << "last op" << std::right << std::setw(11) << "params" << std::setw(10)
     << "mem MiB" << std::setw(10) << "cap MiB" << std::setw(10) << "fwd ms" << std::setw(10) << "bwd ms" << "\n";
  for (const auto &s : plan.stages()) {
    auto name = [&](int i) -> std::string {
      if (i < 0 || i >= ops.size()) return "?";
      std::string n = ops[i].name();
      return n.size() > 26 ? n.substr(0, 12) + ".." + n.substr(n.size() - 12) : n;
    };
    const auto &e = s.estimates();
    os << std::left << std::setw(6) << s.id() << std::setw(8) << rankList(s) << std::setw(7)
       << (s.op_end() - s.op_begin()) << std::setw(28) << name(s.op_begin()) << std::setw(28) << name(s.op_end() - 1)
       << std::right << std::setw(11) << e.num_params() << std::setw(10) << mib(e.peak_memory_bytes())
       << std::setw(10) << mib(e.memory_capacity_bytes()) << std::setw(10) << ms(e.fwd_time_s()) << std::setw(10)
       << ms(e.bwd_time_s()) << "\n";
  }
  os << "\npredicted step time " << ms(plan.estimates().step_time_s()) << " ms";
  if (plan.estimates().step_time_s() > 0)
    os << " (" << std::fixed << std::setprecision(1) << plan.global_batch_size() / plan.estimates().step_time_s()
       << " samples/s)";
  os << "\n";
}

void printPlanJson(const proto::Plan &plan, std::ostream &os) {
  nlohmann::ordered_json j;
  j["world_size"] = worldSize(plan);
  j["num_stages"] = plan.stages_size();
  j["global_batch_size"] = plan.global_batch_size();
  j["microbatches"] = plan.microbatches();
  j["schedule"] = scheduleName(plan.schedule());
  j["predicted_step_time_s"] = plan.estimates().step_time_s();
  j["model"] = plan.model().path();
  j["model_sha256"] = plan.model().sha256();
  j["device"] = plan.cluster().device().name();
  j["planner"] = plan.planner();
  j["stages"] = nlohmann::ordered_json::array();
  for (const auto &s : plan.stages()) {
    const auto &e = s.estimates();
    nlohmann::ordered_json st;
    st["id"] = s.id();
    st["ranks"] = std::vector<int>(s.ranks().begin(), s.ranks().end());
    st["num_ops"] = s.op_end() - s.op_begin();
    st["op_begin"] = s.op_begin();
    st["op_end"] = s.op_end();
    st["num_params"] = e.num_params();
    st["param_bytes"] = e.param_bytes();
    st["grad_bytes"] = e.grad_bytes();
    st["optimizer_bytes"] = e.optimizer_bytes();
    st["activation_bytes"] = e.activation_bytes();
    st["buffer_bytes"] = e.buffer_bytes();
    st["peak_memory_bytes"] = e.peak_memory_bytes();
    st["memory_capacity_bytes"] = e.memory_capacity_bytes();
    st["fwd_time_s"] = e.fwd_time_s();
    st["bwd_time_s"] = e.bwd_time_s();
    j["stages"].push_back(std::move(st));
  }
  os << j.dump(2) << "\n";
}

} // namespace rannc::plan
