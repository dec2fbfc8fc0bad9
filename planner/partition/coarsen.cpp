#include "planner/partition/coarsen.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace rannc::partition {

// Note [whole cuts in coarsening]
// A stage of tensor-parallel degree t > 1 starts and ends at whole cuts
// (Problem::cut_whole, Note [tensor parallel stages] in evaluate.cpp), but
// the blocks' boundaries are chosen for balance and cut bytes alone. With a
// degree above 1 pinned for every stage, only the whole boundaries the
// balance happened to pick are of use to the DP. GPT 145.6B has 642 units and
// 163 whole cuts (two a layer); on 1536 devices (200 blocks, Note [block
// count] in planner/driver/planner.cpp) 41 of the 201 block boundaries were
// whole and none between blocks 118 and 198, so the last stage had to hold
// half the layers and --tensor-parallel 2, 4 or 8 found no plan there (nor
// 8 on 1280 devices, 224 blocks), while 232 blocks on 1152 devices happened to
// keep enough. So when every searched degree is above 1, cuts that are not
// whole are forbidden like infinite ones: no stage could border them, so no
// plan over the units is lost, and every block boundary is one a stage may
// use.
//
// With degree 1 searched too, a stage of degree 1 may border any cut, but the
// tensor-parallel stages still need whole ones: choosing boundaries for
// balance alone left GPT 1008B (3072 devices, 144 blocks) without enough
// whole boundaries for any tensor-parallel plan, and a replicated block needs
// 89.9 GiB; on GPT 145.6B it kept 41 of 163 whole cuts, so the auto search
// could not express Megatron's 8 x 8 x 24 and planned a slower step (27.17 s)
// than that pinned configuration (25.69 s). So whole cuts come first: when
// the whole pieces are at most K, every whole cut is a block boundary (no
// block spans one), and the rest of the K blocks cut elsewhere for balance;
// every boundary a pinned-degree coarsening could pick is then available,
// and the block space of every degree contains the pinned one's. When there
// are more whole pieces than K, the blocks cut only at whole cuts, as with
// a pinned degree. Stages of degree 1 then lose the cuts inside layers; like
// every coarsening this is a restriction of the search the DP's statement
// does not cover (it covers the blocks). Problems whose units are at most K
// (every cut a boundary) are unchanged.

