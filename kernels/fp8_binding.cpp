// The CUDA implementation of the torch op trainflow::fp8_gemm, registered with the dispatcher.
//
//   python -m trainflow.fp8      # builds this file and fp8_gemm.cu with torch.utils.cpp_extension, loads them
//
// The op's schema is declared once, in src/trainflow/fp8/ops.py (torch.library.define), beside its reference
// implementation (CPU) and its fake (torch.compile); this file only adds the CUDA kernel (extension-cpp layout).
// Checks here cover what the kernel assumes; the Python side has already shaped the inputs.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include "fp8_gemm.h"

namespace {

// A scale is one fp32 value (per tensor) or one per row of its operand; returns whether it is per row.
bool per_row(const at::Tensor& scale, int64_t rows, const char* name) {
  TORCH_CHECK(scale.scalar_type() == at::kFloat, "fp8_gemm: ", name, " must be float32, got ", scale.scalar_type());
  TORCH_CHECK(scale.numel() == 1 || scale.numel() == rows, "fp8_gemm: ", name, " has ", scale.numel(),
              " values; it needs 1 (per tensor) or ", rows, " (per row)");
  return scale.numel() != 1;
}

at::Tensor fp8_gemm_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                         const at::Tensor& scale_b, at::ScalarType out_dtype) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "fp8_gemm: a and b must be 2-D, got ", a.sizes(), " and ", b.sizes());
  TORCH_CHECK(a.size(1) == b.size(1), "fp8_gemm: a ", a.sizes(), " and b ", b.sizes(), " differ in K (dim 1)");
  TORCH_CHECK(a.scalar_type() == at::kFloat8_e4m3fn || a.scalar_type() == at::kFloat8_e5m2,
              "fp8_gemm: a must be float8_e4m3fn or float8_e5m2, got ", a.scalar_type());
  TORCH_CHECK(b.scalar_type() == at::kFloat8_e4m3fn, "fp8_gemm: b must be float8_e4m3fn, got ", b.scalar_type());
  TORCH_CHECK(out_dtype == at::kFloat || out_dtype == at::kBFloat16,
              "fp8_gemm: out_dtype must be float32 or bfloat16, got ", out_dtype);
  TORCH_CHECK(a.device() == b.device() && scale_a.device() == a.device() && scale_b.device() == a.device(),
              "fp8_gemm: a, b and the scales must be on one device");
  TORCH_CHECK(a.size(0) <= INT32_MAX && b.size(0) <= INT32_MAX && a.size(1) <= INT32_MAX,
              "fp8_gemm: sizes must fit in 32 bits, got ", a.sizes(), " and ", b.sizes());
  const c10::cuda::CUDAGuard guard(a.device());
  int major = 0;
  int minor = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, a.device().index()));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, a.device().index()));
  TORCH_CHECK(major * 10 + minor >= 89, "fp8_gemm: needs compute capability 8.9 or newer (fp8 tensor cores: ",
              "Ada, Hopper); device ", a.device(), " is ", major, ".", minor);

  const at::Tensor a_c = a.contiguous();
  const at::Tensor b_c = b.contiguous();
  const at::Tensor sa = scale_a.contiguous();
  const at::Tensor sb = scale_b.contiguous();
  const bool a_per_row = per_row(sa, a.size(0), "scale_a");
  const bool b_per_row = per_row(sb, b.size(0), "scale_b");
  at::Tensor out = at::empty({a.size(0), b.size(0)}, a.options().dtype(out_dtype));
  trainflow::Fp8GemmArgs args{};
  args.a = a_c.data_ptr();
  args.b = static_cast<const __nv_fp8_e4m3*>(b_c.data_ptr());
  args.c = out.data_ptr();
  args.scale_a = sa.data_ptr<float>();
  args.scale_b = sb.data_ptr<float>();
  args.m = static_cast<int>(a.size(0));
  args.n = static_cast<int>(b.size(0));
  args.k = static_cast<int>(a.size(1));
  args.a_e5m2 = a.scalar_type() == at::kFloat8_e5m2;
  args.scale_a_per_row = a_per_row;
  args.scale_b_per_row = b_per_row;
  args.out_bf16 = out_dtype == at::kBFloat16;
  const cudaError_t err = trainflow::fp8_gemm(args, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "fp8_gemm: kernel launch failed: ", cudaGetErrorString(err));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(trainflow, CUDA, m) { m.impl("fp8_gemm", &fp8_gemm_cuda); }
