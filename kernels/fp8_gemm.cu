// FP8 GEMM on Ada (sm_89) tensor cores: C = diag(scale_a) (A B^T) diag(scale_b), fp8 inputs, fp32 accumulation.
//
//   nvcc -gencode=arch=compute_89,code=sm_89 -O3 -c kernels/fp8_gemm.cu   # tests/unit/test_fp8_sass.py does this
//
// Design (Ampere-style mma.sync; Hopper runs kernels/fp8_gemm_sm90.cu instead, see below):
// - A 128x128 block tile of C per 256-thread block, K walked in 64-byte slices. Eight warps in a 2 (m) x 4 (n)
//   grid, each owning a 64x32 piece of C: 4 x 4 mma.sync.m16n8k32 fragments, 64 fp32 sums a thread (twice
//   that in registers with the partials below).
// - fp32 promotion (two-level accumulation): the tensor core adds into its accumulator with fewer bits than fp32
//   (about 13 of mantissa for fp8 mma on Ada and Hopper, by SageAttention's and DeepGEMM's measurements), so a
//   running sum over the whole K would lose the low bits of every addition, and the loss grows with K. Each
//   kPromoteK = 128 of K is therefore summed by the tensor core from zero into `part` fragments, which are then
//   added into `acc` with ordinary fp32 FADDs (as DeepGEMM and CUTLASS's FP8 mainloop do on Hopper).
// - Shared memory holds two stages of the A and B slices (40 KiB, static). cp.async copies stage k+1 while the
//   tensor cores work on stage k. Rows are padded from 64 to 80 bytes so that the 8 rows one ldmatrix phase
//   reads start in 8 different 16-byte bank groups (80 / 16 = 5, odd): no bank conflicts, no swizzle needed.
// - Fragments come from ldmatrix.x4 (8x8 b16 matrices = 8 rows x 16 fp8 bytes): for fp8 the b16 layout gives
//   each thread 4 consecutive k bytes of one row, which is what m16n8k32's A (row) and B (col) operands take.
//   Only the pairing of k between A and B matters (the mma sums over k), and both come from the same k bytes.
// - Tails: slices past M, N or K are zero-filled (cp.async with src-size 0); zeros add nothing to the sums.
//   cp.async moves 16 aligned bytes, so it is used when K % 16 == 0 and both bases are 16-byte aligned; any
//   other K (or an offset view) takes the byte-wise load path, correct but slower.
// - Epilogue: acc * scale_a[row] * scale_b[col] (per-tensor scales are one value), written as fp32 or bf16.
// A has e4m3 (forward) or e5m2 (backward: gradients) bytes; B is always e4m3.
// Machine code for sm_89 only: Hopper has no fp8 mma.sync, and nvcc emulates it there with fp16 HMMA plus
// F2FP conversions (the SASS of an sm_90a build shows it), so other targets get a trap instead of that.

#include <cuda_bf16.h>

#include <cstdint>

#include "fp8_gemm.h"

