#include "executor/profile/profiler.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <type_traits>

#include "executor/profile/gpu_timer.h"
#include "executor/runtime/autocast.h"
#include "executor/runtime/cpu_clock.h"
#include "executor/runtime/device.h"
#include "executor/runtime/weights.h"
#include "executor/runtime/grads.h"
#include "executor/runtime/memory.h"
#include "executor/runtime/ops.h"
#include "executor/runtime/stage.h"
#include "executor/schedule/schedule.h"

namespace rannc::profile {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/// A unit's structure: its ops with attributes and the dtype and shape of
/// every value they read and write, naming values by position inside the unit
/// rather than by name. Units with equal signatures (the layers of a
/// transformer) cost the same, so each is measured once.
std::string unitSignature(const ir::Graph &g, const cost::Unit &u) {
  std::ostringstream os;
  std::map<ir::ValueId, int> local;
  auto value = [&](ir::ValueId v) {
    if (v == ir::kNoValue) return std::string("_");
    const ir::Value &val = g.values[v];
    auto it = local.find(v);
    std::string id = it != local.end() ? "l" + std::to_string(it->second) : std::string(ir::valueKindName(val.kind));
    return id + ":" + std::string(ir::dtypeName(val.dtype)) + (val.shape_known ? ir::shapeString(val.shape) : "[*]");
  };
  for (int n = u.op_begin; n < u.op_end; ++n) {
    const ir::Node &node = g.nodes[n];
    os << node.op_type << '(';
    for (ir::ValueId in : node.inputs) os << value(in) << ',';
    os << ")->(";
    for (ir::ValueId out : node.outputs) {
      if (out != ir::kNoValue) local.emplace(out, int(local.size()));
      os << value(out) << ',';
    }
    os << "){";
    for (const auto &[name, attr] : node.attrs) {
      os << name << '=';
      std::visit(
          [&](const auto &v) {
            using T = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<T, ir::Tensor>) os << ir::dtypeName(v.dtype) << v.data.size() << ':' << v.data;
            else if constexpr (std::is_arithmetic_v<T> || std::is_same_v<T, std::string>) os << v;
            else
              for (const auto &x : v) os << x << ' ';
          },
          attr);
      os << ';';
    }
    os << "}\n";
  }
  return os.str();
}

// Note [profiling a GPU]
// On cuda the parameters, constants, buffers and data are drawn on the host
// as on cpu (the same seeded values) and moved to the GPU; the runners then
// run there, since the ops follow their inputs' device. Kernels run
// asynchronously, so each timed interval lies between two CUDA events on the
// compute stream, read once the later one has completed; the device is
// synchronised before each run so that nothing earlier runs into it. The
// warm-up runs absorb the one-time costs (lazy kernel loading, cuBLAS handles
// and workspaces, the allocator's first segments). Memory comes from the
// caching allocator: the bytes allocated to tensors (blocks rounded to 512
// bytes) before the unit and after its forward, and their peak over forward
// and backward after resetting it -- what the counting allocator gives on
// cpu. What the allocator reserves beyond its blocks, the CUDA context and
// the workspaces are the planner's runtime reserve (Note [runtime reserve] in
// planner/cluster/cluster.cpp), not any unit's.

/// The clock and the tensor-memory counters of the device being profiled.
class Meter {
public:
  /// `points` marks; `gpu` < 0: this host (the counting allocator must be
  /// installed), timed in this thread's CPU time when `cpu_time` (Note [CPU
  /// time on a shared machine]), else by the wall clock.
  Meter(int gpu, int points, bool cpu_time) : gpu_(gpu), cpu_time_(cpu_time) {
    if (gpu_ >= 0) timeline_ = std::make_unique<GpuTimeline>(gpu_, points);
    else host_.resize(size_t(points));
  }
  void mark(int i) {
    if (timeline_) timeline_->mark(i);
    else host_.at(size_t(i)) = cpu_time_ ? runtime::threadCpuSeconds() : seconds(Clock::time_point{}, Clock::now());
  }
  /// From mark i to mark j (on a GPU, waits until j has happened).
  double between(int i, int j) { return timeline_ ? timeline_->seconds(i, j) : host_.at(size_t(j)) - host_.at(size_t(i)); }
  /// Waits for the device's queued work (no-op on the host).
  void sync() const { runtime::synchronizeGpu(gpu_); }
  int64_t bytes() const { return gpu_ >= 0 ? runtime::gpuAllocatedBytes(gpu_) : runtime::currentTensorBytes(); }
  int64_t peakBytes() const { return gpu_ >= 0 ? runtime::gpuPeakAllocatedBytes(gpu_) : runtime::peakTensorBytes(); }
  void resetPeak() const {
    if (gpu_ >= 0) runtime::resetGpuPeak(gpu_);
    else runtime::resetPeakTensorBytes();
  }

private:
  int gpu_;
  bool cpu_time_;
  std::unique_ptr<GpuTimeline> timeline_;
  std::vector<double> host_; ///< seconds
};

