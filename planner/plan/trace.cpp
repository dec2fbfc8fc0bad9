#include "planner/plan/trace.h"

#include <nlohmann/json.hpp>

#include <cmath>

namespace rannc::plan {

void writeChromeTrace(const std::vector<TraceEvent> &events, const std::map<int, std::string> &process_names,
                      std::ostream &os) {
  // Microseconds rounded to nanoseconds: exact enough, and stable text.
  auto us = [](double s) { return std::round(s * 1e9) / 1e3; };
  nlohmann::ordered_json trace;
  trace["traceEvents"] = nlohmann::ordered_json::array();
  auto &out = trace["traceEvents"];
  for (const auto &[pid, name] : process_names) {
    nlohmann::ordered_json m;
    m["name"] = "process_name";
    m["ph"] = "M";
    m["pid"] = pid;
    m["tid"] = 0;
    m["args"] = {{"name", name}};
    out.push_back(std::move(m));
    nlohmann::ordered_json order;
    order["name"] = "process_sort_index";
    order["ph"] = "M";
    order["pid"] = pid;
    order["tid"] = 0;
    order["args"] = {{"sort_index", pid}};
    out.push_back(std::move(order));
  }
  for (const TraceEvent &e : events) {
    nlohmann::ordered_json j;
    j["name"] = e.name;
    j["cat"] = e.category;
    j["ph"] = "X";
    j["pid"] = e.pid;
    j["tid"] = e.tid;
    j["ts"] = us(e.start_s);
    j["dur"] = us(e.duration_s);
    if (!e.args.empty() || !e.numbers.empty()) {
      nlohmann::ordered_json args = nlohmann::ordered_json::object();
      for (const auto &[k, v] : e.numbers) args[k] = v;
      for (const auto &[k, v] : e.args) args[k] = v;
      j["args"] = std::move(args);
    }
    out.push_back(std::move(j));
  }
  // One event per line: compact for long traces, still readable and diffable.
  os << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  for (size_t i = 0; i < out.size(); ++i) os << "  " << out[i].dump() << (i + 1 < out.size() ? ",\n" : "\n");
  os << "]}\n";
}

} // namespace rannc::plan
