// y = x W^T (+ b) for a few rows x: [B, K] (float32) against W: [N, K] (float32 or bfloat16),
// accumulated in float32, the result float32. The rows of W are split over ATen's threads; four
// rows of W share each load of x, and every row of W is read once for all B rows of x.
// A bfloat16 weight is widened to float32 in registers (a shift), so it reads half the bytes.
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

#if defined(__AVX512F__)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const bf16* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

#if defined(__AVX512F__)
// bfloat16 rows 32 values a load: the even values are a lane's low halves (shifted up), the odd
// ones its high halves (masked), each against x's even or odd values, which `deinterleave` laid
// out per block of 32 (16 even, then 16 odd). Returns the first column it did not do.
#ifndef PF
#define PF 384
#endif
int64_t rows_bf16_pairs(const bf16* W, int64_t K, const float* xd, int64_t B, float* y, int64_t N,
                        int64_t r0, int64_t r1) {
  const int64_t K32 = K - K % 32;
  const __m512i high = _mm512_set1_epi32(int32_t(0xFFFF0000u));
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    const bf16* w0 = W + r * K;
    const bf16* w1 = w0 + K;
    const bf16* w2 = w1 + K;
    const bf16* w3 = w2 + K;
    for (int64_t b = 0; b < B; ++b) {
      const float* xb = xd + b * K;
      __m512 e0 = _mm512_setzero_ps(), e1 = e0, e2 = e0, e3 = e0, o0 = e0, o1 = e0, o2 = e0, o3 = e0;
      for (int64_t k = 0; k < K32; k += 32) {
        _mm_prefetch(reinterpret_cast<const char*>(w0 + k + PF), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w1 + k + PF), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w2 + k + PF), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w3 + k + PF), _MM_HINT_T0);
        __m512 xe = _mm512_loadu_ps(xb + k), xo = _mm512_loadu_ps(xb + k + 16);
        __m512i v0 = _mm512_loadu_si512(w0 + k), v1 = _mm512_loadu_si512(w1 + k);
        __m512i v2 = _mm512_loadu_si512(w2 + k), v3 = _mm512_loadu_si512(w3 + k);
        e0 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v0, 16)), xe, e0);
        o0 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v0, high)), xo, o0);
        e1 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v1, 16)), xe, e1);
        o1 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v1, high)), xo, o1);
        e2 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v2, 16)), xe, e2);
        o2 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v2, high)), xo, o2);
        e3 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v3, 16)), xe, e3);
        o3 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v3, high)), xo, o3);
      }
      float* yb = y + b * N + r;
      yb[0] = _mm512_reduce_add_ps(_mm512_add_ps(e0, o0));
      yb[1] = _mm512_reduce_add_ps(_mm512_add_ps(e1, o1));
      yb[2] = _mm512_reduce_add_ps(_mm512_add_ps(e2, o2));
      yb[3] = _mm512_reduce_add_ps(_mm512_add_ps(e3, o3));
    }
  }
  return r;
}
#endif

template <typename T>
void rows(const T* W, int64_t K, const float* x, int64_t B, float* y, int64_t N, int64_t r0, int64_t r1) {
  int64_t r = r0;
#if defined(__AVX512F__)
  const int64_t K16 = K - K % 16;
  for (; r + 4 <= r1; r += 4) {
    const T* w0 = W + r * K;
    const T* w1 = w0 + K;
    const T* w2 = w1 + K;
    const T* w3 = w2 + K;
    for (int64_t b = 0; b < B; ++b) {
      const float* xb = x + b * K;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t k = 0; k < K16; k += 16) {
        __m512 xv = _mm512_loadu_ps(xb + k);
        a0 = _mm512_fmadd_ps(load16(w0 + k), xv, a0);
        a1 = _mm512_fmadd_ps(load16(w1 + k), xv, a1);
        a2 = _mm512_fmadd_ps(load16(w2 + k), xv, a2);
        a3 = _mm512_fmadd_ps(load16(w3 + k), xv, a3);
      }
      float s0 = _mm512_reduce_add_ps(a0), s1 = _mm512_reduce_add_ps(a1);
      float s2 = _mm512_reduce_add_ps(a2), s3 = _mm512_reduce_add_ps(a3);
      for (int64_t k = K16; k < K; ++k) {
        s0 += widen(w0[k]) * xb[k];
        s1 += widen(w1[k]) * xb[k];
        s2 += widen(w2[k]) * xb[k];
        s3 += widen(w3[k]) * xb[k];
      }
      float* yb = y + b * N + r;
      yb[0] = s0; yb[1] = s1; yb[2] = s2; yb[3] = s3;
    }
  }
#endif
  for (; r < r1; ++r) {
    const T* w = W + r * K;
    for (int64_t b = 0; b < B; ++b) {
      const float* xb = x + b * K;
      float s = 0.f;
      for (int64_t k = 0; k < K; ++k) s += widen(w[k]) * xb[k];
      y[b * N + r] = s;
    }
  }
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
#if defined(__AVX512F__)
  if (half && K % 32 == 0) {  // x's even and odd values per block of 32, for rows_bf16_pairs
    std::vector<float> xd(B * K);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t k = 0; k < K; k += 32)
        for (int64_t j = 0; j < 16; ++j) {
          xd[b * K + k + j] = xp[b * K + k + 2 * j];
          xd[b * K + k + 16 + j] = xp[b * K + k + 2 * j + 1];
        }
    const bf16* W = reinterpret_cast<const bf16*>(w);
    at::parallel_for(0, N, grain, [&](int64_t r0, int64_t r1) {
      const int64_t r = rows_bf16_pairs(W, K, xd.data(), B, yp, N, r0, r1);
      rows(W, K, xp, B, yp, N, r, r1);  // the last rows of a task, fewer than four
    });
    return;
  }
#endif
  at::parallel_for(0, N, grain, [&](int64_t r0, int64_t r1) {
    if (half)
      rows(reinterpret_cast<const bf16*>(w), K, xp, B, yp, N, r0, r1);
    else
      rows(reinterpret_cast<const float*>(w), K, xp, B, yp, N, r0, r1);
  });
}
