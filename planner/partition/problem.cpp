#include "planner/partition/problem.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "planner/support/format.h"

namespace rannc::partition {
namespace {

bool finiteNonNegative(double x) { return std::isfinite(x) && x >= 0; }

bool isPowerOfTwo(int x) { return x > 0 && (x & (x - 1)) == 0; }

} // namespace

// Note [ring all-reduce bandwidth]
// NCCL all-reduces along rings; each of the 2(n-1) steps moves 1/n of the
// data over every link of the ring (nccl-tests' PERFORMANCE.md: bus
// bandwidth = algorithm bandwidth x 2(n-1)/n). Inside a node the ring runs
// over the intra-node link. Across nodes NCCL runs one ring channel per
// network interface: a channel visits the ring's devices of a node over the
// intra-node link and leaves the node once, through one interface, so with
// each device's interface in use (a DGX A100 has 8 HDR 200 Gb/s InfiniBand
// adapters, one per GPU: inter_node is one GPU's share) a node sends k times
// one device's inter-node bandwidth, k being the ring's devices in it. A
// ring spanning nodes thus moves at min(intra, k_min x inter), k_min the
// fewest of its devices in one node: 8 x 25 GB/s for data parallelism over
// whole DGX A100 nodes, one device's 25 GB/s for a ring with one device per
// node (the data-parallel rings of tensor-parallel stages, `stride` = the
// degree, with 8 to a node). Point-to-point transfers between stages keep
// one device's share.
double Devices::allReduceBandwidth(int first, int count, int stride) const {
  const int last = first + (count - 1) * stride;
  if (first / per_node == last / per_node) return intra_node.bandwidth;
  if (stride >= per_node) return std::min(intra_node.bandwidth, inter_node.bandwidth); // one device per node
  // Members every `stride` ranks (a divisor of per_node): the first and last nodes may hold fewer.
  const int in_first = (per_node - first % per_node + stride - 1) / stride, in_last = last % per_node / stride + 1;
  const int fewest = std::min({in_first, in_last, per_node / stride});
  return std::min(intra_node.bandwidth, fewest * inter_node.bandwidth);
}

void Problem::print(std::ostream &os) const {
  os << "problem: " << blocks.size() << " blocks, batch " << batch_size << ", " << devices.count << " devices ("
     << devices.per_node << "/node, " << formatBytes(devices.memory_bytes) << ", margin " << devices.memory_margin;
  if (devices.reserve_bytes > 0) os << ", reserve " << formatBytes(devices.reserve_bytes);
  os << "), intra " << devices.intra_node.bandwidth << " B/s + " << devices.intra_node.latency_s << " s, inter "
     << devices.inter_node.bandwidth << " B/s + " << devices.inter_node.latency_s << " s, optimizer x"
     << optimizer_bytes_per_param_byte
     << (force_recompute ? ", recompute forced" : allow_recompute ? ", recompute allowed" : "")
     << (force_zero ? ", zero forced" : allow_zero ? ", zero allowed" : "")
     << (no_split_backward.empty() ? "" : ", no split backward") << (no_interleave.empty() ? "" : ", no interleaving")
     << "\n";
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Block &b = blocks[i];
    os << "  block " << i << ": fwd " << b.fwd.fixed_s << "+" << b.fwd.per_sample_s << "b s, bwd " << b.bwd.fixed_s
       << "+" << b.bwd.per_sample_s << "b s, params " << b.param_bytes << " B"
       << (b.buffer_bytes > 0 ? ", buffers " + std::to_string(int64_t(b.buffer_bytes)) + " B" : std::string())
       << (b.lowp_weight_bytes > 0 ? ", low-precision weights " + std::to_string(int64_t(b.lowp_weight_bytes)) + " B"
                                   : std::string())
       << ", act " << b.activation_bytes_per_sample
       << " B/sample, work " << (b.working_fixed_bytes > 0 ? std::to_string(int64_t(b.working_fixed_bytes)) + " B + " : "")
       << b.working_bytes_per_sample << " B/sample, cut before "
       << (i < cut_bytes_per_sample.size() ? cut_bytes_per_sample[i] : 0.0) << " B/sample"
       << (i < unsaved_cut_bytes_per_sample.size() && unsaved_cut_bytes_per_sample[i] > 0
               ? " (" + std::to_string(unsaved_cut_bytes_per_sample[i]) + " unsaved)"
               : std::string())
       << (i < received_layout_cut_bytes_per_sample.size() && received_layout_cut_bytes_per_sample[i] > 0
               ? ", " + std::to_string(received_layout_cut_bytes_per_sample[i]) + " B/sample more if received"
               : std::string())
       << (b.unsaved_freed_bytes_per_sample > 0
               ? ", frees " + std::to_string(b.unsaved_freed_bytes_per_sample) + " B/sample unsaved"
               : std::string());
    if (b.stat_sync_collectives > 0)
      os << "; batch statistics: " << b.stat_sync_collectives << " all-reduces of " << b.stat_sync_bytes << " B a pass";
    const Block::Split &t = b.tp;
    if (t.fwd.fixed_s > 0 || t.fwd.per_sample_s > 0 || t.param_bytes > 0 || t.activation_bytes_per_sample > 0 ||
        t.collectives > 0)
      os << "; tp split: fwd " << t.fwd.fixed_s << "+" << t.fwd.per_sample_s << "b s, bwd " << t.bwd.fixed_s << "+"
         << t.bwd.per_sample_s << "b s, params " << t.param_bytes << " B, act " << t.activation_bytes_per_sample
         << " B/sample, work " << t.working_fixed_bytes << " B + " << t.working_bytes_per_sample << " B/sample, "
         << t.collectives << " collectives of " << t.collective_bytes_per_sample << " B/sample";
    if (!cut_whole.empty() && !cut_whole[i]) os << "; cut before is not whole";
    os << "\n";
  }
  if (!tp_degrees.empty()) {
    os << "  tensor-parallel degrees";
    for (int t : tp_degrees) os << " " << t;
    os << "\n";
  }
}

