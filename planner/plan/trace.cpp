#include "planner/plan/trace.h"

#include <nlohmann/json.hpp>

#include <cmath>

namespace rannc::plan {

namespace {

/// Note [trace lanes]: a kind's category, and what its receive or send carries.
struct KindRow {
  TraceKind kind;
  const char *category;
  const char *what; ///< args["what"]; null: none
};
const KindRow kTraceKinds[] = {
    {TraceKind::Forward, "forward", nullptr},
    {TraceKind::Backward, "backward", nullptr},
    {TraceKind::BackwardWeight, "backward", "weights"},
    {TraceKind::Recompute, "recompute", nullptr},
    {TraceKind::RecvActivations, "recv", "activations"},
    {TraceKind::RecvGradients, "recv", "gradients"},
    {TraceKind::SendActivations, "send", "activations"},
    {TraceKind::SendGradients, "send", "gradients"},
    {TraceKind::AllReduce, "all-reduce", nullptr},
    {TraceKind::Optimizer, "optimizer", nullptr},
    {TraceKind::Idle, "idle", nullptr},
};

const KindRow &rowOf(TraceKind k) {
  for (const KindRow &r : kTraceKinds)
    if (r.kind == k) return r;
  return kTraceKinds[0]; // every kind has a row
}

} // namespace

const char *traceCategory(TraceKind k) { return rowOf(k).category; }

TraceEvent traceEvent(TraceKind k, int rank, int stage, int microbatch, double start_s, double duration_s) {
  const KindRow &row = rowOf(k);
  TraceEvent e;
  e.pid = rank;
  e.category = row.category;
  e.name = row.category;
  e.numbers["stage"] = stage;
  if (microbatch >= 0) {
    e.name += " " + std::to_string(microbatch);
    e.numbers["microbatch"] = microbatch;
  }
  if (row.what) e.args["what"] = row.what;
  e.start_s = start_s;
  e.duration_s = duration_s;
  return e;
}

TraceEvent memoryCounter(int rank, int stage, double at_s, int64_t bytes) {
  TraceEvent e;
  e.pid = rank;
  e.name = "memory";
  e.category = "memory";
  e.start_s = at_s;
  e.numbers["bytes"] = bytes;
  (void)stage; // a counter's args are its series: the stage is the process's
  e.counter = true;
  return e;
}

std::string traceProcessName(int rank, int stage) {
  return "rank " + std::to_string(rank) + " (stage " + std::to_string(stage) + ")";
}

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
    j["ph"] = e.counter ? "C" : "X";
    j["pid"] = e.pid;
    j["tid"] = e.tid;
    j["ts"] = us(e.start_s);
    if (!e.counter) j["dur"] = us(e.duration_s);
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

Expected<Trace> readChromeTrace(const std::string &text, const std::string &what) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Error{what + ": not JSON (a Chrome trace from rannc-exec --trace was expected)"};
  // Both forms of the format: {"traceEvents": [...]} and a bare array.
  const nlohmann::json *events = j.is_array() ? &j : nullptr;
  if (j.is_object() && j.contains("traceEvents") && j["traceEvents"].is_array()) events = &j["traceEvents"];
  if (!events) return Error{what + ": no \"traceEvents\" array: not a Chrome trace"};
  Trace t;
  size_t i = 0;
  try {
    for (; i < events->size(); ++i) {
      const nlohmann::json &e = (*events)[i];
      const std::string ph = e.value("ph", "");
      if (ph == "M") {
        if (e.value("name", "") == "process_name") t.process_names[e.at("pid").get<int>()] = e.at("args").at("name");
        continue;
      }
      if (ph != "X" && ph != "C") continue; // other phases: not ours, and harmless
      TraceEvent ev;
      ev.counter = ph == "C";
      ev.pid = e.at("pid").get<int>();
      ev.tid = e.value("tid", 0);
      ev.name = e.value("name", "");
      ev.category = e.value("cat", ev.counter ? ev.name : "");
      ev.start_s = e.at("ts").get<double>() * 1e-6;
      ev.duration_s = ev.counter ? 0.0 : e.at("dur").get<double>() * 1e-6;
      if (e.contains("args"))
        for (const auto &[k, v] : e["args"].items()) {
          if (v.is_number()) ev.numbers[k] = v.get<int64_t>();
          else if (v.is_string()) ev.args[k] = v.get<std::string>();
        }
      t.events.push_back(std::move(ev));
    }
  } catch (const nlohmann::json::exception &e) {
    return Error{what + ": traceEvents[" + std::to_string(i) + "]: " + e.what()};
  }
  return t;
}

} // namespace rannc::plan