namespace trainflow {
namespace {

constexpr int kBlockM = 128;
constexpr int kBlockN = 128;
constexpr int kBlockK = 64;            // bytes (= fp8 elements) of K per stage
constexpr int kRowBytes = kBlockK + 16;  // padded shared-memory row, see the header comment
constexpr int kStages = 2;
constexpr int kPromoteK = 128;  // K summed inside the tensor core before each fp32 promotion (at most 128)
constexpr int kSlicesPerPromotion = kPromoteK / kBlockK;
constexpr int kWarpsM = 2;
constexpr int kWarpsN = 4;
constexpr int kThreads = 32 * kWarpsM * kWarpsN;
constexpr int kWarpM = kBlockM / kWarpsM;  // 64 rows of C per warp
constexpr int kWarpN = kBlockN / kWarpsN;  // 32 columns of C per warp
constexpr int kFragsM = kWarpM / 16;       // m16 fragments per warp
constexpr int kFragsN = kWarpN / 8;        // n8 fragments per warp
constexpr int kChunksPerRow = kBlockK / 16;
constexpr int kChunksPerThread = kBlockM * kChunksPerRow / kThreads;  // 16-byte chunks each thread copies
static_assert(kBlockM == kBlockN, "one copy loop serves both operands");
static_assert(kBlockM * kChunksPerRow % kThreads == 0, "every thread copies the same number of chunks");
static_assert(kFragsN % 2 == 0, "B fragments are loaded two n8 tiles per ldmatrix.x4");
static_assert(kPromoteK % kBlockK == 0 && kPromoteK <= 128, "promotion happens at slice ends, every <= 128 of K");

struct SharedTiles {
  alignas(128) uint8_t a[kStages][kBlockM][kRowBytes];
  alignas(128) uint8_t b[kStages][kBlockN][kRowBytes];
};

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
  // src_bytes < 16 zero-fills the rest; 0 reads nothing (src must still be a valid address).
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}

template <bool kAE5M2>
__device__ __forceinline__ void mma_16x8x32(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (kAE5M2) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// Copies the (kBlockM rows) x (kBlockK bytes) slice at (row0, k0) of a (rows, k) row-major matrix into `tile`,
// zeros where the slice lies outside the matrix.
__device__ __forceinline__ void load_slice(uint8_t (*tile)[kRowBytes], const uint8_t* src, int rows, int k,
                                           int row0, int k0, bool vector_path) {
#pragma unroll
  for (int i = 0; i < kChunksPerThread; ++i) {
    const int chunk = static_cast<int>(threadIdx.x) + i * kThreads;
    const int r = chunk / kChunksPerRow;
    const int kc = (chunk % kChunksPerRow) * 16;
    const int grow = row0 + r;
    const int gk = k0 + kc;
    uint8_t* dst = &tile[r][kc];
    if (vector_path) {
      const bool inside = grow < rows && gk < k;  // k % 16 == 0 here: a chunk is wholly inside or outside
      const uint8_t* from = inside ? src + static_cast<size_t>(grow) * k + gk : src;
      cp_async_16(dst, from, inside ? 16 : 0);
    } else {
      uint32_t words[4] = {0u, 0u, 0u, 0u};
      if (grow < rows) {
        const uint8_t* row = src + static_cast<size_t>(grow) * k;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          if (gk + j < k) words[j / 4] |= static_cast<uint32_t>(row[gk + j]) << (8 * (j % 4));
        }
      }
      *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
    }
  }
}

__device__ __forceinline__ void store(float* c, float v) { *c = v; }
__device__ __forceinline__ void store(__nv_bfloat16* c, float v) { *c = __float2bfloat16_rn(v); }

template <bool kAE5M2, typename Out>
__global__ void __launch_bounds__(kThreads) fp8_gemm_kernel(const uint8_t* __restrict__ a,
                                                            const uint8_t* __restrict__ b, Out* __restrict__ c,
                                                            const float* __restrict__ scale_a,
                                                            const float* __restrict__ scale_b, int m, int n, int k,
                                                            bool scale_a_per_row, bool scale_b_per_row,
                                                            bool vector_path) {
#if !defined(__CUDA_ARCH__) || (__CUDA_ARCH__ >= 890 && __CUDA_ARCH__ < 900)
  __shared__ SharedTiles smem;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warp_row = (warp / kWarpsN) * kWarpM;  // this warp's offset inside the block tile
  const int warp_col = (warp % kWarpsN) * kWarpN;
  const int block_row = static_cast<int>(blockIdx.y) * kBlockM;
  const int block_col = static_cast<int>(blockIdx.x) * kBlockN;

  float acc[kFragsM][kFragsN][4] = {};   // fp32 sums: only FADDs of promoted partials touch them
  float part[kFragsM][kFragsN][4] = {};  // the tensor core's sum over the current kPromoteK of K
  const int slices = (k + kBlockK - 1) / kBlockK;
  if (slices > 0) {
    load_slice(smem.a[0], a, m, k, block_row, 0, vector_path);
    load_slice(smem.b[0], b, n, k, block_col, 0, vector_path);
    cp_async_commit();
  }
  for (int s = 0; s < slices; ++s) {
    const int stage = s % kStages;
    if (s + 1 < slices) {  // copy the next slice into the other stage while this one is multiplied
      load_slice(smem.a[stage ^ 1], a, m, k, block_row, (s + 1) * kBlockK, vector_path);
      load_slice(smem.b[stage ^ 1], b, n, k, block_col, (s + 1) * kBlockK, vector_path);
      cp_async_commit();
      cp_async_wait<1>();  // all but the newest group done: this stage has landed
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBlockK; kk += 32) {
      uint32_t fa[kFragsM][4];
      uint32_t fb[kFragsN][2];
      // A: matrices (rows 0-7, k 0-15), (rows 8-15, k 0-15), (rows 0-7, k 16-31), (rows 8-15, k 16-31) are
      // a0..a3 of m16n8k32; lanes 8j..8j+7 address the rows of matrix j.
#pragma unroll
      for (int i = 0; i < kFragsM; ++i) {
        ldmatrix_x4(fa[i], &smem.a[stage][warp_row + i * 16 + (lane % 16)][kk + (lane / 16) * 16]);
      }
      // B (n rows of the (n, k) tile): matrices (n 0-7, k 0-15), (n 0-7, k 16-31), (n 8-15, k 0-15),
      // (n 8-15, k 16-31) are b0, b1 of two neighbouring n8 fragments.
#pragma unroll
      for (int j = 0; j < kFragsN; j += 2) {
        uint32_t r[4];
        ldmatrix_x4(r, &smem.b[stage][warp_col + j * 8 + (lane / 16) * 8 + (lane % 8)][kk + ((lane / 8) % 2) * 16]);
        fb[j][0] = r[0];
        fb[j][1] = r[1];
        fb[j + 1][0] = r[2];
        fb[j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
        for (int j = 0; j < kFragsN; ++j) mma_16x8x32<kAE5M2>(part[i][j], fa[i], fb[j]);
      }
    }
    if ((s + 1) % kSlicesPerPromotion == 0 || s + 1 == slices) {  // promote: acc += part in fp32, part = 0
#pragma unroll
      for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
        for (int j = 0; j < kFragsN; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            acc[i][j][e] += part[i][j][e];
            part[i][j][e] = 0.0f;
          }
        }
      }
    }
    __syncthreads();  // everyone is done with this stage before it is overwritten
  }

