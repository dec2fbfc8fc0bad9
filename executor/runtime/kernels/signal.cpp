// ONNX signal processing (opset 17): DFT, STFT and the window functions.
// Note [kernel conventions] in op_context.h holds for every kernel here.
#include <cmath>

#include "executor/runtime/kernels/helpers.h"
#include "executor/runtime/kernels/registry.h"

namespace rannc::runtime::kernels {
namespace {

/// [..., 1] real or [..., 2] complex ONNX signal -> a torch complex/real tensor.
torch::Tensor signalOf(const OpCtx &c, const torch::Tensor &x) {
  if (x.dim() < 2 || (x.size(-1) != 1 && x.size(-1) != 2))
    c.fail("signal must end in a dimension of 1 (real) or 2 (complex)");
  if (x.size(-1) == 1) return x.select(-1, 0);
  return torch::view_as_complex(x.contiguous());
}

Outputs opDFT(const OpCtx &c) {
  const auto &x = c.in(0);
  torch::Tensor s = signalOf(c, x);
  int64_t axis = normAxis(c, c.attrInt("axis", 1), x.dim());
  if (axis == x.dim() - 1) c.fail("axis cannot be the last (real/imaginary) dimension");
  c10::optional<int64_t> n;
  if (c.has(1) && c.in(1).numel() > 0) n = intScalar(c, c.in(1), "dft_length");
  bool inverse = c.attrInt("inverse", 0) != 0, onesided = c.attrInt("onesided", 0) != 0;
  torch::Tensor y;
  if (inverse) {
    if (onesided) c.fail("onesided inverse DFT is not supported");
    y = torch::fft_ifft(s, n, axis);
  } else {
    y = torch::fft_fft(s, n, axis);
    if (onesided) y = y.narrow(axis, 0, y.size(axis) / 2 + 1);
  }
  return {torch::view_as_real(y).contiguous()};
}

Outputs opSTFT(const OpCtx &c) {
  const auto &x = c.in(0);
  torch::Tensor s = signalOf(c, x);
  if (s.dim() != 2) c.fail("signal must be [batch, length, 1 or 2]");
  int64_t step = intScalar(c, c.in(1), "frame_step");
  torch::Tensor window = c.has(2) && c.in(2).numel() > 0 ? c.in(2) : torch::Tensor();
  int64_t len = c.has(3) && c.in(3).numel() > 0 ? intScalar(c, c.in(3), "frame_length")
                : window.defined()                ? window.size(0)
                                                  : -1;
  if (len <= 0 || step <= 0) c.fail("needs a positive frame_step and a window or frame_length");
  if (len > s.size(1)) c.fail("frame_length exceeds the signal length");
  torch::Tensor frames = s.unfold(1, len, step); // [batch, frames, len]
  if (window.defined()) frames = frames * window.to(x.scalar_type());
  bool onesided = c.attrInt("onesided", 1) != 0 && !frames.is_complex();
  torch::Tensor y =
      onesided ? torch::fft_rfft(frames, c10::nullopt, -1) : torch::fft_fft(frames, c10::nullopt, -1);
  return {torch::view_as_real(y).contiguous()};
}

/// Generalised cosine windows: a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N).
Outputs cosineWindow(const OpCtx &c, double a0, double a1, double a2) {
  int64_t size = intScalar(c, c.in(0), "size");
  if (size < 0) c.fail("size must be non-negative");
  bool periodic = c.attrInt("periodic", 1) != 0;
  double N = double(periodic ? size : size - 1);
  torch::Tensor n = torch::arange(size, torch::kDouble);
  torch::Tensor w = a0 - a1 * torch::cos(2 * M_PI * n / N) + a2 * torch::cos(4 * M_PI * n / N);
  return {w.to(c.in(0).device(), onnxScalarType(c, c.attrInt("output_datatype", 1)))};
}
Outputs opHannWindow(const OpCtx &c) { return cosineWindow(c, 0.5, 0.5, 0); }
Outputs opHammingWindow(const OpCtx &c) { return cosineWindow(c, 25.0 / 46, 21.0 / 46, 0); }
Outputs opBlackmanWindow(const OpCtx &c) { return cosineWindow(c, 0.42, 0.5, 0.08); }

} // namespace

std::vector<KernelDef> signalKernels() {
  return {
      {"BlackmanWindow", 1, 1, opBlackmanWindow},
      {"DFT", 1, 2, opDFT},
      {"HammingWindow", 1, 1, opHammingWindow},
      {"HannWindow", 1, 1, opHannWindow},
      {"STFT", 2, 4, opSTFT},
  };
}

} // namespace rannc::runtime::kernels