double Problem::tiedExcess(int a, int e, int t) const {
  double excess = 0;
  for (const Tied &x : tied) {
    const auto count = std::lower_bound(x.blocks.begin(), x.blocks.end(), e) -
                       std::lower_bound(x.blocks.begin(), x.blocks.end(), a);
    if (count > 1) excess += static_cast<double>(count - 1) * (x.bytes - (1 - 1.0 / t) * x.split_bytes);
  }
  return excess;
}

bool Problem::tpDegreeAllowed(int degree) const {
  return degree == 1 || std::find(tp_degrees.begin(), tp_degrees.end(), degree) != tp_degrees.end();
}

Status validate(const Problem &p) {
  std::vector<std::string> errs;
  const int n = p.numBlocks();
  if (n == 0) errs.push_back("no blocks");
  if (p.force_recompute && !p.allow_recompute) errs.push_back("recomputation is forced but not allowed");
  if (p.force_zero && !p.allow_zero) errs.push_back("sharding (zero) is forced but not allowed");
  if (p.constraints.virtual_stages < 1 ||
      (p.constraints.virtual_stages > 1 && !(p.constraints.schedule && pipeline::interleaves(*p.constraints.schedule))))
    errs.push_back("virtual stages " + std::to_string(p.constraints.virtual_stages) +
                   " need the interleaved schedule pinned (Note [interleaved 1F1B])");
  for (int i = 0; i < n; ++i) {
    const Block &b = p.blocks[i];
    for (double x : {b.fwd.fixed_s, b.fwd.per_sample_s, b.bwd.fixed_s, b.bwd.per_sample_s, b.param_bytes,
                     b.buffer_bytes, b.lowp_weight_bytes, b.activation_bytes_per_sample, b.working_bytes_per_sample,
                     b.working_fixed_bytes, b.stat_sync_bytes, b.stat_sync_collectives})
      if (!finiteNonNegative(x)) {
        errs.push_back("block " + std::to_string(i) + ": times and sizes must be finite and >= 0");
        break;
      }
    // Note [tensor parallel stages]: each split part lies within its whole.
    const Block::Split &t = b.tp;
    auto within = [](double part, double whole) {
      return finiteNonNegative(part) && part <= whole + 1e-9 * (1 + std::fabs(whole));
    };
    if (!within(t.fwd.fixed_s, b.fwd.fixed_s) || !within(t.fwd.per_sample_s, b.fwd.per_sample_s) ||
        !within(t.bwd.fixed_s, b.bwd.fixed_s) || !within(t.bwd.per_sample_s, b.bwd.per_sample_s) ||
        !within(t.param_bytes, b.param_bytes) || !within(t.lowp_weight_bytes, b.lowp_weight_bytes) ||
        !within(t.activation_bytes_per_sample, b.activation_bytes_per_sample) ||
        !within(t.working_bytes_per_sample, b.working_bytes_per_sample) ||
        !within(t.working_fixed_bytes, b.working_fixed_bytes) || !finiteNonNegative(t.collective_bytes_per_sample) ||
        !finiteNonNegative(t.collectives))
      errs.push_back("block " + std::to_string(i) +
                     ": its tensor-parallel parts must be finite, >= 0 and within the block's own numbers");
  }
  if (p.cut_bytes_per_sample.size() != static_cast<size_t>(n) + 1)
    errs.push_back("cut_bytes_per_sample has " + std::to_string(p.cut_bytes_per_sample.size()) +
                   " entries, expected blocks+1 = " + std::to_string(n + 1));
  for (size_t i = 0; i < p.cut_bytes_per_sample.size(); ++i)
    if (!finiteNonNegative(p.cut_bytes_per_sample[i])) {
      errs.push_back("cut_bytes_per_sample[" + std::to_string(i) + "] must be finite and >= 0");
      break;
    }
  // Note [unsaved values]: 0 <= X_i <= cut[i], fr_i >= 0, and the unsaved
  // bytes block i makes, X_{i+1} - X_i + fr_i, at most its activation bytes
  // (with rounding room: coarsening sums blocks), which keeps a stage's K >= 0
  // and the DP's prefix monotone.
  if (!p.wgrad_read_cut_bytes_per_sample.empty() &&
      p.wgrad_read_cut_bytes_per_sample.size() != static_cast<size_t>(n) + 1)
    errs.push_back("wgrad_read_cut_bytes_per_sample has " + std::to_string(p.wgrad_read_cut_bytes_per_sample.size()) +
                   " entries, expected none or blocks+1 = " + std::to_string(n + 1));
  for (const Problem::PassOver &s : p.pass_over) // Note [values passing over]
    if (s.from < 0 || s.to > n || s.to < s.from + 2 || !finiteNonNegative(s.bytes_per_sample)) {
      errs.push_back("pass_over spans must lie in [0, blocks] with a block between their ends and bytes >= 0");
      break;
    }
  if (!p.received_layout_cut_bytes_per_sample.empty()) { // Note [received layout]
    if (p.received_layout_cut_bytes_per_sample.size() != static_cast<size_t>(n) + 1)
      errs.push_back("received_layout_cut_bytes_per_sample has " +
                     std::to_string(p.received_layout_cut_bytes_per_sample.size()) +
                     " entries, expected none or blocks+1 = " + std::to_string(n + 1));
    else if (!std::all_of(p.received_layout_cut_bytes_per_sample.begin(), p.received_layout_cut_bytes_per_sample.end(),
                          finiteNonNegative))
      errs.push_back("received_layout_cut_bytes_per_sample must be finite and >= 0");
  }
  const bool has_unsaved = !p.unsaved_cut_bytes_per_sample.empty();
  if (has_unsaved && p.unsaved_cut_bytes_per_sample.size() != static_cast<size_t>(n) + 1)
    errs.push_back("unsaved_cut_bytes_per_sample has " + std::to_string(p.unsaved_cut_bytes_per_sample.size()) +
                   " entries, expected none or blocks+1 = " + std::to_string(n + 1));
  else if (p.cut_bytes_per_sample.size() == static_cast<size_t>(n) + 1) {
    auto above = [](double x, double bound) { return x > bound + 1e-9 * (1 + std::fabs(bound)); };
    for (int i = 0; i < n; ++i) {
      const double x = p.unsavedCutAt(i), next = p.unsavedCutAt(i + 1);
      const double freed = p.blocks[i].unsaved_freed_bytes_per_sample;
      const double made = next - x + freed;
      // What a block makes unsaved is never split (Block::Split), so it
      // fits the activation bytes left at every degree.
      const double unsplit = p.blocks[i].activation_bytes_per_sample - p.blocks[i].tp.activation_bytes_per_sample;
      if (!finiteNonNegative(x) || !finiteNonNegative(next) || !finiteNonNegative(freed) ||
          above(x, p.cut_bytes_per_sample[i]) || above(made, unsplit)) {
        errs.push_back("block " + std::to_string(i) +
                       ": unsaved bytes must be finite, >= 0, within the cut before it, and what it makes within "
                       "its activation bytes");
        break;
      }
    }
  }
  if (p.batch_size < 1) errs.push_back("batch size must be at least 1");
  const Devices &d = p.devices;
  if (d.count < 1) errs.push_back("device count must be at least 1");
  if (d.per_node < 1) errs.push_back("devices per node must be at least 1");
  if (!(d.memory_bytes > 0) || !std::isfinite(d.memory_bytes)) errs.push_back("device memory must be positive");
  if (!(d.memory_margin >= 0 && d.memory_margin < 1)) errs.push_back("memory margin must be in [0, 1)");
  if (!finiteNonNegative(d.reserve_bytes)) errs.push_back("runtime reserve must be finite and >= 0");
  else if (d.memory_bytes > 0 && !(d.capacity() > 0))
    errs.push_back("the runtime reserve (" + formatBytes(d.reserve_bytes) + ") leaves no device memory for tensors");
  for (const Link *l : {&d.intra_node, &d.inter_node})
    if (!(l->bandwidth > 0) || !std::isfinite(l->bandwidth) || !finiteNonNegative(l->latency_s)) {
      errs.push_back("link bandwidth must be positive and latency >= 0");
      break;
    }
  if (!finiteNonNegative(p.optimizer_bytes_per_param_byte)) errs.push_back("optimizer state factor must be >= 0");
  for (size_t i = 0; i < p.tp_degrees.size(); ++i) {
    const int t = p.tp_degrees[i];
    if ((i == 0 && t != 1) || (i > 0 && t <= p.tp_degrees[i - 1]) || t > d.per_node) {
      errs.push_back("tensor-parallel degrees must be ascending, start at 1 and fit a node of " +
                     std::to_string(d.per_node) + " devices");
      break;
    }
  }
  if (!p.cut_whole.empty() && p.cut_whole.size() != static_cast<size_t>(n) + 1)
    errs.push_back("cut_whole has " + std::to_string(p.cut_whole.size()) + " entries, expected none or blocks+1 = " +
                   std::to_string(n + 1));
  for (const Problem::Tied &x : p.tied)
    if (x.blocks.size() < 2 || !std::is_sorted(x.blocks.begin(), x.blocks.end()) || x.blocks.front() < 0 ||
        x.blocks.back() >= n || !(x.bytes >= 0) || !(x.split_bytes >= 0 && x.split_bytes <= x.bytes))
      errs.push_back("a tied parameter needs 2 or more ascending blocks in range and 0 <= split bytes <= bytes");

  const Constraints &c = p.constraints;
  if (c.stages < 0) errs.push_back("stages must be >= 0 (0 = search)");
  if (c.stages > 0 && n > 0 && c.stages > n)
    errs.push_back("cannot make " + std::to_string(c.stages) + " non-empty stages from " + std::to_string(n) +
                   " blocks");
  if (c.stages > d.count)
    errs.push_back(std::to_string(c.stages) + " stages need more than the " + std::to_string(d.count) + " devices");
  for (int r : c.replicas)
    if (r < 1 || (c.power_of_two_replicas && !isPowerOfTwo(r))) {
      errs.push_back("replicas must be >= 1" + std::string(c.power_of_two_replicas ? " and powers of two" : ""));
      break;
    }
  if (c.replicas.size() > 1) {
    if (c.stages > 0 && static_cast<int>(c.replicas.size()) != c.stages)
      errs.push_back(std::to_string(c.replicas.size()) + " per-stage replica counts for " + std::to_string(c.stages) +
                     " stages");
    if (static_cast<int>(c.replicas.size()) > n && n > 0)
      errs.push_back(std::to_string(c.replicas.size()) + " per-stage replica counts but only " + std::to_string(n) +
                     " blocks");
    long total = 0;
    for (int r : c.replicas) total += r;
    if (total > d.count)
      errs.push_back("per-stage replicas need " + std::to_string(total) + " devices, have " +
                     std::to_string(d.count));
  }
  if (c.replicas.size() == 1 && c.stages > 0 && static_cast<long>(c.replicas[0]) * c.stages > d.count)
    errs.push_back(std::to_string(c.stages) + " stages x " + std::to_string(c.replicas[0]) +
                   " replicas need more than " + std::to_string(d.count) + " devices");
  for (int t : c.tensor_parallel)
    if (!p.tpDegreeAllowed(t)) {
      errs.push_back("tensor-parallel degree " + std::to_string(t) + " is not one of the allowed degrees");
      break;
    }
  if (c.tensor_parallel.size() > 1) {
    const size_t stages = c.replicas.size() > 1 ? c.replicas.size() : static_cast<size_t>(c.stages);
    if (stages > 0 && c.tensor_parallel.size() != stages)
      errs.push_back(std::to_string(c.tensor_parallel.size()) + " per-stage tensor-parallel degrees for " +
                     std::to_string(stages) + " stages");
    if (static_cast<int>(c.tensor_parallel.size()) > n && n > 0)
      errs.push_back(std::to_string(c.tensor_parallel.size()) + " per-stage tensor-parallel degrees but only " +
                     std::to_string(n) + " blocks");
  }
  if (!c.tensor_parallel.empty()) { // the least devices the pinned degrees need: one replica a stage
    const size_t stages = std::max({c.tensor_parallel.size(), c.replicas.size(), static_cast<size_t>(c.stages), size_t{1}});
    long total = 0;
    for (size_t s = 0; s < stages; ++s)
      total += static_cast<long>(c.tensor_parallel.size() > 1 ? c.tensor_parallel[s] : c.tensor_parallel[0]) *
               (c.replicas.size() > 1 ? c.replicas[s] : c.replicas.empty() ? 1 : c.replicas[0]);
    if (total > d.count)
      errs.push_back("the pinned tensor-parallel degrees and replicas need " + std::to_string(total) +
                     " devices, have " + std::to_string(d.count));
  }
  if (c.microbatches < 0) errs.push_back("micro-batches must be >= 0 (0 = search)");
  if (c.microbatches > 0 && c.microbatches > p.batch_size)
    errs.push_back(std::to_string(c.microbatches) + " micro-batches exceed the batch size " +
                   std::to_string(p.batch_size));
  if (c.max_microbatches < 0) errs.push_back("max micro-batches must be >= 0 (0 = no cap)");
  if (errs.empty()) return Status::success();
  std::string msg;
  for (const std::string &e : errs) msg += (msg.empty() ? "" : "; ") + e;
  return Error{"invalid partition problem: " + msg};
}