Expected<Coarsening> coarsen(const Problem &units, const CoarsenOptions &opts) {
  const int n = units.numBlocks();
  if (opts.max_blocks < 1) return Error{"coarsen: at most " + std::to_string(opts.max_blocks) + " blocks asked"};
  if (!(opts.imbalance >= 1)) return Error{"coarsen: imbalance must be >= 1"};
  if (!(opts.samples > 0)) return Error{"coarsen: samples must be positive"};
  // Validate with the forbidden cuts (infinite bytes) blanked out.
  Problem check = units;
  std::vector<bool> allowed(n + 1, true);
  for (int i = 1; i < n && i < static_cast<int>(check.cut_bytes_per_sample.size()); ++i)
    if (std::isinf(check.cut_bytes_per_sample[i]) && check.cut_bytes_per_sample[i] > 0) {
      allowed[i] = false;
      check.cut_bytes_per_sample[i] = 0;
    }
  // Whole cuts first where a degree above 1 is searched (Note [whole cuts in
  // coarsening]): only those when every degree is above 1 or they give at
  // least K pieces, else each of them a boundary no block spans.
  const std::vector<int> degrees = tpCandidates(units);
  std::vector<bool> forced(n + 1, false);
  if (!units.cut_whole.empty() && degrees.back() > 1) {
    int whole_pieces = 1;
    for (int i = 1; i < n; ++i) whole_pieces += allowed[i] && units.cutWhole(i);
    const bool only_whole = degrees.front() > 1 || whole_pieces >= opts.max_blocks;
    for (int i = 1; i < n; ++i)
      if (!units.cutWhole(i)) allowed[i] = allowed[i] && !only_whole;
      else forced[i] = allowed[i] && !only_whole;
  }
  // (the unsaved bytes, which a blanked cut would contradict, the DP validates)
  check.unsaved_cut_bytes_per_sample.clear();
  for (Block &b : check.blocks) b.unsaved_freed_bytes_per_sample = 0;
  if (Status st = validate(check); !st) return Error{"coarsen: " + st.message()};

  // Unit costs: share of time plus share of parameters.
  double total_time = 0, total_params = 0;
  for (const Block &u : units.blocks) {
    total_time += u.fwd.at(opts.samples) + u.bwd.at(opts.samples);
    total_params += u.param_bytes;
  }
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    const Block &u = units.blocks[i];
    double cost = 0;
    if (total_time > 0) cost += (u.fwd.at(opts.samples) + u.bwd.at(opts.samples)) / total_time;
    if (total_params > 0) cost += u.param_bytes / total_params;
    prefix[i + 1] = prefix[i] + cost;
  }
  std::vector<int> positions; // allowed cut positions, 0 and n included
  for (int i = 0; i <= n; ++i)
    if (allowed[i]) positions.push_back(i);
  const int pieces = static_cast<int>(positions.size()) - 1;
  const int K = std::min(opts.max_blocks, pieces);
  double largest_piece = 0, max_cut = 0;
  for (int j = 0; j + 1 < static_cast<int>(positions.size()); ++j)
    largest_piece = std::max(largest_piece, prefix[positions[j + 1]] - prefix[positions[j]]);
  for (int j = 1; j + 1 < static_cast<int>(positions.size()); ++j)
    max_cut = std::max(max_cut, units.cut_bytes_per_sample[positions[j]]);
  const double avg = prefix[n] / K;

  // best[j][q]: the smallest objective splitting units [0, positions[q]) into j blocks.
  const int P = static_cast<int>(positions.size());
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<int> chosen;
  for (double cap = std::max(opts.imbalance * avg, largest_piece);; cap *= 2) {
    std::vector<std::vector<double>> best(K + 1, std::vector<double>(P, inf));
    std::vector<std::vector<int>> from(K + 1, std::vector<int>(P, -1));
    best[0][0] = 0;
    for (int j = 1; j <= K; ++j)
      for (int q = j; q < P; ++q) {
        const double cut_term = q + 1 < P && max_cut > 0 ? units.cut_bytes_per_sample[positions[q]] / max_cut : 0;
        for (int h = q - 1; h >= j - 1; --h) {
          if (h < q - 1 && forced[positions[h + 1]]) break; // no block spans a forced boundary
          const double cost = prefix[positions[q]] - prefix[positions[h]];
          if (cost > cap * (1 + 1e-12)) break; // earlier starts only cost more
          if (best[j - 1][h] == inf) continue;
          const double dev = avg > 0 ? cost / avg - 1 : 0;
          const double v = best[j - 1][h] + dev * dev + cut_term;
          if (v < best[j][q]) best[j][q] = v, from[j][q] = h;
        }
      }
    if (best[K][P - 1] == inf) continue;
    for (int j = K, q = P - 1; j > 0; --j) {
      chosen.push_back(positions[q]);
      q = from[j][q];
    }
    chosen.push_back(0);
    std::reverse(chosen.begin(), chosen.end());
    break;
  }

  Coarsening out;
  out.unit_begin = chosen;
  out.problem = units;
  out.problem.blocks.clear();
  out.problem.cut_bytes_per_sample.clear();
  out.problem.unsaved_cut_bytes_per_sample.clear();
  out.problem.wgrad_read_cut_bytes_per_sample.clear();
  out.problem.received_layout_cut_bytes_per_sample.clear();
  out.problem.cut_whole.clear();
  for (int b = 0; b < K; ++b) {
    Block blk;
    blk.tp.working_bytes_per_sample = blk.tp.working_fixed_bytes = std::numeric_limits<double>::infinity();
    for (int i = chosen[b]; i < chosen[b + 1]; ++i) {
      const Block &u = units.blocks[i];
      blk.fwd.fixed_s += u.fwd.fixed_s;
      blk.fwd.per_sample_s += u.fwd.per_sample_s;
      blk.bwd.fixed_s += u.bwd.fixed_s;
      blk.bwd.per_sample_s += u.bwd.per_sample_s;
      blk.wgrad.fixed_s += u.wgrad.fixed_s;
      blk.wgrad.per_sample_s += u.wgrad.per_sample_s;
      blk.wgrad_bytes_per_sample += u.wgrad_bytes_per_sample;
      blk.wgrad_param_bytes += u.wgrad_param_bytes;
      blk.param_bytes += u.param_bytes;
      blk.largest_param_bytes = std::max(blk.largest_param_bytes, u.largest_param_bytes);
      blk.tp.largest_param_bytes = std::max(blk.tp.largest_param_bytes, u.tp.largest_param_bytes);
      blk.buffer_bytes += u.buffer_bytes;
      blk.lowp_weight_bytes += u.lowp_weight_bytes;
      blk.activation_bytes_per_sample += u.activation_bytes_per_sample;
      blk.unsaved_freed_bytes_per_sample += u.unsaved_freed_bytes_per_sample; // Note [unsaved values]
      blk.stat_sync_bytes += u.stat_sync_bytes;
      blk.stat_sync_collectives += u.stat_sync_collectives;
      // The largest of the units' affine working bytes, bounded by one line.
      blk.working_bytes_per_sample = std::max(blk.working_bytes_per_sample, u.working_bytes_per_sample);
      blk.working_fixed_bytes = std::max(blk.working_fixed_bytes, u.working_fixed_bytes);
      // Tensor-parallel parts add up, but of the working bytes only the least
      // split part is sure to divide (the whole being the units' largest).
      Block::Split &t = blk.tp;
      t.fwd.fixed_s += u.tp.fwd.fixed_s;
      t.fwd.per_sample_s += u.tp.fwd.per_sample_s;
      t.bwd.fixed_s += u.tp.bwd.fixed_s;
      t.bwd.per_sample_s += u.tp.bwd.per_sample_s;
      t.param_bytes += u.tp.param_bytes;
      t.lowp_weight_bytes += u.tp.lowp_weight_bytes;
      t.activation_bytes_per_sample += u.tp.activation_bytes_per_sample;
      t.collective_bytes_per_sample += u.tp.collective_bytes_per_sample;
      t.collectives += u.tp.collectives;
      t.working_bytes_per_sample = std::min(t.working_bytes_per_sample, u.tp.working_bytes_per_sample);
      t.working_fixed_bytes = std::min(t.working_fixed_bytes, u.tp.working_fixed_bytes);
    }
    out.problem.blocks.push_back(blk);
    if (!units.cut_whole.empty()) out.problem.cut_whole.push_back(units.cut_whole[chosen[b]]);
    out.problem.cut_bytes_per_sample.push_back(units.cut_bytes_per_sample[chosen[b]]);
    if (!units.unsaved_cut_bytes_per_sample.empty())
      out.problem.unsaved_cut_bytes_per_sample.push_back(units.unsavedCutAt(chosen[b]));
    if (!units.wgrad_read_cut_bytes_per_sample.empty())
      out.problem.wgrad_read_cut_bytes_per_sample.push_back(units.wgradReadCutAt(chosen[b]));
    if (!units.received_layout_cut_bytes_per_sample.empty()) // Note [received layout]
      out.problem.received_layout_cut_bytes_per_sample.push_back(units.receivedLayoutAt(chosen[b]));
  }
  // Note [values passing over]: a span over whole blocks stays.
  out.problem.pass_over.clear();
  auto blockOf = [&](int u) {
    return static_cast<int>(std::upper_bound(chosen.begin(), chosen.end(), u) - chosen.begin()) - 1;
  };
  for (const Problem::PassOver &s : units.pass_over)
    if (blockOf(s.to) - blockOf(s.from) >= 2)
      out.problem.pass_over.push_back({blockOf(s.from), blockOf(s.to), s.bytes_per_sample});
  for (Problem::Tied &x : out.problem.tied) // Note [tied parameters]: the blocks of the reading units
    for (int &u : x.blocks) u = static_cast<int>(std::upper_bound(chosen.begin(), chosen.end(), u) - chosen.begin()) - 1;
  out.problem.cut_bytes_per_sample.push_back(units.cut_bytes_per_sample[n]);
  if (!units.unsaved_cut_bytes_per_sample.empty())
    out.problem.unsaved_cut_bytes_per_sample.push_back(units.unsavedCutAt(n));
  if (!units.wgrad_read_cut_bytes_per_sample.empty())
    out.problem.wgrad_read_cut_bytes_per_sample.push_back(units.wgradReadCutAt(n));
  if (!units.received_layout_cut_bytes_per_sample.empty())
    out.problem.received_layout_cut_bytes_per_sample.push_back(units.receivedLayoutAt(n));
  if (!units.cut_whole.empty()) out.problem.cut_whole.push_back(units.cut_whole[n]);
  return out;
}

Solution expandToUnits(const Coarsening &c, const Solution &blocks) {
  Solution out = blocks;
  for (Stage &s : out.stages) {
    s.block_begin = c.unit_begin[s.block_begin];
    s.block_end = c.unit_begin[s.block_end];
  }
  return out;
}

} // namespace rannc::partition