class Progress {
public:
  Progress(std::ostream &os, int total) : os_(os), total_(total), tty_(::isatty(STDERR_FILENO) != 0) {}
  void tick(const std::string &what) {
    ++done_;
    if (tty_) {
      int width = 30, filled = total_ > 0 ? done_ * width / total_ : width;
      os_ << "\rprofiling [" << std::string(filled, '#') << std::string(width - filled, ' ') << "] " << done_ << "/"
          << total_ << " " << what << "\033[K" << std::flush;
      if (done_ == total_) os_ << "\n";
    } else if (done_ == total_ || done_ % std::max(1, total_ / 10) == 0) {
      os_ << "rannc-plan: profiled " << done_ << "/" << total_ << " (" << what << ")\n";
    }
  }

private:
  std::ostream &os_;
  int total_, done_ = 0;
  bool tty_;
};

/// Note [whole-graph calibration]
/// A unit run alone finds its inputs and weights hot in cache; inside the
/// whole step it does not (ResNet-18 ran ~15% slower in rannc-exec than the
/// sum of its units), and the gap depends on the batch size. So at each size,
/// after its units, the whole graph runs forward and backward once more,
/// timed, and that row's unit forward and backward times are scaled by
/// whole / sum of units: the sum then equals the whole, the units keep their
/// proportions (which the partitioner needs). The whole graph runs as a stage
/// runs it, each value dropped after its last use (the `trimmed` runner), so
/// that its allocations reuse freed, hot memory as rannc-exec's do. Until
/// 2026-11-30 it ran on the runner that keeps every value for the units to
/// read; on the 4-layer GPT of trace_check.py (one rank, batch 4), three
/// profiles alternating between the two gave a calibrated forward of 10.4,
/// 11.7 and 11.6 ms against 11.4, 11.9 and 12.3 with every value kept, where
/// rannc-exec ran it in 11.0: a few percent, in the machine's noise.
void calibrate(runtime::StageRunner &full, const std::unordered_map<ir::ValueId, torch::Tensor> &data,
               std::vector<cost::UnitCost> &row, int warmup, const ProfileOptions &opts, Meter &meter) {
  std::vector<double> fwds, bwds;
  int runs = warmup + opts.repetitions;
  for (int rep = 0; rep < runs; ++rep) {
    meter.sync();
    meter.mark(0);
    full.forward(0, data);
    meter.mark(1);
    full.backward(0, {}, 1.0);
    meter.mark(2);
    full.release(0);
    const double fwd = meter.between(0, 1), bwd = meter.between(1, 2);
    if (rep < warmup) continue;
    fwds.push_back(fwd);
    bwds.push_back(bwd);
    if (rep == warmup && fwd + bwd > opts.single_run_s) break; // as for units
  }
  const double fwd = median(fwds), bwd = median(bwds);
  double unit_fwd = 0, unit_bwd = 0;
  for (const cost::UnitCost &c : row) {
    unit_fwd += c.fwd_s;
    unit_bwd += c.bwd_s;
  }
  for (cost::UnitCost &c : row) {
    if (unit_fwd > 0) c.fwd_s *= fwd / unit_fwd;
    if (unit_bwd > 0) c.bwd_s *= bwd / unit_bwd;
  }
}