bool Devices::groupsInsideNodes(int first, int groups, int size) const {
  if (size <= 1 || groups <= 0) return true;
  if (size > per_node) return false;
  if (per_node % size == 0) {
    // Group starts step by `size` through the node's positions; the only
    // position that straddles among those of this residue is per_node - size + c.
    const int c = first % size;
    if (c == 0) return true;
    const int steps = ((per_node - size + c) - first % per_node + per_node) % per_node / size;
    return steps >= groups;
  }
  for (int g = 0; g < groups; ++g)
    if ((first + g * size) / per_node != (first + g * size + size - 1) / per_node) return false;
  return true;
}

int Solution::devicesUsed() const {
  int used = 0;
  for (int i = 0; i < pipelineRanks(); ++i) used += stages[i].devices();
  return used;
}

int Solution::pipelineRanks() const { return numStages() / std::max(1, virtual_stages); }

int Solution::firstRank(int s) const {
  int rank = 0;
  const int p = std::max(1, pipelineRanks());
  for (int i = 0; i < (virtual_stages > 1 ? s % p : s); ++i) rank += stages[i].devices();
  return rank;
}

void Solution::print(std::ostream &os) const {
  os << scheduleName(schedule) << (virtual_stages > 1 ? " v=" + std::to_string(virtual_stages) : "")
     << " M=" << microbatches;
  for (const Stage &s : stages)
    os << " [" << s.block_begin << "," << s.block_end << ")x" << s.replicas << (s.zero ? "z" : "")
       << (s.recompute ? "r" : "") << (s.tensor_parallel != 1 ? "t" + std::to_string(s.tensor_parallel) : "");
}

