// ONNX recurrent layers: RNN, GRU, LSTM.
// Note [kernel conventions] in op_context.h holds for every kernel here.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "executor/runtime/kernels/helpers.h"
#include "executor/runtime/kernels/registry.h"

namespace rannc::runtime::kernels {
namespace {

/// Note [recurrent layers]
/// The loop over time is unrolled into ATen calls, so autograd differentiates
/// it (no cuDNN fused kernels: correctness first). Each direction runs the
/// same forward loop; the reverse direction reverses every sequence within its
/// length before and after. Steps past a sequence's length leave the state
/// unchanged and output zeros, as ONNX specifies.
using Activation = std::function<torch::Tensor(const torch::Tensor &)>;

/// The activation named `name`; alpha/beta come from the attribute lists,
/// consumed in order by the functions that take them.
Activation recurrentActivation(const OpCtx &c, std::string name, const std::vector<double> &alphas,
                               const std::vector<double> &betas, size_t &ai, size_t &bi) {
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
  auto next = [](const std::vector<double> &v, size_t &i, double dflt) {
    return i < v.size() ? v[i++] : dflt;
  };
  if (name == "sigmoid") return [](const torch::Tensor &x) { return torch::sigmoid(x); };
  if (name == "tanh") return [](const torch::Tensor &x) { return torch::tanh(x); };
  if (name == "relu") return [](const torch::Tensor &x) { return torch::relu(x); };
  if (name == "softsign") return [](const torch::Tensor &x) { return x / (torch::abs(x) + 1); };
  if (name == "softplus") return [](const torch::Tensor &x) { return torch::softplus(x); };
  if (name == "affine") {
    double a = next(alphas, ai, 1.0), b = next(betas, bi, 0.0);
    return [a, b](const torch::Tensor &x) { return x * a + b; };
  }
  if (name == "leakyrelu") {
    double a = next(alphas, ai, 0.01);
    return [a](const torch::Tensor &x) { return torch::leaky_relu(x, a); };
  }
  if (name == "thresholdedrelu") {
    double a = next(alphas, ai, 1.0);
    return [a](const torch::Tensor &x) { return torch::where(x > a, x, torch::zeros_like(x)); };
  }
  if (name == "scaledtanh") {
    double a = next(alphas, ai, 1.0), b = next(betas, bi, 1.0);
    return [a, b](const torch::Tensor &x) { return torch::tanh(x * b) * a; };
  }
  if (name == "hardsigmoid") {
    double a = next(alphas, ai, 0.2), b = next(betas, bi, 0.5);
    return [a, b](const torch::Tensor &x) { return torch::clamp(x * a + b, 0, 1); };
  }
  if (name == "elu") {
    double a = next(alphas, ai, 1.0);
    return [a](const torch::Tensor &x) { return torch::elu(x, a); };
  }
  c.fail("unsupported activation '" + name + "'");
}

/// Reverses each sequence of x ([T, B, ...]) within its length.
torch::Tensor reverseWithin(const torch::Tensor &x, const std::vector<int64_t> &lens) {
  if (lens.empty()) return x.flip(0);
  int64_t T = x.size(0), B = x.size(1);
  std::vector<int64_t> map(static_cast<size_t>(T * B));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b) {
      int64_t len = std::min(std::max<int64_t>(lens[size_t(b)], 0), T);
      map[size_t(t * B + b)] = t < len ? len - 1 - t : t;
    }
  std::vector<int64_t> shape(size_t(x.dim()), 1);
  shape[0] = T;
  shape[1] = B;
  torch::Tensor idx = longTensor(map, x.device()).reshape(shape).expand(x.sizes());
  return torch::gather(x, 0, idx);
}

enum class Cell { RNN, GRU, LSTM };

Outputs opRecurrent(const OpCtx &c, Cell cell) {
  const int64_t G = cell == Cell::RNN ? 1 : cell == Cell::GRU ? 3 : 4;
  const bool layout = c.attrInt("layout", 0) != 0;
  torch::Tensor X = layout ? c.in(0).transpose(0, 1) : c.in(0); // [T, B, I]
  const auto &W = c.in(1), &R = c.in(2);
  if (X.dim() != 3 || W.dim() != 3 || R.dim() != 3) c.fail("X, W and R must be 3-D");
  std::string direction = c.attrString("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    c.fail("unsupported direction '" + direction + "'");
  const int64_t D = direction == "bidirectional" ? 2 : 1;
  const int64_t H = c.attrInt("hidden_size", R.size(-1));
  const int64_t T = X.size(0), B = X.size(1);
  if (W.size(0) != D || W.size(1) != G * H || R.size(0) != D || R.size(1) != G * H || R.size(2) != H)
    c.fail("W or R does not match hidden_size " + std::to_string(H) + " and the direction");
  auto opts = X.options();
  torch::Tensor bias = c.has(3) ? c.in(3) : torch::zeros({D, 2 * G * H}, opts);
  std::vector<int64_t> lens;
  if (c.has(4)) {
    lens = intValues(c, c.in(4), "sequence_lens");
    if (int64_t(lens.size()) != B) c.fail("sequence_lens needs one entry per batch element");
    if (std::all_of(lens.begin(), lens.end(), [&](int64_t l) { return l == T; })) lens.clear();
  }
  auto state = [&](size_t i) {
    if (!c.has(i)) return torch::zeros({D, B, H}, opts);
    return layout ? c.in(i).transpose(0, 1) : c.in(i); // [D, B, H]
  };
  torch::Tensor h0 = state(5), c0 = cell == Cell::LSTM ? state(6) : torch::Tensor();
  torch::Tensor peep = cell == Cell::LSTM && c.has(7) ? c.in(7) : torch::Tensor();

  // Activations: per direction f (RNN); f, g (GRU); f, g, h (LSTM).
  std::vector<std::string> names = c.attrStrings("activations").value_or(std::vector<std::string>{});
  const size_t per_dir = cell == Cell::RNN ? 1 : cell == Cell::GRU ? 2 : 3;
  if (names.empty()) {
    if (cell == Cell::RNN) names = {"Tanh"};
    else if (cell == Cell::GRU) names = {"Sigmoid", "Tanh"};
    else names = {"Sigmoid", "Tanh", "Tanh"};
  }
  if (names.size() == per_dir && D == 2) names.insert(names.end(), names.begin(), names.end());
  if (names.size() != per_dir * size_t(D)) c.fail("activations has the wrong number of entries");
  std::vector<double> alphas = c.attrFloats("activation_alpha").value_or(std::vector<double>{});
  std::vector<double> betas = c.attrFloats("activation_beta").value_or(std::vector<double>{});
  size_t ai = 0, bi = 0;
  std::vector<Activation> acts;
  for (const auto &n : names) acts.push_back(recurrentActivation(c, n, alphas, betas, ai, bi));
  const bool clip = c.hasAttr("clip");
  const double clip_v = c.attrFloat("clip", 0.0);
  auto clipped = [&](const torch::Tensor &t) { return clip ? torch::clamp(t, -clip_v, clip_v) : t; };
  const bool lbr = c.attrInt("linear_before_reset", 0) != 0;
  const bool input_forget = c.attrInt("input_forget", 0) != 0;

  std::vector<torch::Tensor> ys, hs, cs;
  for (int64_t d = 0; d < D; ++d) {
    bool reverse = direction == "reverse" || d == 1;
    torch::Tensor xs = reverse ? reverseWithin(X, lens) : X;
    torch::Tensor wb = bias[d].narrow(0, 0, G * H), rb = bias[d].narrow(0, G * H, G * H);
    torch::Tensor xw = torch::matmul(xs, W[d].t()) + wb; // [T, B, G*H]
    torch::Tensor Rd = R[d];
    const Activation &f = acts[size_t(d) * per_dir];
    torch::Tensor h = h0[d], cst = cell == Cell::LSTM ? c0[d] : torch::Tensor();
    std::vector<torch::Tensor> steps;
    for (int64_t t = 0; t < T; ++t) {
      torch::Tensor x_t = xw[t], h_new, c_new;
      if (cell == Cell::RNN) {
        h_new = f(clipped(x_t + torch::matmul(h, Rd.t()) + rb));
      } else if (cell == Cell::GRU) {
        const Activation &g = acts[size_t(d) * per_dir + 1];
        torch::Tensor hzr = torch::matmul(h, Rd.narrow(0, 0, 2 * H).t()) + rb.narrow(0, 0, 2 * H);
        torch::Tensor z = f(clipped(x_t.narrow(1, 0, H) + hzr.narrow(1, 0, H)));
        torch::Tensor r = f(clipped(x_t.narrow(1, H, H) + hzr.narrow(1, H, H)));
        torch::Tensor Rh = Rd.narrow(0, 2 * H, H), rbh = rb.narrow(0, 2 * H, H);
        torch::Tensor pre = lbr ? x_t.narrow(1, 2 * H, H) + r * (torch::matmul(h, Rh.t()) + rbh)
                                : x_t.narrow(1, 2 * H, H) + torch::matmul(r * h, Rh.t()) + rbh;
        torch::Tensor hh = g(clipped(pre));
        h_new = (1 - z) * hh + z * h;
      } else {
        const Activation &g = acts[size_t(d) * per_dir + 1], &hact = acts[size_t(d) * per_dir + 2];
        torch::Tensor gates = x_t + torch::matmul(h, Rd.t()) + rb; // i, o, f, c
        torch::Tensor gi = gates.narrow(1, 0, H), go = gates.narrow(1, H, H);
        torch::Tensor gf = gates.narrow(1, 2 * H, H), gc = gates.narrow(1, 3 * H, H);
        if (peep.defined()) {
          gi = gi + peep[d].narrow(0, 0, H) * cst;
          gf = gf + peep[d].narrow(0, 2 * H, H) * cst;
        }
        torch::Tensor i = f(clipped(gi));
        torch::Tensor fg = input_forget ? 1 - i : f(clipped(gf));
        c_new = fg * cst + i * g(clipped(gc));
        if (peep.defined()) go = go + peep[d].narrow(0, H, H) * c_new;
        h_new = f(clipped(go)) * hact(c_new);
      }
      if (!lens.empty()) {
        std::vector<uint8_t> live(static_cast<size_t>(B));
        for (int64_t b = 0; b < B; ++b) live[size_t(b)] = t < lens[size_t(b)];
        torch::Tensor m = torch::tensor(c10::ArrayRef<uint8_t>(live), torch::kByte)
                              .to(X.device(), torch::kBool)
                              .unsqueeze(1);
        steps.push_back(torch::where(m, h_new, torch::zeros_like(h_new)));
        h = torch::where(m, h_new, h);
        if (cell == Cell::LSTM) cst = torch::where(m, c_new, cst);
      } else {
        steps.push_back(h_new);
        h = h_new;
        if (cell == Cell::LSTM) cst = c_new;
      }
    }
    torch::Tensor y = T > 0 ? torch::stack(steps) : torch::zeros({0, B, H}, opts);
    ys.push_back(reverse ? reverseWithin(y, lens) : y);
    hs.push_back(h);
    if (cell == Cell::LSTM) cs.push_back(cst);
  }
  torch::Tensor Y = torch::stack(ys, 1), Yh = torch::stack(hs), Yc;
  if (cell == Cell::LSTM) Yc = torch::stack(cs);
  if (layout) { // [B, T, D, H] and [B, D, H]
    Y = Y.permute({2, 0, 1, 3});
    Yh = Yh.transpose(0, 1);
    if (Yc.defined()) Yc = Yc.transpose(0, 1);
  }
  return {Y, Yh, Yc};
}
Outputs opRNN(const OpCtx &c) { return opRecurrent(c, Cell::RNN); }
Outputs opGRU(const OpCtx &c) { return opRecurrent(c, Cell::GRU); }
Outputs opLSTM(const OpCtx &c) { return opRecurrent(c, Cell::LSTM); }

} // namespace

std::vector<KernelDef> recurrentKernels() {
  return {
      {"GRU", 3, 6, opGRU},
      {"LSTM", 3, 8, opLSTM},
      {"RNN", 3, 6, opRNN},
  };
}

} // namespace rannc::runtime::kernels