/// Note [values autograd keeps]
/// Which values made in one unit and read in a later one does autograd save
/// nowhere? A whole-graph forward with autograd recording drops each value at
/// its last use as a stage does (Note [last use] in executor/runtime/stage.h);
/// a value whose storage is gone by the end of that forward was saved by no
/// op (nor is it a view of one that was). A unit measured alone keeps its
/// outputs for later units in its kept bytes, saved or not, so the planner
/// subtracts these from a stage that holds their producer and their last
/// reader (planner/driver/lower.cpp).
std::vector<ir::ValueId> unsavedValues(const ir::Graph &g, const std::vector<cost::Unit> &units,
                                       runtime::StageRunner &trimmed,
                                       const std::unordered_map<ir::ValueId, torch::Tensor> &data) {
  const std::vector<int> unit_of = cost::unitOfNode(g, units);
  const std::vector<int> last_reader = cost::lastReaderUnit(g, units);
  std::vector<std::pair<ir::ValueId, c10::weak_intrusive_ptr<c10::StorageImpl>>> watched;
  trimmed.onDrop([&](ir::ValueId v, const torch::Tensor &t) {
    const ir::NodeId producer = g.values[size_t(v)].producer;
    if (producer >= 0 && t.defined() && t.has_storage() && last_reader[size_t(v)] > unit_of[size_t(producer)])
      watched.emplace_back(v, t.storage().getWeakStorageImpl());
  });
  trimmed.forward(0, data);
  std::vector<ir::ValueId> unsaved;
  for (const auto &[v, storage] : watched)
    if (storage.expired()) unsaved.push_back(v);
  trimmed.release(0);
  trimmed.onDrop(nullptr);
  std::sort(unsaved.begin(), unsaved.end());
  return unsaved;
}

} // namespace

