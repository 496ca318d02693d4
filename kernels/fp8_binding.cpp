// The CUDA implementations of the torch ops trainflow::fp8_gemm_sm89 and trainflow::fp8_gemm_sm90.
//
//   python -m trainflow.fp8      # builds this file with the kernel of the visible GPU's architecture, loads it
//
// One extension per architecture (src/trainflow/fp8/ops.py: build_extension): compiled with
// -DTRAINFLOW_FP8_SM89 beside fp8_gemm.cu, or with -DTRAINFLOW_FP8_SM90 beside fp8_gemm_sm90.cu, and it registers
// that kernel's op only. The schemas are declared once, in ops.py (torch.library.define), which also decides
// which of them becomes the CUDA implementation of trainflow::fp8_gemm (load_backend). Checks here cover what
// the kernels assume; ops.py has already checked dtypes and shapes for the op itself.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <cstdint>

#include "fp8_gemm.h"

namespace {

// A scale is one fp32 value (per tensor) or one per row of its operand; returns whether it is per row.
bool per_row(const at::Tensor& scale, int64_t rows, const char* name) {
  TORCH_CHECK(scale.scalar_type() == at::kFloat, "fp8_gemm: ", name, " must be float32, got ", scale.scalar_type());
  TORCH_CHECK(scale.numel() == 1 || scale.numel() == rows, "fp8_gemm: ", name, " has ", scale.numel(),
              " values; it needs 1 (per tensor) or ", rows, " (per row)");
  return scale.numel() != 1;
}

int device_attribute(cudaDeviceAttr attr, const at::Tensor& on) {
  int value = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, on.device().index()));
  return value;
}

void check_inputs(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a, const at::Tensor& scale_b,
                  at::ScalarType out_dtype, int capability) {
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
  const int have = device_attribute(cudaDevAttrComputeCapabilityMajor, a) * 10 +
                   device_attribute(cudaDevAttrComputeCapabilityMinor, a);
  TORCH_CHECK(have == capability, "fp8_gemm: this kernel's machine code is for sm_", capability, "; device ",
              a.device(), " is sm_", have, " (trainflow.fp8.load_backend picks the kernel per device)");
}

trainflow::Fp8GemmArgs make_args(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa,
                                 const at::Tensor& sb, const at::Tensor& out, bool a_per_row, bool b_per_row) {
  trainflow::Fp8GemmArgs args{};
  args.a = a.data_ptr();
  args.b = static_cast<const __nv_fp8_e4m3*>(b.data_ptr());
  args.c = out.data_ptr();
  args.scale_a = sa.data_ptr<float>();
  args.scale_b = sb.data_ptr<float>();
  args.m = static_cast<int>(a.size(0));
  args.n = static_cast<int>(b.size(0));
  args.k = static_cast<int>(a.size(1));
  args.a_e5m2 = a.scalar_type() == at::kFloat8_e5m2;
  args.scale_a_per_row = a_per_row;
  args.scale_b_per_row = b_per_row;
  args.out_bf16 = out.scalar_type() == at::kBFloat16;
  return args;
}

#if defined(TRAINFLOW_FP8_SM89)