  // Accumulator layout of m16n8: c0, c1 at (row lane/4, cols 2*(lane%4) + 0, 1); c2, c3 eight rows below.
#pragma unroll
  for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = block_row + warp_row + i * 16 + lane / 4 + half * 8;
      if (row >= m) continue;
      const float sa = scale_a[scale_a_per_row ? row : 0];
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = block_col + warp_col + j * 8 + (lane % 4) * 2 + e;
          if (col < n) {
            store(&c[static_cast<size_t>(row) * n + col], acc[i][j][half * 2 + e] * sa * scale_b[scale_b_per_row ? col : 0]);
          }
        }
      }
    }
  }
#else
  __trap();  // built for sm_89 only (see the header); trainflow.fp8.ops never dispatches here elsewhere
#endif
}

template <bool kAE5M2, typename Out>
cudaError_t launch(const Fp8GemmArgs& p, cudaStream_t stream) {
  const dim3 grid((p.n + kBlockN - 1) / kBlockN, (p.m + kBlockM - 1) / kBlockM);
  const bool aligned = reinterpret_cast<uintptr_t>(p.a) % 16 == 0 && reinterpret_cast<uintptr_t>(p.b) % 16 == 0;
  fp8_gemm_kernel<kAE5M2, Out><<<grid, kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(p.a), reinterpret_cast<const uint8_t*>(p.b), static_cast<Out*>(p.c), p.scale_a,
      p.scale_b, p.m, p.n, p.k, p.scale_a_per_row, p.scale_b_per_row, aligned && p.k % 16 == 0);
  return cudaGetLastError();
}

}  // namespace

cudaError_t fp8_gemm_sm89(const Fp8GemmArgs& args, cudaStream_t stream) {
  if (args.m <= 0 || args.n <= 0) return cudaSuccess;
  if (args.k < 0) return cudaErrorInvalidValue;
  if (args.a_e5m2) {
    return args.out_bf16 ? launch<true, __nv_bfloat16>(args, stream) : launch<true, float>(args, stream);
  }
  return args.out_bf16 ? launch<false, __nv_bfloat16>(args, stream) : launch<false, float>(args, stream);
}

}  // namespace trainflow
