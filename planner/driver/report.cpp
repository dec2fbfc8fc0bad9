#include "planner/driver/report.h"

#include <algorithm>
#include <iomanip>
#include <map>
#include <sstream>
#include <vector>

#include "planner/driver/compare.h"
#include "planner/plan/dot.h"
#include "planner/plan/plan.h"
#include "planner/plan/show.h"
#include "planner/plan/trace.h"
#include "planner/support/files.h"

namespace rannc::planner {
namespace {

std::string esc(const std::string &s) {
  std::string o;
  for (char c : s) switch (c) {
    case '&': o += "&amp;"; break;
    case '<': o += "&lt;"; break;
    case '>': o += "&gt;"; break;
    case '"': o += "&quot;"; break;
    default: o += c;
    }
  return o;
}

std::string num(double v, int decimals = 1) { return plan::formatFixed(v, decimals); }

/// Note [trace lanes]: one colour per category, the same in both timelines.
const char *colourOf(const std::string &category) {
  static const std::map<std::string, const char *> kColours = {
      {"forward", "#4e79a7"},    {"backward", "#f28e2b"},  {"recompute", "#edc948"}, {"recv", "#76b7b2"},
      {"send", "#59a14f"},       {"all-reduce", "#e15759"}, {"optimizer", "#b07aa1"}, {"idle", "#dddddd"}};
  auto it = kColours.find(category);
  return it == kColours.end() ? "#9c755f" : it->second; // a kind added later still draws
}

const char *kStyle = R"(
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:1.4em;margin-bottom:.2em} h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em} td,th{padding:3px 9px;border-bottom:1px solid #eee;text-align:right}
th{background:#f5f5f5} td.l,th.l{text-align:left} table.kv td:first-child{text-align:left;color:#666}
.legend span{display:inline-block;margin-right:14px;font-size:.85em}
.legend i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px}
svg text{font-size:11px;fill:#333} svg rect.ev{stroke:#fff;stroke-width:.5}
svg rect.ev.hl{stroke:#000;stroke-width:1.5} .note{color:#666;font-size:.85em}
.bad{color:#b00}
)";

const char *kScript = R"(
(function () {
  // Hovering an action outlines its micro-batch on every rank of that timeline.
  document.querySelectorAll('svg.timeline').forEach(function (svg) {
    svg.querySelectorAll('rect[data-mb]').forEach(function (r) {
      var same = svg.querySelectorAll('rect[data-mb="' + r.getAttribute('data-mb') + '"]');
      r.addEventListener('mouseenter', function () { same.forEach(function (s) { s.classList.add('hl'); }); });
      r.addEventListener('mouseleave', function () { same.forEach(function (s) { s.classList.remove('hl'); }); });
    });
  });
  // Last: what the page's test reads to know the script ran to its end.
  document.body.setAttribute('data-rendered', String(document.querySelectorAll('#stage-table tbody tr').length));
})();
)";

void legend(const std::vector<std::string> &categories, std::ostream &os) {
  os << "<div class=\"legend\">";
  for (const std::string &c : categories)
    os << "<span><i style=\"background:" << colourOf(c) << "\"></i>" << esc(c) << "</span>";
  os << "</div>\n";
}

/// One step's actions, a lane per rank, from 0 to `span_s`.
void timelineSvg(const std::vector<plan::TraceEvent> &events, const std::map<int, std::string> &names, double span_s,
                 const std::string &kind, std::ostream &os) {
  const double left = 130, width = 960, lane = 20, gap = 6, top = 8;
  const double scale = span_s > 0 ? (width - left - 10) / span_s : 0;
  const double height = top + double(names.size()) * (lane + gap) + 24;
  std::map<int, int> row;
  for (const auto &[pid, name] : names) row.emplace(pid, int(row.size()));
  os << "<svg class=\"timeline\" data-kind=\"" << kind << "\" width=\"" << width << "\" height=\"" << height
     << "\" viewBox=\"0 0 " << width << " " << height << "\" xmlns=\"http://www.w3.org/2000/svg\">\n";
  for (const auto &[pid, r] : row)
    os << "<text x=\"4\" y=\"" << num(top + r * (lane + gap) + lane * 0.7) << "\">" << esc(names.at(pid))
       << "</text>\n";
  std::vector<std::string> seen;
  for (const plan::TraceEvent &e : events) {
    if (e.counter || !row.count(e.pid)) continue;
    const double x = left + e.start_s * scale, w = std::max(0.5, e.duration_s * scale);
    const double y = top + row.at(e.pid) * (lane + gap);
    os << "<rect class=\"ev\" data-cat=\"" << esc(e.category) << "\"";
    if (e.numbers.count("microbatch")) os << " data-mb=\"" << e.numbers.at("microbatch") << "\"";
    os << " x=\"" << num(x, 2) << "\" y=\"" << num(y) << "\" width=\"" << num(w, 2) << "\" height=\"" << lane
       << "\" fill=\"" << colourOf(e.category) << "\"><title>" << esc(names.at(e.pid) + ": " + e.name) << ", "
       << esc(plan::timeText(e.duration_s)) << " at " << esc(plan::timeText(e.start_s)) << "</title></rect>\n";
  }
  const double axis = top + double(names.size()) * (lane + gap) + 4;
  os << "<line x1=\"" << left << "\" x2=\"" << width - 10 << "\" y1=\"" << axis << "\" y2=\"" << axis
     << "\" stroke=\"#999\"/>\n";
  for (int i = 0; i <= 5; ++i) {
    const double t = span_s * i / 5;
    os << "<text x=\"" << num(left + t * scale) << "\" y=\"" << num(axis + 14) << "\" text-anchor=\""
       << (i == 0 ? "start" : i == 5 ? "end" : "middle") << "\">" << esc(plan::timeText(t)) << "</text>\n";
  }
  os << "</svg>\n";
}

/// The categories present in `events`, in Note [trace lanes]'s order.
std::vector<std::string> categoriesOf(const std::vector<plan::TraceEvent> &events) {
  std::vector<std::string> out;
  for (const char *c : {"forward", "backward", "recompute", "recv", "send", "all-reduce", "optimizer", "idle"})
    if (std::any_of(events.begin(), events.end(), [&](const plan::TraceEvent &e) { return e.category == c; }))
      out.push_back(c);
  return out;
}

void summary(const proto::Plan &plan, const std::string &path, std::ostream &os) {
  const auto &c = plan.cluster();
  const double step = plan.estimates().step_time_s();
  auto kv = [&](const std::string &k, const std::string &v) {
    os << "<tr><td>" << esc(k) << "</td><td class=\"l\">" << esc(v) << "</td></tr>\n";
  };
  os << "<table class=\"kv\" id=\"summary\">\n";
  kv("model", plan.model().path() + " (" + plan.model().format() + ", sha256 " + plan.model().sha256().substr(0, 12) +
                  "...)");
  kv("cluster", std::to_string(c.num_nodes()) + " node(s) x " + std::to_string(c.devices_per_node()) + " " +
                    c.device().name() + " (" + plan::bytesText(double(c.device().memory_bytes())) + " each)");
  kv("ranks", std::to_string(plan::worldSize(plan)) + " in " + std::to_string(plan.stages_size()) + " stage(s)");
  kv("batch", std::to_string(plan.global_batch_size()) + " in " + std::to_string(plan.microbatches()) +
                  " micro-batch(es), " + plan::scheduleName(plan.schedule()));
  kv("precision, optimizer", (plan.precision().empty() ? "fp32" : plan.precision()) + ", " +
                                 (plan.estimates().optimizer().empty() ? "adam" : plan.estimates().optimizer()));
  kv("predicted step", plan::timeText(step) + (step > 0 ? ", " + num(plan.global_batch_size() / step) + " samples/s"
                                                        : std::string()));
  kv("pipeline bubble", num(plan::pipelineBubbleFraction(plan) * 100) + "%");
  kv("planner", plan.planner());
  kv("file", path);
  os << "</table>\n";
}

void stageTable(const proto::Plan &plan, std::ostream &os) {
  os << "<table id=\"stage-table\"><thead><tr><th>stage</th><th class=\"l\">ranks</th><th>ops</th><th>TP</th>"
        "<th>recompute</th><th>ZeRO</th><th>forward / mb</th><th>backward / mb</th><th>all-reduce</th>"
        "<th>busy / step</th><th>peak memory</th><th>capacity</th><th>use</th></tr></thead><tbody>\n";
  for (int s = 0; s < plan.stages_size(); ++s) {
    const auto &st = plan.stages(s);
    const auto &e = st.estimates();
    std::string ranks;
    for (int r : st.ranks()) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
    const double use = e.memory_capacity_bytes() > 0 ? double(e.peak_memory_bytes()) / e.memory_capacity_bytes() : 0;
    os << "<tr class=\"stage-row\" data-stage=\"" << s << "\"><td>" << s << "</td><td class=\"l\">" << ranks
       << "</td><td>" << st.op_end() - st.op_begin() << "</td><td>" << plan::tensorParallel(st) << "</td><td>"
       << (st.recompute() ? "yes" : "no") << "</td><td>" << st.zero() << "</td><td>" << plan::timeText(e.fwd_time_s())
       << "</td><td>" << plan::timeText(e.bwd_time_s()) << "</td><td>" << plan::timeText(e.allreduce_time_s())
       << "</td><td>" << plan::timeText(plan::stageBusyTime(plan, s)) << "</td><td>"
       << esc(plan::bytesText(double(e.peak_memory_bytes()))) << "</td><td>"
       << esc(plan::bytesText(double(e.memory_capacity_bytes()))) << "</td><td" << (use > 1 ? " class=\"bad\"" : "")
       << ">" << num(use * 100) << "%</td></tr>\n";
  }
  os << "</tbody></table>\n";
}

void memoryBars(const proto::Plan &plan, std::ostream &os) {
  struct Kind {
    const char *name, *colour;
    int64_t (*bytes)(const proto::StageEstimates &);
  };
  static const Kind kKinds[] = {
      {"parameters", "#4e79a7", [](const proto::StageEstimates &e) { return e.param_bytes(); }},
      {"gradients", "#f28e2b", [](const proto::StageEstimates &e) { return e.grad_bytes(); }},
      {"optimizer state", "#e15759", [](const proto::StageEstimates &e) { return e.optimizer_bytes(); }},
      {"activations", "#76b7b2", [](const proto::StageEstimates &e) { return e.activation_bytes(); }},
      {"recompute stash", "#edc948", [](const proto::StageEstimates &e) { return e.recompute_stash_bytes(); }},
      {"buffers", "#b07aa1", [](const proto::StageEstimates &e) { return e.buffer_bytes(); }},
      {"low-precision weights", "#ff9da7", [](const proto::StageEstimates &e) { return e.lowp_weight_bytes(); }},
      {"working", "#9c755f", [](const proto::StageEstimates &e) { return e.working_bytes(); }},
  };
  // The scale fits the largest stage, and the capacity where it is near: a
  // small model on a large device would otherwise draw no bar at all.
  double most = 1, capacity = 0;
  for (const auto &st : plan.stages()) {
    double sum = 0;
    for (const Kind &k : kKinds) sum += double(k.bytes(st.estimates()));
    most = std::max({most, sum, double(st.estimates().peak_memory_bytes())});
    capacity = std::max(capacity, double(st.estimates().memory_capacity_bytes()));
  }
  if (capacity <= 2 * most) most = std::max(most, capacity);
  const double left = 70, width = 960, bar = 22, gap = 10;
  const double scale = (width - left - 300) / most; // room for the peak label
  const double height = double(plan.stages_size()) * (bar + gap) + 8;
  os << "<svg id=\"memory-bars\" width=\"" << width << "\" height=\"" << height << "\" viewBox=\"0 0 " << width << " "
     << height << "\" xmlns=\"http://www.w3.org/2000/svg\">\n";
  for (int s = 0; s < plan.stages_size(); ++s) {
    const auto &e = plan.stages(s).estimates();
    const double y = 4 + s * (bar + gap);
    os << "<text x=\"4\" y=\"" << num(y + bar * 0.7) << "\">stage " << s << "</text>\n";
    double x = left;
    for (const Kind &k : kKinds) {
      const double b = double(k.bytes(e));
      if (b <= 0) continue;
      os << "<rect class=\"mem\" data-kind=\"" << k.name << "\" x=\"" << num(x, 2) << "\" y=\"" << num(y)
         << "\" width=\"" << num(b * scale, 2) << "\" height=\"" << bar << "\" fill=\"" << k.colour << "\"><title>stage "
         << s << ": " << k.name << " " << esc(plan::bytesText(b)) << "</title></rect>\n";
      x += b * scale;
    }
    const double cap = double(e.memory_capacity_bytes());
    os << "<text x=\"" << num(x + 6) << "\" y=\"" << num(y + bar * 0.7) << "\">peak "
       << esc(plan::bytesText(double(e.peak_memory_bytes())));
    if (cap > most) os << " of " << esc(plan::bytesText(cap)) << " (capacity off the scale)";
    os << "</text>\n";
    if (cap > 0 && cap <= most)
      os << "<line x1=\"" << num(left + cap * scale, 2) << "\" x2=\"" << num(left + cap * scale, 2) << "\" y1=\""
         << num(y - 2) << "\" y2=\"" << num(y + bar + 2) << "\" stroke=\"#b00\" stroke-width=\"2\"><title>stage " << s
         << ": capacity " << esc(plan::bytesText(cap)) << "</title></line>\n";
  }
  os << "</svg>\n<div class=\"legend\">";
  for (const Kind &k : kKinds) os << "<span><i style=\"background:" << k.colour << "\"></i>" << k.name << "</span>";
  os << "<span><i style=\"background:#b00;width:3px\"></i>capacity</span></div>\n";
  os << "<p class=\"note\">Peak memory is the largest moment of a step, not the sum of every kind at once: the "
        "working bytes of one op are held only while it runs (docs/partitioner.md).</p>\n";
}

/// The graph of stages: one node per stage, edges with the bytes they carry.
void stageGraph(const proto::Plan &plan, const SvgRenderer &render, std::ostream &os) {
  auto graph = plan::graphFromProto(plan.graph());
  if (!graph) {
    os << "<p class=\"bad\">" << esc(graph.error().message) << "</p>\n";
    return;
  }
  plan::DotOptions dot;
  for (const auto &s : plan.stages()) dot.groups.emplace_back(s.op_begin(), s.op_end());
  std::ostringstream text;
  plan::printPlanDot(plan, *graph, dot, text);
  Expected<std::string> svg = render ? render(text.str()) : Expected<std::string>(Error{"no graphviz renderer"});
  if (svg && svg->find("<svg") != std::string::npos) {
    os << "<div id=\"stage-graph\">" << svg->substr(svg->find("<svg")) << "</div>\n";
    return;
  }
  os << "<p class=\"note\">Graphviz could not draw the graph (" << esc(svg ? "no SVG" : svg.error().message)
     << "); its DOT text:</p><pre id=\"stage-graph\">" << esc(text.str()) << "</pre>\n";
}

} // namespace

Status runReport(const ReportOptions &opts, const SvgRenderer &render, std::ostream &log) {
  auto plan = readSoundPlan(opts.plan);
  if (!plan) return plan.error();
  auto predicted = predictStep(*plan, opts.plan, opts.reestimate, false, /*plan_compute=*/true);
  if (!predicted) return predicted.error();
  std::optional<MeasuredRun> run;
  std::optional<plan::Trace> trace;
  if (!opts.trace.empty()) {
    auto r = measurePlanRun(*plan, opts.plan, opts.trace);
    if (!r) return r.error();
    run = *r;
    auto text = readFile(opts.trace);
    if (!text) return text.error();
    auto t = plan::readChromeTrace(*text, opts.trace);
    if (!t) return t.error();
    trace = std::move(*t);
  }

  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>rannc plan: "
     << esc(plan->model().path()) << "</title>\n<style>" << kStyle << "</style></head>\n<body>\n";
  os << "<h1>rannc plan of <code>" << esc(plan->model().path()) << "</code></h1>\n";
  os << "<section id=\"summary-section\"><h2>Summary</h2>\n";
  summary(*plan, opts.plan, os);
  os << "</section>\n<section id=\"stages\"><h2>Stages</h2>\n";
  stageTable(*plan, os);
  os << "</section>\n<section id=\"memory\"><h2>Memory per device, by kind (the plan's estimate)</h2>\n";
  memoryBars(*plan, os);
  os << "</section>\n<section id=\"timeline-predicted\"><h2>Predicted timeline: one step</h2>\n";
  os << "<p class=\"note\">As <code>rannc-plan simulate --trace</code> draws it, with each stage's forward and "
        "backward the plan's own (the costs it was planned with) and transfers from the analytic model: "
     << esc(plan::timeText(predicted->step_s)) << " per step (the plan says "
     << esc(plan::timeText(plan->estimates().step_time_s())) << ").</p>\n";
  legend(categoriesOf(predicted->events), os);
  timelineSvg(predicted->events, predicted->process_names, predicted->step_s, "predicted", os);
  os << "</section>\n";
  if (run) {
    // The kept step whose span is the median (Note [measured figures]), from its start.
    std::map<int64_t, std::pair<double, double>> spans;
    for (const plan::TraceEvent &e : trace->events) {
      if (e.counter) continue;
      const int64_t step = e.numbers.count("step") ? e.numbers.at("step") : 0;
      if (step < run->first_step) continue;
      auto [it, fresh] = spans.emplace(step, std::make_pair(e.start_s, e.start_s + e.duration_s));
      it->second.first = std::min(it->second.first, e.start_s);
      it->second.second = std::max(it->second.second, e.start_s + e.duration_s);
    }
    std::vector<std::pair<double, int64_t>> by_span;
    for (const auto &[step, s] : spans) by_span.emplace_back(s.second - s.first, step);
    std::sort(by_span.begin(), by_span.end());
    const int64_t shown = by_span[by_span.size() / 2].second;
    const double start = spans.at(shown).first;
    std::vector<plan::TraceEvent> step_events;
    for (plan::TraceEvent e : trace->events)
      if (!e.counter && (e.numbers.count("step") ? e.numbers.at("step") : 0) == shown) {
        e.start_s -= start;
        step_events.push_back(std::move(e));
      }
    os << "<section id=\"timeline-measured\"><h2>Measured timeline: step " << shown << "</h2>\n";
    os << "<p class=\"note\">From <code>" << esc(opts.trace) << "</code> (rannc-exec --trace), the step of median "
       << "length, " << esc(plan::timeText(by_span[by_span.size() / 2].first))
       << "; a receive lasts until its message is in, waiting for the peer included.</p>\n";
    legend(categoriesOf(step_events), os);
    timelineSvg(step_events, trace->process_names, by_span[by_span.size() / 2].first, "measured", os);
    os << "</section>\n<section id=\"comparison\"><h2>Predicted against measured</h2>\n"
       << "<table id=\"compare-table\"><thead><tr><th>stage</th><th class=\"l\">what</th><th>predicted</th>"
          "<th>measured</th><th>ratio</th></tr></thead><tbody>\n";
    for (const CompareRow &r : compareRows(*plan, *run)) {
      auto cell = [&](double v) { return r.bytes ? plan::bytesText(v) : plan::timeText(v); };
      os << "<tr><td>" << esc(r.stage) << "</td><td class=\"l\">" << esc(r.what) << "</td><td>"
         << esc(r.predicted > 0 ? cell(r.predicted) : "-") << "</td><td>" << esc(cell(r.measured)) << "</td><td>"
         << (r.ratio() > 0 ? num(r.ratio(), 2) : "-") << "</td></tr>\n";
    }
    os << "</tbody></table>\n<p class=\"note\">Ratio: predicted / measured (rannc-plan compare). The table's "
          "prediction is the plan's own, from the costs it was planned with.</p>\n</section>\n";
  }
  os << "<section id=\"graph\"><h2>Stage graph</h2>\n<p class=\"note\">One node per stage; red edges carry "
        "activations forward (and their gradients back), labelled with the bytes per micro-batch.</p>\n";
  stageGraph(*plan, render, os);
  os << "</section>\n<script>" << kScript << "</script>\n</body></html>\n";
  if (Status st = writeFileAtomic(opts.output, os.str()); !st) return st;
  log << "rannc-plan: wrote " << opts.output << " (" << plan->stages_size() << " stage(s)"
      << (run ? ", with the measured run" : "") << "; one file, open it in a browser)\n";
  return Status::success();
}

} // namespace rannc::planner
