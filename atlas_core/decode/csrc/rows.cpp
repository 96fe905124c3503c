// Row-wise work of a decode step between its weight products, float32 and contiguous
// (atlas_core/decode/norm.py holds the readable reference in PyTorch):
//
//   add_rms_norm   the residual add and the RMSNorm that follows it, one pass over each row:
//                  x += r (r = 0: none);  out = x / sqrt(mean(x^2) + eps) * w (w = 0: no weight)
//   add_normed     a post-norm block's residual:  x += r / sqrt(mean(r^2) + eps) * w
//   argmax         each row's first index of its largest value (a NaN counts as the largest,
//                  as in torch.argmax)
//   flush_denormals  float32 arithmetic's denormals flushed to zero in every thread (below)
//
// Rows are a few (batch rows, or heads of one token); each is one cache-resident vector, so no
// threads: the call is cheaper than handing work to a pool.
#include <ATen/Parallel.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace {

inline float inv_rms(const float* x, int64_t D, double eps) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < D; ++i) ss += x[i] * x[i];
  return 1.f / std::sqrt(ss / float(D) + float(eps));
}

}  // namespace

void add_rms_norm(uintptr_t x_, uintptr_t r_, uintptr_t w_, double eps, uintptr_t out_, int64_t rows,
                  int64_t D) {
  float* x = reinterpret_cast<float*>(x_);
  const float* r = reinterpret_cast<const float*>(r_);
  const float* w = reinterpret_cast<const float*>(w_);
  float* out = reinterpret_cast<float*>(out_);
  for (int64_t b = 0; b < rows; ++b) {
    float* xb = x + b * D;
    float* ob = out + b * D;
    if (r) {
      const float* rb = r + b * D;
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) xb[i] += rb[i];
    }
    const float s = inv_rms(xb, D, eps);
    if (w) {
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) ob[i] = xb[i] * s * w[i];
    } else {
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) ob[i] = xb[i] * s;
    }
  }
}

void add_normed(uintptr_t x_, uintptr_t r_, uintptr_t w_, double eps, int64_t rows, int64_t D) {
  float* x = reinterpret_cast<float*>(x_);
  const float* r = reinterpret_cast<const float*>(r_);
  const float* w = reinterpret_cast<const float*>(w_);
  for (int64_t b = 0; b < rows; ++b) {
    float* xb = x + b * D;
    const float* rb = r + b * D;
    const float s = inv_rms(rb, D, eps);
    if (w) {
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) xb[i] += rb[i] * s * w[i];
    } else {
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) xb[i] += rb[i] * s;
    }
  }
}

void argmax(uintptr_t x_, int64_t rows, int64_t n, uintptr_t out_) {
  const float* x = reinterpret_cast<const float*>(x_);
  int64_t* out = reinterpret_cast<int64_t*>(out_);
  pybind11::gil_scoped_release nogil;
  for (int64_t b = 0; b < rows; ++b) {
    const float* xb = x + b * n;
    // the largest value in one vectorised pass (NaNs counted apart), then its first index
    float best = -INFINITY;
    int nan = 0;
#pragma omp simd reduction(max : best) reduction(| : nan)
    for (int64_t i = 0; i < n; ++i) {
      best = xb[i] > best ? xb[i] : best;
      nan |= xb[i] != xb[i];
    }
    int64_t at = 0;
    for (int64_t i = 0; i < n; ++i)
      if (nan ? xb[i] != xb[i] : xb[i] == best) {
        at = i;
        break;
      }
    out[b] = at;
  }
}

// Flush-to-zero and denormals-are-zero on the calling thread and on every thread of ATen's pool
// (the threads that run PyTorch's and MKL's products): a float32 product whose operands or result
// fall below 1.2e-38 otherwise takes a slow microcode path, and a chunked memory's decay products
// reach there (a 2,048-token prefill ran 1.37x slower with them). Returns whether both were on before, on
// the calling thread. Not on a CPU without SSE control bits (returns false, changes nothing).
bool flush_denormals(bool on) {
#if defined(__SSE__)
  const unsigned bits = 0x8040;  // MXCSR's FTZ (bit 15) and DAZ (bit 6)
  const bool before = (_mm_getcsr() & bits) == bits;
  auto set = [&] {
    const unsigned c = _mm_getcsr();
    _mm_setcsr(on ? (c | bits) : (c & ~bits));
  };
  set();
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) { set(); });
  return before;
#else
  (void)on;
  return false;
#endif
}
