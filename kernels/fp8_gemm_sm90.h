// The Hopper kernel's instantiations, as the dispatch in fp8_gemm_sm90.cu sees them: tags for the configurations
// and A's element types, and the two entry points each translation unit fp8_gemm_sm90_<config>_<a>.cu instantiates
// from fp8_gemm_sm90.cuh. No CUTLASS here, so the dispatch compiles in a second.
#pragma once

#include "fp8_gemm.h"

namespace trainflow::sm90 {

struct Cooperative;  // the configurations, defined in fp8_gemm_sm90.cuh
struct Pingpong;
struct StreamK;
struct E4m3;  // A's element type: e4m3 (activations, weights) or e5m2 (gradients)
struct E5m2;

// The workspace `args` needs in configuration Config with A of type A (C fp32 or bf16 as args say), and the launch.
template <class Config, class A>
size_t workspace_bytes(const Fp8GemmArgs& args, int sm_count);
template <class Config, class A>
cudaError_t run(const Fp8GemmArgs& args, int sm_count, void* workspace, cudaStream_t stream);

}  // namespace trainflow::sm90
