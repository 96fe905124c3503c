// The decode kernels' Python module: each function takes data pointers and sizes
// (atlas_core/decode/cpu_kernel.py passes them). Defined in matvec.cpp and memory_step.cpp.
#include <pybind11/pybind11.h>

#include <cstdint>

void matvec(uintptr_t w, uintptr_t x, uintptr_t y, int64_t N, int64_t K, int64_t B, bool half);
void memory_step(uintptr_t raw, int64_t raw_stride, uintptr_t conv, uintptr_t conv_w, int64_t K,
                 bool silu, int64_t H, int64_t Hv, int64_t Dk, int64_t Dv, bool l2, double l2_eps,
                 double q_scale, uintptr_t theta, uintptr_t alpha, int64_t retention, bool read_before,
                 uintptr_t M, uintptr_t norm_w, double norm_eps, bool norm, uintptr_t gate,
                 int64_t gate_stride, int64_t gate_kind, uintptr_t y, int64_t B);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("matvec", &matvec, "y = x W^T in float32 (data pointers)");
  m.def("memory_step", &memory_step, "one token of a delta-family memory layer (data pointers)");
}
