// The decode kernels' Python module: each function takes data pointers and sizes
// (atlas_core/decode/cpu_kernel.py passes them). Defined in matvec.cpp, memory_step.cpp and rows.cpp.
#include <pybind11/pybind11.h>

#include <cstdint>

void matvec(uintptr_t w, uintptr_t x, uintptr_t y, int64_t N, int64_t K, int64_t B, bool half);
void memory_step(uintptr_t raw, int64_t raw_stride, uintptr_t conv, uintptr_t conv_w, int64_t K,
                 bool silu, int64_t H, int64_t Hv, int64_t Dk, int64_t Dv, bool l2, double l2_eps,
                 double q_scale, uintptr_t theta, uintptr_t alpha, int64_t retention, bool read_before,
                 uintptr_t M, uintptr_t norm_w, double norm_eps, bool norm, uintptr_t gate,
                 int64_t gate_stride, int64_t gate_kind, uintptr_t y, int64_t B);
void add_rms_norm(uintptr_t x, uintptr_t r, uintptr_t w, double eps, uintptr_t out, int64_t rows, int64_t D);
void add_normed(uintptr_t x, uintptr_t r, uintptr_t w, double eps, int64_t rows, int64_t D);
void argmax(uintptr_t x, int64_t rows, int64_t n, uintptr_t out);
bool flush_denormals(bool on);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("matvec", &matvec, "y = x W^T in float32 (data pointers)");
  m.def("memory_step", &memory_step, "one token of a delta-family memory layer (data pointers)");
  m.def("add_rms_norm", &add_rms_norm, "x += r; out = RMSNorm(x) (data pointers)");
  m.def("add_normed", &add_normed, "x += RMSNorm(r) (data pointers)");
  m.def("argmax", &argmax, "each row's first index of its largest value (data pointers)");
  m.def("flush_denormals", &flush_denormals, "FTZ/DAZ on every thread of ATen's pool; returns the previous setting");
}
