// The FP8 GEMM's C interface: C = diag(scale_a) (A B^T) diag(scale_b), A (M, K) and B (N, K) row-major fp8,
// fp32 accumulation on tensor cores, C (M, N) row-major in fp32 or bf16.
//
// CUDA headers only (no torch), so nvcc compiles fp8_gemm.cu on any machine; fp8_binding.cpp wraps it as the
// CUDA implementation of the torch op trainflow::fp8_gemm (schema: src/trainflow/fp8/ops.py).
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

namespace trainflow {

struct Fp8GemmArgs {
  const void* a;               // (m, k) row-major: e4m3 (activations, weights) or e5m2 (gradients), as a_e5m2 says
  const __nv_fp8_e4m3* b;      // (n, k) row-major e4m3: a Linear's weight layout, so C = A B^T is x W^T
  void* c;                     // (m, n) row-major: __nv_bfloat16 if out_bf16, else float
  const float* scale_a;        // device pointer: m values if scale_a_per_row, else 1 (dequantisation multipliers)
  const float* scale_b;        // device pointer: n values if scale_b_per_row, else 1
  int m, n, k;
  bool a_e5m2;
  bool scale_a_per_row;
  bool scale_b_per_row;
  bool out_bf16;
};

// Launches on `stream`; returns the launch's error (cudaSuccess when m or n is 0: nothing to do).
// Needs compute capability 8.9 or newer (fp8 mma.sync); the caller checks the device.
cudaError_t fp8_gemm(const Fp8GemmArgs& args, cudaStream_t stream);

}  // namespace trainflow
