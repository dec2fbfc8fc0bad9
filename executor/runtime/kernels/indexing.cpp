// ONNX indexing and selection: gathers, scatters, OneHot, TopK, Compress,
// NonZero, Unique, NonMaxSuppression.
// Note [kernel conventions] in op_context.h holds for every kernel here.
#include <algorithm>
#include <string>
#include <vector>

#include "executor/runtime/kernels/helpers.h"
#include "executor/runtime/kernels/registry.h"

namespace rannc::runtime::kernels {
namespace {

Outputs opGather(const OpCtx &c) {
  const auto &x = c.in(0);
  torch::Tensor idx = c.in(1);
  if (!isIntegral(idx)) c.fail("indices must be integers");
  int64_t axis = normAxis(c, c.attrInt("axis", 0), x.dim());
  idx = idx.to(torch::kLong);
  idx = torch::where(idx < 0, idx + x.size(axis), idx); // negative counts from the back
  // An embedding's padding row: looked up, never trained (Note [embedding
  // padding row] in planner/import/onnx_signature.cpp).
  if (const int64_t pad = c.attrInt("padding_idx", -1); pad >= 0 && axis == 0 && x.dim() == 2)
    return {torch::embedding(x, idx, pad)};
  // Output shape: x.shape[:axis] + indices.shape + x.shape[axis+1:].
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().begin() + axis);
  shape.insert(shape.end(), idx.sizes().begin(), idx.sizes().end());
  shape.insert(shape.end(), x.sizes().begin() + axis + 1, x.sizes().end());
  return {torch::index_select(x, axis, idx.reshape({-1})).reshape(shape)};
}

Outputs opGatherElements(const OpCtx &c) {
  const auto &x = c.in(0);
  torch::Tensor idx = c.in(1);
  if (!isIntegral(idx)) c.fail("indices must be integers");
  int64_t axis = normAxis(c, c.attrInt("axis", 0), x.dim());
  idx = idx.to(torch::kLong);
  idx = torch::where(idx < 0, idx + x.size(axis), idx);
  return {torch::gather(x, axis, idx)};
}

Outputs opTopK(const OpCtx &c) {
  const auto &x = c.in(0);
  int64_t k = c.opset() >= 10 ? intScalar(c, c.in(1), "K") : c.attrInt("k");
  int64_t axis = normAxis(c, c.attrInt("axis", -1), x.dim());
  if (k < 0 || k > x.size(axis))
    c.fail("K = " + std::to_string(k) + " is outside [0, " + std::to_string(x.size(axis)) + "]");
  // A stable sort keeps equal values in index order, as ONNX requires.
  auto [values, indices] = torch::sort(x, /*stable=*/true, axis, /*descending=*/c.attrInt("largest", 1) != 0);
  return {values.narrow(axis, 0, k), indices.narrow(axis, 0, k)};
}

Outputs opOneHot(const OpCtx &c) {
  const auto &indices = c.in(0), &depth_t = c.in(1), &values = c.in(2);
  if (values.numel() != 2) c.fail("values must hold [off_value, on_value]");
  if (depth_t.numel() != 1) c.fail("depth must have one element");
  int64_t depth = depth_t.is_floating_point() ? int64_t(depth_t.reshape({-1})[0].item<double>())
                                              : intScalar(c, depth_t, "depth");
  if (depth <= 0) c.fail("depth must be positive");
  int64_t axis = normAxis(c, c.attrInt("axis", -1), indices.dim() + 1);
  torch::Tensor idx = indices.to(torch::kLong); // float indices truncate
  idx = torch::where(idx < 0, idx + depth, idx);
  std::vector<int64_t> shape(size_t(indices.dim() + 1), 1);
  shape[axis] = depth;
  torch::Tensor hit = idx.unsqueeze(axis) == torch::arange(depth, idx.options()).reshape(shape);
  torch::Tensor v = values.reshape({-1});
  return {torch::where(hit, v[1], v[0])};
}

torch::Tensor wrapIndices(const OpCtx &c, torch::Tensor idx, int64_t size) {
  if (!isIntegral(idx)) c.fail("indices must be integers");
  idx = idx.to(torch::kLong);
  return torch::where(idx < 0, idx + size, idx);
}

Outputs opScatterElements(const OpCtx &c) {
  const auto &data = c.in(0), &updates = c.in(2);
  int64_t axis = normAxis(c, c.attrInt("axis", 0), data.dim());
  torch::Tensor idx = wrapIndices(c, c.in(1), data.size(axis));
  std::string r = c.attrString("reduction", "none");
  if (r == "none") return {torch::scatter(data, axis, idx, updates)};
  if (r == "add") return {torch::scatter_add(data, axis, idx, updates)};
  if (r == "mul") return {torch::scatter_reduce(data, axis, idx, updates, "prod", true)};
  if (r == "max") return {torch::scatter_reduce(data, axis, idx, updates, "amax", true)};
  if (r == "min") return {torch::scatter_reduce(data, axis, idx, updates, "amin", true)};
  c.fail("unsupported reduction '" + r + "'");
}

/// Row numbers of the index tuples in idx's last dimension over dims `lead`.
torch::Tensor linearIndex(const OpCtx &c, const torch::Tensor &idx, c10::IntArrayRef lead) {
  if (!isIntegral(idx)) c.fail("indices must be integers");
  torch::Tensor li = idx.to(torch::kLong);
  torch::Tensor lin = torch::zeros(li.sizes().slice(0, li.dim() - 1), li.options());
  for (size_t i = 0; i < lead.size(); ++i) {
    torch::Tensor comp = li.select(-1, int64_t(i));
    comp = torch::where(comp < 0, comp + lead[i], comp);
    lin = lin * lead[i] + comp;
  }
  return lin;
}

Outputs opScatterND(const OpCtx &c) {
  const auto &data = c.in(0), &updates = c.in(2), &idx = c.in(1);
  if (idx.dim() < 1) c.fail("indices must have rank >= 1");
  int64_t k = idx.size(-1);
  if (k > data.dim()) c.fail("index tuples are longer than the data's rank");
  c10::IntArrayRef lead = data.sizes().slice(0, k);
  int64_t rows = product(lead), rest = product(data.sizes().slice(k));
  // Rows of data viewed as [rows, rest]; each update row goes to one of them.
  torch::Tensor lin = linearIndex(c, idx, lead).reshape({-1, 1});
  torch::Tensor d2 = data.reshape({rows, rest}), u2 = updates.reshape({lin.size(0), rest});
  torch::Tensor at = lin.expand({lin.size(0), rest});
  std::string r = c.attrString("reduction", "none");
  torch::Tensor y;
  if (r == "none") y = d2.scatter(0, at, u2);
  else if (r == "add") y = d2.scatter_add(0, at, u2);
  else if (r == "mul") y = d2.scatter_reduce(0, at, u2, "prod", true);
  else if (r == "max") y = d2.scatter_reduce(0, at, u2, "amax", true);
  else if (r == "min") y = d2.scatter_reduce(0, at, u2, "amin", true);
  else c.fail("unsupported reduction '" + r + "'");
  return {y.reshape(data.sizes())};
}

Outputs opGatherND(const OpCtx &c) {
  const auto &data = c.in(0), &idx = c.in(1);
  int64_t b = c.attrInt("batch_dims", 0);
  if (idx.dim() < 1 || b < 0 || b >= idx.dim()) c.fail("bad batch_dims for the indices' rank");
  int64_t k = idx.size(-1);
  if (b + k > data.dim()) c.fail("index tuples are longer than the data's rank");
  c10::IntArrayRef batch = data.sizes().slice(0, b), lead = data.sizes().slice(b, k);
  c10::IntArrayRef rest = data.sizes().slice(b + k);
  int64_t nb = product(batch), rows = product(lead);
  int64_t per_batch = product(idx.sizes().slice(b, idx.dim() - 1 - b));
  // Row of each tuple in data viewed as [batch * rows, rest].
  torch::Tensor lin = linearIndex(c, idx, lead).reshape({nb, per_batch});
  lin = lin + torch::arange(nb, lin.options()).unsqueeze(1) * rows;
  torch::Tensor out = data.reshape({nb * rows, product(rest)}).index_select(0, lin.reshape({-1}));
  std::vector<int64_t> shape(batch.begin(), batch.end());
  shape.insert(shape.end(), idx.sizes().begin() + b, idx.sizes().end() - 1);
  shape.insert(shape.end(), rest.begin(), rest.end());
  return {out.reshape(shape)};
}

Outputs opCompress(const OpCtx &c) {
  torch::Tensor x = c.in(0);
  torch::Tensor cond = c.in(1).reshape({-1}).to(torch::kBool);
  int64_t axis = 0;
  if (c.hasAttr("axis")) axis = normAxis(c, c.attrInt("axis"), x.dim());
  else x = x.reshape({-1});
  int64_t n = std::min(cond.size(0), x.size(axis));
  return {x.index_select(axis, torch::nonzero(cond.narrow(0, 0, n)).reshape({-1}))};
}

Outputs opNonZero(const OpCtx &c) { return {torch::nonzero(c.in(0)).t().contiguous()}; }

/// Lexicographic order of the rows of a contiguous [n, m] double tensor.
struct RowLess {
  const double *p;
  int64_t m;
  bool operator()(int64_t a, int64_t b) const {
    return std::lexicographical_compare(p + a * m, p + a * m + m, p + b * m, p + b * m + m);
  }
};

Outputs opUnique(const OpCtx &c) {
  const auto &x = c.in(0);
  bool has_axis = c.hasAttr("axis");
  int64_t axis = has_axis ? normAxis(c, c.attrInt("axis"), x.dim()) : 0;
  torch::Tensor flat = has_axis ? x : x.reshape({-1});
  int64_t n = flat.size(axis);
  torch::Tensor rows =
      flat.movedim(axis, 0).reshape({n, -1}).detach().to(torch::kCPU, torch::kDouble).contiguous();
  RowLess less{rows.data_ptr<double>(), rows.size(1)};
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[size_t(i)] = i;
  std::stable_sort(order.begin(), order.end(), less);
  // Groups of equal rows in sorted order; a group's first member is its
  // first occurrence (the sort is stable).
  std::vector<int64_t> first, count, group_of(static_cast<size_t>(n));
  for (size_t i = 0; i < order.size(); ++i) {
    if (i == 0 || less(order[i - 1], order[i])) {
      first.push_back(order[i]);
      count.push_back(0);
    }
    ++count.back();
    group_of[size_t(order[i])] = int64_t(first.size()) - 1;
  }
  std::vector<int64_t> pos(first.size()); // output position of each group
  for (size_t g = 0; g < pos.size(); ++g) pos[g] = int64_t(g);
  if (!c.attrInt("sorted", 1))
    std::sort(pos.begin(), pos.end(), [&](int64_t a, int64_t b) { return first[a] < first[b]; });
  std::vector<int64_t> out_first(first.size()), out_count(first.size()), rank(first.size());
  for (size_t p = 0; p < pos.size(); ++p) {
    out_first[p] = first[size_t(pos[p])];
    out_count[p] = count[size_t(pos[p])];
    rank[size_t(pos[p])] = int64_t(p);
  }
  std::vector<int64_t> inverse(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) inverse[size_t(i)] = rank[size_t(group_of[size_t(i)])];
  torch::Tensor idx = longTensor(out_first, x.device());
  return {flat.index_select(axis, idx), idx, longTensor(inverse, x.device()),
          longTensor(out_count, x.device())};
}

Outputs opNonMaxSuppression(const OpCtx &c) {
  torch::Tensor boxes = c.in(0).detach().to(torch::kCPU, torch::kDouble).contiguous();
  torch::Tensor scores = c.in(1).detach().to(torch::kCPU, torch::kDouble).contiguous();
  if (boxes.dim() != 3 || boxes.size(2) != 4) c.fail("boxes must be [batch, boxes, 4]");
  if (scores.dim() != 3 || scores.size(0) != boxes.size(0) || scores.size(2) != boxes.size(1))
    c.fail("scores must be [batch, classes, boxes]");
  int64_t max_out = c.has(2) && c.in(2).numel() > 0 ? intScalar(c, c.in(2), "max_output_boxes_per_class") : 0;
  double iou_max = c.has(3) && c.in(3).numel() > 0 ? c.in(3).reshape({-1})[0].item<double>() : 0.0;
  bool has_min = c.has(4) && c.in(4).numel() > 0;
  double score_min = has_min ? c.in(4).reshape({-1})[0].item<double>() : 0.0;
  bool center = c.attrInt("center_point_box", 0) != 0;
  int64_t B = boxes.size(0), N = boxes.size(1), C = scores.size(1);
  const double *bp = boxes.data_ptr<double>(), *sp = scores.data_ptr<double>();
  // Corners (y1, x1, y2, x2) with y1 <= y2 and x1 <= x2.
  auto corners = [&](int64_t b, int64_t i, double out[4]) {
    const double *p = bp + (b * N + i) * 4;
    if (center) {
      out[0] = p[1] - p[3] / 2;
      out[1] = p[0] - p[2] / 2;
      out[2] = p[1] + p[3] / 2;
      out[3] = p[0] + p[2] / 2;
    } else {
      out[0] = std::min(p[0], p[2]);
      out[1] = std::min(p[1], p[3]);
      out[2] = std::max(p[0], p[2]);
      out[3] = std::max(p[1], p[3]);
    }
  };
  auto overlaps = [&](int64_t b, int64_t i, int64_t j) {
    double p[4], q[4];
    corners(b, i, p);
    corners(b, j, q);
    double ih = std::min(p[2], q[2]) - std::max(p[0], q[0]);
    double iw = std::min(p[3], q[3]) - std::max(p[1], q[1]);
    if (ih <= 0 || iw <= 0) return false;
    double inter = ih * iw;
    double uni = (p[2] - p[0]) * (p[3] - p[1]) + (q[2] - q[0]) * (q[3] - q[1]) - inter;
    return uni > 0 && inter / uni > iou_max;
  };
  std::vector<int64_t> out;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < C; ++k) {
      const double *s = sp + (b * C + k) * N;
      std::vector<int64_t> cand;
      for (int64_t i = 0; i < N; ++i)
        if (!has_min || s[i] > score_min) cand.push_back(i);
      std::stable_sort(cand.begin(), cand.end(), [&](int64_t i, int64_t j) { return s[i] > s[j]; });
      std::vector<int64_t> kept;
      for (int64_t i : cand) {
        if (int64_t(kept.size()) >= max_out) break;
        if (std::none_of(kept.begin(), kept.end(), [&](int64_t j) { return overlaps(b, i, j); }))
          kept.push_back(i);
      }
      for (int64_t i : kept) out.insert(out.end(), {b, k, i});
    }
  return {longTensor(out, c.in(0).device()).reshape({int64_t(out.size() / 3), 3})};
}

} // namespace

std::vector<KernelDef> indexingKernels() {
  return {
      {"Compress", 2, 2, opCompress},
      {"Gather", 2, 2, opGather},
      {"GatherElements", 2, 2, opGatherElements},
      {"GatherND", 2, 2, opGatherND},
      {"NonMaxSuppression", 2, 5, opNonMaxSuppression},
      {"NonZero", 1, 1, opNonZero},
      {"OneHot", 3, 3, opOneHot},
      {"Scatter", 3, 3, opScatterElements}, // opsets 9-10: ScatterElements' old name
      {"ScatterElements", 3, 3, opScatterElements},
      {"ScatterND", 3, 3, opScatterND},
      {"TopK", 1, 2, opTopK},
      {"Unique", 1, 1, opUnique},
  };
}

} // namespace rannc::runtime::kernels