at::Tensor fp8_gemm_sm89_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                              const at::Tensor& scale_b, at::ScalarType out_dtype) {
  check_inputs(a, b, scale_a, scale_b, out_dtype, 89);
  const c10::cuda::CUDAGuard guard(a.device());
  const at::Tensor a_c = a.contiguous();
  const at::Tensor b_c = b.contiguous();
  const at::Tensor sa = scale_a.contiguous();
  const at::Tensor sb = scale_b.contiguous();
  const bool a_per_row = per_row(sa, a.size(0), "scale_a");
  const bool b_per_row = per_row(sb, b.size(0), "scale_b");
  at::Tensor out = at::empty({a.size(0), b.size(0)}, a.options().dtype(out_dtype));
  const auto args = make_args(a_c, b_c, sa, sb, out, a_per_row, b_per_row);
  const cudaError_t err = trainflow::fp8_gemm_sm89(args, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "fp8_gemm_sm89: kernel launch failed: ", cudaGetErrorString(err));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(trainflow, CUDA, m) { m.impl("fp8_gemm_sm89", &fp8_gemm_sm89_cuda); }

#elif defined(TRAINFLOW_FP8_SM90)

// q (rows, cols) fp8 as TMA reads it: contiguous from a 16-byte aligned base (a copy only where q is a view that
// starts elsewhere), zero-padded to (rows_to, cols_to) where those differ (byte 0 is +0.0 in both formats).
at::Tensor padded_fp8(const at::Tensor& q, int64_t rows_to, int64_t cols_to) {
  if (q.size(0) == rows_to && q.size(1) == cols_to) {
    const at::Tensor c = q.contiguous();
    return reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0 ? c : c.clone();
  }
  // constant_pad_nd has no fp8 kernels; the bytes pad as uint8.
  const at::Tensor bytes = q.contiguous().view(at::kByte);
  return at::constant_pad_nd(bytes, {0, cols_to - q.size(1), 0, rows_to - q.size(0)}, 0).view(q.scalar_type());
}

int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// `schedule` (fp8_gemm.h's Fp8GemmSchedule) and `swizzle` pick the configuration; trainflow.fp8.shapes chooses them.
at::Tensor fp8_gemm_sm90_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                              const at::Tensor& scale_b, at::ScalarType out_dtype, int64_t schedule, int64_t swizzle) {
  check_inputs(a, b, scale_a, scale_b, out_dtype, 90);
  TORCH_CHECK(schedule >= trainflow::kFp8Cooperative && schedule <= trainflow::kFp8StreamK, "fp8_gemm_sm90: schedule ",
              schedule, " is none of 0 (cooperative), 1 (ping-pong), 2 (stream-K)");
  TORCH_CHECK(swizzle == 1 || swizzle == 2 || swizzle == 4 || swizzle == 8, "fp8_gemm_sm90: swizzle ", swizzle,
              " is none of 1, 2, 4, 8");
  const c10::cuda::CUDAGuard guard(a.device());
  const int64_t m = a.size(0);
  const int64_t n = b.size(0);
  const int64_t k = a.size(1);
  const bool a_per_row = per_row(scale_a, m, "scale_a");
  const bool b_per_row = per_row(scale_b, n, "scale_b");
  if (m == 0 || n == 0 || k == 0) return at::zeros({m, n}, a.options().dtype(out_dtype));  // empty sums are 0
  // Zero columns of K add nothing; zero rows of B (N) make output columns that are cut off below.
  const int64_t k_pad = round_up(k, trainflow::kSm90AlignK);
  const int64_t n_pad = round_up(n, trainflow::kSm90AlignN);
  const at::Tensor a_p = padded_fp8(a, m, k_pad);
  const at::Tensor b_p = padded_fp8(b, n_pad, k_pad);
  // The epilogue reads the scales one float at a time (no alignment rule), a per-row scale_b up to N = n_pad.
  const at::Tensor sa = scale_a.reshape({-1}).contiguous();
  const at::Tensor sb = b_per_row && n_pad != n ? at::constant_pad_nd(scale_b.reshape({-1}), {0, n_pad - n}, 0)
                                                 : scale_b.reshape({-1}).contiguous();
  at::Tensor out = at::empty({m, n_pad}, a.options().dtype(out_dtype));
  auto args = make_args(a_p, b_p, sa, sb, out, a_per_row, b_per_row);
  args.schedule = static_cast<int>(schedule);
  args.swizzle = static_cast<int>(swizzle);
  const int sm_count = device_attribute(cudaDevAttrMultiProcessorCount, a);  // the persistent grid's size
  const size_t workspace_bytes = trainflow::fp8_gemm_sm90_workspace_bytes(args, sm_count);
  at::Tensor workspace = at::empty({static_cast<int64_t>(workspace_bytes)}, a.options().dtype(at::kByte));
  const cudaError_t err =
      trainflow::fp8_gemm_sm90(args, sm_count, workspace.data_ptr(), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "fp8_gemm_sm90: CUTLASS refused or failed to launch (M=", m, ", N=", n_pad,
              ", K=", k_pad, ", schedule ", schedule, ", swizzle ", swizzle, "): ", cudaGetErrorString(err));
  return n_pad == n ? out : out.narrow(1, 0, n).contiguous();
}

}  // namespace

TORCH_LIBRARY_IMPL(trainflow, CUDA, m) { m.impl("fp8_gemm_sm90", &fp8_gemm_sm90_cuda); }

#else
#error "compile with -DTRAINFLOW_FP8_SM89 or -DTRAINFLOW_FP8_SM90 (src/trainflow/fp8/ops.py: build_extension)"
#endif
