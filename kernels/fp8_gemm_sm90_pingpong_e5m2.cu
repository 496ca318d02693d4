// The pingpong configuration's two kernels with A in e5m2 (C fp32 and bf16) of the Hopper FP8 GEMM: one translation
// unit per configuration and A type, so the build compiles the six in parallel (fp8_gemm_sm90.cu's header).
#include "fp8_gemm_sm90.cuh"

namespace trainflow::sm90 {

template size_t workspace_bytes<Pingpong, E5m2>(const Fp8GemmArgs& args, int sm_count);
template cudaError_t run<Pingpong, E5m2>(const Fp8GemmArgs& args, int sm_count, void* workspace, cudaStream_t stream);

}  // namespace trainflow::sm90