int64_t replicaSamples(int64_t batch_size, int microbatches, int replicas) {
  const int64_t per_microbatch = (batch_size + microbatches - 1) / microbatches;
  return (per_microbatch + replicas - 1) / replicas;
}

std::vector<int> microbatchCandidates(const Problem &p) {
  if (p.constraints.microbatches > 0) return {p.constraints.microbatches};
  const int64_t cap = p.constraints.max_microbatches > 0 ? p.constraints.max_microbatches : p.batch_size;
  std::vector<int> out;
  for (int64_t m = 1; m <= std::min<int64_t>(cap, p.batch_size); ++m)
    if (p.batch_size % m == 0) out.push_back(static_cast<int>(m));
  return out;
}

std::vector<int> replicaCandidates(const Problem &p, int microbatches) {
  const Constraints &c = p.constraints;
  if (!c.replicas.empty()) {
    std::set<int> distinct(c.replicas.begin(), c.replicas.end());
    return {distinct.begin(), distinct.end()};
  }
  const int64_t per_microbatch = (p.batch_size + microbatches - 1) / microbatches;
  const int limit = static_cast<int>(std::min<int64_t>(p.devices.count, per_microbatch));
  std::vector<int> out;
  int64_t prev_samples = 0;
  for (int r = 1; r <= limit; r = c.power_of_two_replicas ? 2 * r : r + 1) {
    const int64_t samples = (per_microbatch + r - 1) / r;
    if (r == 1 || samples < prev_samples) out.push_back(r);
    prev_samples = samples;
  }
  return out;
}

std::vector<int> tpCandidates(const Problem &p) {
  const std::vector<int> &pinned = p.constraints.tensor_parallel;
  if (!pinned.empty()) {
    std::set<int> distinct(pinned.begin(), pinned.end());
    return {distinct.begin(), distinct.end()};
  }
  if (p.tp_degrees.empty()) return {1};
  return p.tp_degrees;
}

std::string formatBytes(double bytes) { return rannc::formatBytes(bytes, ByteStyle::Long); }

} // namespace rannc::partition
