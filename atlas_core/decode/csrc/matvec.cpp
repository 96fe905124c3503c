// y = x W^T (+ b) for a few rows x: [B, K] (float32) against W: [N, K] (float32 or bfloat16),
// accumulated in float32, the result float32. The rows of W are split over ATen's threads; every
// row of W is read once for all B rows of x.
//
// Reading at the memory's bandwidth: each task reads four rows of W at a time, one from each
// quarter of its range of rows (lanes), so the four read streams run on through the whole range
// instead of restarting every four rows (consecutive rows would start three new streams for the
// hardware prefetcher to find on every step), and each stream is prefetched ahead in software.
// A bfloat16 weight is widened to float32 in registers (a shift), so it reads half the bytes;
// where K % 32 == 0 it is read 32 values a load (the even values are a lane's low halves,
// shifted up, the odd ones its high halves, masked), against x's values laid out per block of 32
// as 16 even, then 16 odd (`deinterleave`).
// Only pybind11 and ATen's thread pool are included (not torch/extension.h): the build takes
// seconds. The caller passes the tensors' data pointers (atlas_core/decode/cpu_kernel.py).
#include <ATen/Parallel.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

struct bf16 { uint16_t bits; };  // bfloat16: the high half of a float32

inline float widen(float v) { return v; }
inline float widen(bf16 v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// how far ahead of each read the prefetch reaches: 768 bytes of the row
template <typename T> constexpr int64_t kAhead = 768 / sizeof(T);

template <typename T>
float dot1(const T* w, const float* x, int64_t K) {
  float s = 0.f;
  for (int64_t k = 0; k < K; ++k) s += widen(w[k]) * x[k];
  return s;
}

// out[j] = w[j] . x for the four rows w[0..3]; `pairs`: bfloat16 rows 32 values a load against
// the deinterleaved xd (K % 32 == 0), else 16 values a load against x, the tail one at a time
template <typename T, bool pairs>
void dot4(const T* const w[4], const float* x, const float* xd, int64_t K, float out[4]) {
  int64_t k = 0;
  float s[4] = {0.f, 0.f, 0.f, 0.f};
#if defined(__AVX512F__)
  __m512 a[4], o[4];
  for (int j = 0; j < 4; ++j) a[j] = o[j] = _mm512_setzero_ps();
  if constexpr (pairs) {
    const __m512i high = _mm512_set1_epi32(int32_t(0xFFFF0000u));
    for (; k < K; k += 32) {
      const __m512 xe = _mm512_loadu_ps(xd + k), xo = _mm512_loadu_ps(xd + k + 16);
      for (int j = 0; j < 4; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(w[j] + k + kAhead<T>), _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512(w[j] + k);
        a[j] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), xe, a[j]);
        o[j] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, high)), xo, o[j]);
      }
    }
  } else {
    for (; k + 16 <= K; k += 16) {
      const __m512 xv = _mm512_loadu_ps(x + k);
      for (int j = 0; j < 4; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(w[j] + k + kAhead<T>), _MM_HINT_T0);
        __m512 v;
        if constexpr (sizeof(T) == 4) {
          v = _mm512_loadu_ps(reinterpret_cast<const float*>(w[j] + k));
        } else {
          const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[j] + k));
          v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        }
        a[j] = _mm512_fmadd_ps(v, xv, a[j]);
      }
    }
  }
  for (int j = 0; j < 4; ++j) s[j] = _mm512_reduce_add_ps(_mm512_add_ps(a[j], o[j]));
#endif
  for (int j = 0; j < 4; ++j) out[j] = s[j] + dot1(w[j] + k, x + k, K - k);
}

// rows [r0, r1) of y = x W^T: four lanes (quarters of the range) side by side, then the rest
template <typename T, bool pairs>
void task(const T* W, int64_t K, const float* x, const float* xd, int64_t B, float* y, int64_t N,
          int64_t r0, int64_t r1) {
  const int64_t q = (r1 - r0) / 4;
  for (int64_t i = 0; i < q; ++i) {
    const int64_t r[4] = {r0 + i, r0 + q + i, r0 + 2 * q + i, r0 + 3 * q + i};
    const T* const w[4] = {W + r[0] * K, W + r[1] * K, W + r[2] * K, W + r[3] * K};
    for (int64_t b = 0; b < B; ++b) {
      float out[4];
      dot4<T, pairs>(w, x + b * K, xd + b * K, K, out);
      for (int j = 0; j < 4; ++j) y[b * N + r[j]] = out[j];
    }
  }
  for (int64_t r = r0 + 4 * q; r < r1; ++r)
    for (int64_t b = 0; b < B; ++b) y[b * N + r] = dot1(W + r * K, x + b * K, K);
}

}  // namespace

// y[B, N] = x[B, K] W[N, K]^T, all contiguous; W float32 (half = false) or bfloat16 (half = true)
void matvec(uintptr_t w, uintptr_t x, uintptr_t y, int64_t N, int64_t K, int64_t B, bool half) {
  const float* xp = reinterpret_cast<const float*>(x);
  float* yp = reinterpret_cast<float*>(y);
  const int64_t esize = half ? 2 : 4;
  // about 64 KiB of weights a task at least
  const int64_t grain = std::max<int64_t>(16, (int64_t(1) << 16) / std::max<int64_t>(1, K * esize));
  pybind11::gil_scoped_release nogil;
  if (!half) {
    const float* W = reinterpret_cast<const float*>(w);
    at::parallel_for(0, N, grain, [&](int64_t r0, int64_t r1) { task<float, false>(W, K, xp, xp, B, yp, N, r0, r1); });
    return;
  }
  const bf16* W = reinterpret_cast<const bf16*>(w);
#if defined(__AVX512F__)
  if (K % 32 == 0) {  // x's even and odd values per block of 32, for the pairs loads
    std::vector<float> xd(B * K);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t k = 0; k < K; k += 32)
        for (int64_t j = 0; j < 16; ++j) {
          xd[b * K + k + j] = xp[b * K + k + 2 * j];
          xd[b * K + k + 16 + j] = xp[b * K + k + 2 * j + 1];
        }
    at::parallel_for(0, N, grain, [&](int64_t r0, int64_t r1) {
      task<bf16, true>(W, K, xp, xd.data(), B, yp, N, r0, r1);
    });
    return;
  }
#endif
  at::parallel_for(0, N, grain, [&](int64_t r0, int64_t r1) { task<bf16, false>(W, K, xp, xp, B, yp, N, r0, r1); });
}
