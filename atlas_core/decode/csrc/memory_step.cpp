// One decode token of a delta-family memory layer after its input projection, for B rows, all
// float32 and contiguous (atlas_core/decode/blocks.py, MemoryStep, holds the readable reference):
//
//   raw[b, 0:C]   the q, k, v projections (C = 2 H Dk + Hv Dv), read with row stride raw_stride
//   conv          the rolling buffer [B, K, C] of the short convolution (K = 0: none) and its
//                 weights conv_w [K, C]: shift by one token, append raw, sum over the window
//   silu          q, k, v through SiLU;  l2: q and k normalised per head, x / sqrt(|x|^2 + eps)
//                 (eps = 0: x / max(|x|, 1e-12));  q scaled by q_scale
//   M [B, Hv, Dv, Dk]  the memory, updated in place, one row of Dk at a time (each row of M only
//                 needs its own value entry):  retention 1 ("before"): m = alpha m;
//                 err = m . k - v_i;  step = theta err;  retention 2 ("after"): m = alpha m;
//                 m -= step k;  y_i = m . q (read_before: with m as it came in)
//   norm          y per value head through RMSNorm over Dv (weight norm_w, eps norm_eps)
//   gate          y *= sigmoid(g) (gate_kind 1) or silu(g) (2), g = gate[b, 0:Hv Dv], row stride
//                 gate_stride
//   y [B, Hv Dv]  the output
//
// Value head hv reads key head hv / (Hv / H) (grouped value heads). theta, alpha: [B, Hv] or 0.
#include <ATen/Parallel.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

inline float silu(float v) { return v / (1.f + std::exp(-v)); }
inline float sigmoid(float v) { return 1.f / (1.f + std::exp(-v)); }

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void normalise(float* x, int64_t n, float eps) {
  float ss = dot(x, x, n);
  float inv = eps == 0.f ? 1.f / std::max(std::sqrt(ss), 1e-12f) : 1.f / std::sqrt(ss + eps);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace

void memory_step(uintptr_t raw_p, int64_t raw_stride, uintptr_t conv_p, uintptr_t conv_w_p, int64_t K,
                 bool act_silu, int64_t H, int64_t Hv, int64_t Dk, int64_t Dv, bool l2, double l2_eps,
                 double q_scale, uintptr_t theta_p, uintptr_t alpha_p, int64_t retention, bool read_before,
                 uintptr_t M_p, uintptr_t norm_w_p, double norm_eps, bool norm, uintptr_t gate_p,
                 int64_t gate_stride, int64_t gate_kind, uintptr_t y_p, int64_t B) {
  const float* raw = reinterpret_cast<const float*>(raw_p);
  float* conv = reinterpret_cast<float*>(conv_p);
  const float* conv_w = reinterpret_cast<const float*>(conv_w_p);
  const float* theta = reinterpret_cast<const float*>(theta_p);
  const float* alpha = reinterpret_cast<const float*>(alpha_p);
  float* M = reinterpret_cast<float*>(M_p);
  const float* norm_w = reinterpret_cast<const float*>(norm_w_p);
  const float* gate = reinterpret_cast<const float*>(gate_p);
  float* y = reinterpret_cast<float*>(y_p);
  const int64_t Cq = H * Dk, C = 2 * Cq + Hv * Dv, G = Hv / H;
  pybind11::gil_scoped_release nogil;

  // q, k, v of every row: the convolution, the activation, the norms (a few thousand values)
  std::vector<float> qkv(B * C);
  for (int64_t b = 0; b < B; ++b) {
    float* out = qkv.data() + b * C;
    const float* r = raw + b * raw_stride;
    if (K > 0) {
      float* buf = conv + b * K * C;
      std::copy(buf + C, buf + K * C, buf);  // drop the oldest token
      std::copy(r, r + C, buf + (K - 1) * C);
      for (int64_t c = 0; c < C; ++c) out[c] = 0.f;
      for (int64_t j = 0; j < K; ++j) {
        const float* bj = buf + j * C;
        const float* wj = conv_w + j * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) out[c] += bj[c] * wj[c];
      }
    } else {
      std::copy(r, r + C, out);
    }
    if (act_silu)
      for (int64_t c = 0; c < C; ++c) out[c] = silu(out[c]);
    for (int64_t h = 0; h < H; ++h) {
      float* q = out + h * Dk;
      float* k = out + Cq + h * Dk;
      if (l2) {
        normalise(q, Dk, float(l2_eps));
        normalise(k, Dk, float(l2_eps));
      }
      if (q_scale != 1.0)
        for (int64_t i = 0; i < Dk; ++i) q[i] *= float(q_scale);
    }
  }

  // the memory, one (row, value head) a task: M is read and written once
  at::parallel_for(0, B * Hv, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / Hv, hv = t % Hv, h = hv / G;
      const float* row = qkv.data() + b * C;
      const float* q = row + h * Dk;
      const float* k = row + Cq + h * Dk;
      const float* v = row + 2 * Cq + hv * Dv;
      const float a = alpha ? alpha[t] : 1.f;
      const float th = theta ? theta[t] : 1.f;
      float* Mh = M + t * Dv * Dk;
      float* yh = y + b * Hv * Dv + hv * Dv;
      for (int64_t i = 0; i < Dv; ++i) {
        float* m = Mh + i * Dk;
        if (read_before) yh[i] = dot(m, q, Dk);
        if (retention == 1)
          for (int64_t j = 0; j < Dk; ++j) m[j] *= a;
        const float step = th * (dot(m, k, Dk) - v[i]);
        if (retention == 2) {
#pragma omp simd
          for (int64_t j = 0; j < Dk; ++j) m[j] = a * m[j] - step * k[j];
        } else {
#pragma omp simd
          for (int64_t j = 0; j < Dk; ++j) m[j] -= step * k[j];
        }
        if (!read_before) yh[i] = dot(m, q, Dk);
      }
      if (norm) {
        float inv = 1.f / std::sqrt(dot(yh, yh, Dv) / float(Dv) + float(norm_eps));
        for (int64_t i = 0; i < Dv; ++i) yh[i] = yh[i] * inv * (norm_w ? norm_w[i] : 1.f);
      }
      if (gate_kind) {
        const float* g = gate + b * gate_stride + hv * Dv;
        for (int64_t i = 0; i < Dv; ++i) yh[i] *= gate_kind == 1 ? sigmoid(g[i]) : silu(g[i]);
      }
    }
  });
}