Expected<cost::CostTable> measureUnits(const ir::Graph &g, const std::vector<cost::Unit> &units,
                                       const ProfileOptions &opts, std::ostream &progress_os) {
  const bool on_gpu = opts.device == cluster::DeviceKind::Cuda;
  if (on_gpu) {
    if (std::string why = runtime::gpuUnavailableReason(opts.gpu); !why.empty()) return Error{"--device cuda: " + why};
  } else {
    runtime::installCountingAllocator();
  }
  const torch::Device device = on_gpu ? torch::Device(torch::kCUDA, c10::DeviceIndex(opts.gpu)) : torch::Device(torch::kCPU);
  torch::set_num_threads(opts.threads);
  torch::manual_seed(0);
  std::vector<std::pair<int, int>> ranges;
  for (const auto &u : units) ranges.emplace_back(u.op_begin, u.op_end);

  // Parameters are drawn, not loaded: time and memory do not depend on the
  // values, and reading a large model's weights again costs more than
  // measuring it (a weightless model can be profiled too).
  // Drawn on the host, then moved (Note [profiling a GPU]).
  std::map<ir::ValueId, torch::Tensor> params, constants, buffers;
  cost::CostTable table;
  try {
    if (on_gpu) {
      runtime::useGpu(opts.gpu);
      table.device_name = runtime::gpuName(opts.gpu);
    }
    for (ir::ValueId p : g.parameters) {
      std::vector<int64_t> dims;
      for (const ir::Dim &d : g.values[p].shape) dims.push_back(d.offset);
      const torch::ScalarType type = runtime::toScalarType(g.values[p].dtype);
      torch::Tensor t = torch::isFloatingType(type) ? torch::randn(dims, torch::TensorOptions().dtype(type)) * 0.02
                                                    : torch::zeros(dims, torch::TensorOptions().dtype(type));
      t = t.to(device);
      params[p] = t.set_requires_grad(t.is_floating_point());
    }
    for (const auto &[id, tensor] : g.constant_data) constants[id] = runtime::toTorch(tensor).to(device);
    // Buffers (BatchNorm statistics) at their initial values (Note [initial weights]).
    buffers = runtime::initialTensors(g, g.buffers, 0);
    for (auto &[id, t] : buffers) t = t.to(device);
  } catch (const std::exception &e) {
    return Error{std::string("profiling failed: ") + e.what()};
  }

  table.source = "measured";
  table.units = units;
  table.batch_sizes = opts.batch_sizes;
  std::sort(table.batch_sizes.begin(), table.batch_sizes.end());
  table.optimizer = cost::optimizerName(opts.optimizer);
  Progress progress(progress_os, int(table.batch_sizes.size() * units.size()));

  try {
    // One intra-op thread: all the work is this thread's (Note [CPU time on a shared machine]).
    Meter meter(on_gpu ? opts.gpu : -1, 4, /*cpu_time=*/opts.threads == 1);
    // One runner for the whole graph captures every value a unit reads.
    schedule::StageProgram whole = schedule::buildStageProgram(g, {{0, int(g.nodes.size())}}, 0);
    runtime::StageRunner full(g, whole, params, constants, buffers);
    full.setKeepAll(true); // every unit's inputs are read from it (Note [last use])
    runtime::StageRunner trimmed(g, whole, params, constants, buffers); // as a stage runs it
    std::vector<runtime::StageRunner> runners;
    for (size_t u = 0; u < units.size(); ++u)
      runners.emplace_back(g, schedule::buildStageProgram(g, ranges, int(u)), params, constants, buffers);
    // Mixed precision: every run under autocast. Its weight copies, cached
    // in the warm-up run and kept to the end, stay out of the measured kept
    // bytes: the planner counts them per stage (Note [autocast dtypes]).
    const torch::ScalarType autocast = runtime::scalarTypeFor(opts.precision);
    full.setAutocast(autocast);
    trimmed.setAutocast(autocast);
    for (auto &r : runners) r.setAutocast(autocast);
    for (auto &r : runners) r.setDenseSends(false); // Note [dense sent values] in executor/runtime/stage.cpp
    // As rannc-exec does: the device's generator, CPU-made op outputs moved there.
    full.setDevice(device);
    trimmed.setDevice(device);
    for (auto &r : runners) r.setDevice(device);

    // Structurally identical units are measured once (the first of them).
    std::vector<size_t> same_as(units.size());
    {
      std::map<std::string, size_t> first;
      for (size_t u = 0; u < units.size(); ++u) same_as[u] = first.emplace(unitSignature(g, units[u]), u).first->second;
    }

    for (int64_t b : table.batch_sizes) {
      std::unordered_map<ir::ValueId, torch::Tensor> data;
      for (ir::ValueId in : g.inputs) data[in] = runtime::syntheticInput(g.values[in], b, uint64_t(b)).to(device);
      {
        torch::NoGradGuard no_grad;
        full.forward(0, data);
      }
      // At the largest size, which the planner's kept bytes come from: at
      // one sample some values are views that are copies at more (a reshape
      // of a transposed tensor), and which values share storage differs.
      if (b == table.batch_sizes.back()) table.unsaved_values = unsavedValues(g, units, trimmed, data);
      std::vector<cost::UnitCost> row;
      for (size_t u = 0; u < units.size(); ++u) {
        // Note [received layout]: the inputs the whole graph made as
        // non-contiguous views; a stage receives them contiguous.
        std::vector<ir::ValueId> strided;
        for (const auto &rv : runners[u].program().recvs) {
          const torch::Tensor &t = full.value(0, rv.value);
          if (t.defined() && t.dim() > 1 && !t.is_contiguous()) strided.push_back(rv.value);
        }
        if (b == table.batch_sizes.back())
          table.strided_values.insert(table.strided_values.end(), strided.begin(), strided.end());
        if (same_as[u] != u) {
          row.push_back(row[same_as[u]]);
          progress.tick("batch " + std::to_string(b) + ", unit " + std::to_string(u + 1) + " (same as " +
                        std::to_string(same_as[u] + 1) + ")");
          continue;
        }
        runtime::StageRunner &r = runners[u];
        const auto &prog = r.program();
        std::vector<double> fwd, bwd;
        cost::UnitCost c;
        int runs = opts.warmup + opts.repetitions;
        for (int rep = 0; rep < runs; ++rep) {
          std::unordered_map<ir::ValueId, torch::Tensor> feeds;
          for (ir::ValueId in : prog.data_inputs) feeds[in] = data.at(in);
          for (const auto &rv : prog.recvs) feeds[rv.value] = full.value(0, rv.value).detach().clone();
          meter.sync();
          const int64_t before = meter.bytes();
          meter.resetPeak();
          meter.mark(0);
          r.forward(0, std::move(feeds));
          meter.mark(1);
          const int64_t kept = meter.bytes() - before;
          // The gradients of the unit's outputs arrive after its forward and
          // count in its working bytes while they live (Note [handing
          // gradients over] in executor/runtime/stage.cpp).
          std::vector<torch::Tensor> grads;
          for (const auto &s : prog.sends) {
            const torch::Tensor &v = r.value(0, s.value);
            grads.push_back(v.is_floating_point() ? torch::ones_like(v) : torch::Tensor());
          }
          meter.mark(2);
          r.backward(0, std::move(grads), 1.0);
          meter.mark(3);
          const int64_t peak = meter.peakBytes() - before;
          r.release(0);
          const double fwd_s = meter.between(0, 1), bwd_s = meter.between(2, 3);
          // A unit whose warm-up run took long (an LM head over a large
          // vocabulary) is timed once: its run-to-run spread is small next to
          // its time, and repeating it would dominate profiling.
          if (rep == opts.warmup - 1 && fwd_s + bwd_s > opts.single_run_s) runs = opts.warmup + 1;
          if (rep < opts.warmup) continue;
          fwd.push_back(fwd_s);
          bwd.push_back(bwd_s);
          // Memory is deterministic after warm-up (gradients exist by then).
          c.kept_bytes = std::max<int64_t>(0, kept);
          c.work_bytes = std::max<int64_t>(0, peak - kept);
        }
        // Note [received layout]: once more with those fed contiguous.
        if (!strided.empty()) {
          std::unordered_map<ir::ValueId, torch::Tensor> feeds;
          for (ir::ValueId in : prog.data_inputs) feeds[in] = data.at(in);
          for (const auto &rv : prog.recvs)
            feeds[rv.value] = full.value(0, rv.value).detach().clone(at::MemoryFormat::Contiguous);
          meter.sync();
          const int64_t before = meter.bytes();
          r.forward(0, std::move(feeds));
          const int64_t kept = meter.bytes() - before;
          std::vector<torch::Tensor> grads;
          for (const auto &s : prog.sends) {
            const torch::Tensor &v = r.value(0, s.value);
            grads.push_back(v.is_floating_point() ? torch::ones_like(v) : torch::Tensor());
          }
          r.backward(0, std::move(grads), 1.0);
          r.release(0);
          c.received_extra_bytes = std::max<int64_t>(0, kept - c.kept_bytes);
        }
        c.fwd_s = median(fwd);
        c.bwd_s = median(bwd);
        row.push_back(c);
        progress.tick("batch " + std::to_string(b) + ", unit " + std::to_string(u + 1));
      }
      std::sort(table.strided_values.begin(), table.strided_values.end());
      table.strided_values.erase(std::unique(table.strided_values.begin(), table.strided_values.end()),
                                 table.strided_values.end());
      full.release(0);
      calibrate(trimmed, data, row, /*warmup=*/b == table.batch_sizes.front() ? opts.warmup : 0, opts, meter);
      table.costs.push_back(std::move(row));
    }
    full.newStep(); // drops autocast's weight copies


    // The optimizer step, measured the same way over parameters of up to
    // 16M elements in all (its time is linear in the elements; stepping a
    // 100M-parameter model's Adam four times would cost seconds).
    std::vector<torch::Tensor> all;
    int64_t numel = 0;
    for (auto &[id, t] : params) {
      if (numel > 0 && numel + t.numel() > (int64_t{16} << 20)) continue;
      if (!t.grad().defined()) t.mutable_grad() = torch::zeros_like(t);
      all.push_back(t);
      numel += t.numel();
    }
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (opts.optimizer == cost::Optimizer::Adam) opt = std::make_unique<torch::optim::Adam>(all, torch::optim::AdamOptions(1e-3));
    else opt = std::make_unique<torch::optim::SGD>(all, torch::optim::SGDOptions(1e-3));
    std::vector<double> steps;
    // What rannc-exec's update does besides communicating: one pass for the
    // gradient norm (and finiteness), the step, zeroing the gradients.
    for (int rep = 0; rep < opts.warmup + opts.repetitions; ++rep) {
      meter.sync();
      meter.mark(0);
      volatile double norm = runtime::gradSquaredNorm(all);
      (void)norm;
      opt->step();
      runtime::zeroGradients(all);
      meter.mark(1);
      const double step_s = meter.between(0, 1);
      if (rep >= opts.warmup) steps.push_back(step_s);
    }
    table.optimizer_s_per_param = numel > 0 ? median(steps) / double(numel) : 0;
  } catch (const std::exception &e) {
    return Error{std::string("profiling failed: ") + e.what()};
  }
  return table;
}

} // namespace rannc::profile
