// The mma.sync attention kernel shared by the sm80 family (FP16 P·V, csrc/sm80) and the sm89 family
// (FP8 P·V, csrc/sm89): INT8 Q·Kᵀ with m16n8k32 (one or two INT8 digits of K), FP32 online softmax
// with exp2, and P·V through a policy class that owns the V tile: its shared-memory layout, its
// copies, its MMAs and its per-channel output scale. Reproduces
// sageattention.reference.sage_ref(block_m=1, block_n=64): scores = int32 dot * (q_scale * k_scale),
// already in the log2 domain; P is rounded (FP16, or FP8 after scaling by Pv::kPScale) at the
// running maximum of its block; the row sum uses the unrounded FP32 P.
//
// Tiling. One CTA = 128 query rows = 8 warps x 16 rows (one m16 MMA row tile per warp). 16 rows per
// warp rather than 32 keeps the FP32 output accumulator at 64 registers per thread for d = 128
// (16 x 128 / 32), so the kernel fits without spills; K/V tiles are still shared by 128 rows, which
// is what sets the global traffic. Keys advance 64 at a time (kMmaKeyBlock): K is quantized per
// block of 64 keys, so each step needs exactly one k_scale.
//
// Shared memory. The K tile (and K's second digit) and the V tile are double buffered with
// cp.async: the copies of block j+1 overlap the MMAs of block j. Every tile row is padded by 16
// bytes: K rows of 64 or 128 bytes become 80 or 144, FP16 V rows of 128 or 256 bytes become 144 or
// 272, FP8 Vᵀ rows of 64 keys become 80. Each ldmatrix phase reads 8 rows of 16 bytes; with a pitch
// of 20, 36 or 68 words (20 or 4 mod 32) those 8 rows start in 8 distinct groups of 4 banks, so
// there are no bank conflicts.
//
// Q stays in registers for the whole CTA (d_pad / 32 x 4 words per thread), loaded straight from
// global memory in the MMA A-fragment layout: each row is read once, so staging it through shared
// memory would only add a copy.
//
// A P·V policy provides:
//   kPScale                      P is multiplied by it before rounding (FP8: 448, into e4m3's range);
//                                the output is divided by it again.
//   VTile<D>::kBytes             bytes of one V tile in shared memory.
//   load<D>(dst, p, b, hk, n0)   cp.async of the V tile of keys n0..n0+63 (all threads take part).
//   mma<D, kAccum>(acc, s, v_smem, ld_mat, ld_row)
//                                acc += P V for the block's probabilities s (C layout, FP32).
//   channel_scale(p, b, hk, ch)  factors of output channels ch, ch + 1 (FP8: V's dequantization scale).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "sage_attn_common.cuh"
#include "sage_attn_mma.h"
#include "sage_copy.cuh"
#include "sage_mma.cuh"

namespace sage {
namespace mma_attn {

constexpr int kWarps = 8;
constexpr int kRowsPerWarp = 16;                // one m16 tile
constexpr int kBlockM = kWarps * kRowsPerWarp;  // 128 query rows per CTA
constexpr int kBlockN = kMmaKeyBlock;           // 64 keys per step
constexpr int kThreads = kWarps * 32;
constexpr int kSTiles = kBlockN / 8;  // n8 score tiles per key block
constexpr int kSmemRowPad = 16;       // bytes; see the bank-conflict note above
constexpr int kChunk = 16;            // bytes per cp.async / ldmatrix row

__device__ __forceinline__ uint32_t load_u32_or_zero(const int8_t* p, bool valid) {
  return valid ? __ldg(reinterpret_cast<const uint32_t*>(p)) : 0u;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// f(chunk) for chunk = threadIdx.x, threadIdx.x + 256, ... below kCount (a multiple of 256, so every
// thread issues the same number of copies and the loop unrolls).
template <int kCount, typename F>
__device__ __forceinline__ void for_each_chunk(F&& f) {
  static_assert(kCount % kThreads == 0, "a tile must split evenly over the CTA's threads");
#pragma unroll
  for (int i = 0; i < kCount / kThreads; ++i) f(static_cast<int>(threadIdx.x) + i * kThreads);
}

// One pipeline stage: the INT8 K tile, K's second digit (two-level K only), then the policy's V tile.
template <int D, bool kResidual, class Pv>
struct Stage {
  static constexpr int kKPitch = D + kSmemRowPad;
  static constexpr int kKBytes = kBlockN * kKPitch;
  static constexpr int kVOffset = kKBytes * (kResidual ? 2 : 1);
  static constexpr int kBytes = kVOffset + Pv::template VTile<D>::kBytes;
  static constexpr int kStages = 2;
  static constexpr int kTotal = kStages * kBytes;
  static_assert(kBytes % 16 == 0, "stages must keep the 16-byte alignment of cp.async and ldmatrix rows");
};

// cp.async of one INT8 K tile (keys n0..n0+63, D bytes each); keys past nk are zero-filled.
template <int D>
__device__ __forceinline__ void load_k_tile(uint32_t dst, const int8_t* base, int64_t stride_n, int n0, int nk) {
  constexpr int kChunks = D / kChunk;  // 16-byte chunks per row
  for_each_chunk<kBlockN * kChunks>([&](int c) {
    const int row = c / kChunks, ch = c % kChunks;
    const int key = n0 + row;
    const bool ok = key < nk;
    const int8_t* src = ok ? base + static_cast<int64_t>(key) * stride_n + ch * kChunk : base;
    cp_async_16(dst + row * (D + kSmemRowPad) + ch * kChunk, src, ok);
  });
}

// s += Q Kᵀ for one K tile in shared memory (INT32, exact).
template <int D>
__device__ __forceinline__ void qk_mma(int32_t (&s)[kSTiles][4], const uint32_t (&qf)[D / 32][4], uint32_t k_smem,
                                       int ld_mat, int ld_row) {
#pragma unroll
  for (int kk = 0; kk < D / 32; ++kk) {
#pragma unroll
    for (int tp = 0; tp < kSTiles / 2; ++tp) {
      // Matrices: (keys +0..7, bytes +0..15), (keys +0..7, bytes +16..31), (keys +8..15, ...), ...
      const int key = tp * 16 + (ld_mat >> 1) * 8 + ld_row;
      const int byte = kk * 32 + (ld_mat & 1) * 16;
      uint32_t r[4];
      ldmatrix_x4(r, k_smem + key * (D + kSmemRowPad) + byte);
      const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_m16n8k32_s8(s[2 * tp], qf[kk], b0);
      mma_m16n8k32_s8(s[2 * tp + 1], qf[kk], b1);
    }
  }
}

// acc += P V over one key block for the policies' mma(): pf holds P's A fragments (kPSteps MMA steps
// over the block's keys), load_b(tp, kk, r) loads into r[4] the B fragments of output tile pair tp (two
// n8 tiles, r[0..1] and r[2..3]) at step kk, mma_f32(c, a, b) and mma_f16(c, a, b) are the policy's MMAs
// into FP32 and FP16 accumulators. Output tile pairs outermost: a per-block accumulator (kFp32ThenFp32,
// kFp16ThenFp32) then lives for one pair only (8 or 4 registers), not for the whole 16 x D tile, and is
// added into the FP32 output once the block's keys are done.
template <int D, PvAccum kAccum, int kPSteps, typename LoadB, typename MmaF32, typename MmaF16>
__device__ __forceinline__ void pv_mma_tile_pairs(float (&acc)[D / 8][4], const uint32_t (&pf)[kPSteps][4],
                                                  LoadB&& load_b, MmaF32&& mma_f32, MmaF16&& mma_f16) {
#pragma unroll
  for (int tp = 0; tp < D / 16; ++tp) {
    float c32[2][4] = {};
    uint32_t c16[2][2] = {};
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      uint32_t r[4];
      load_b(tp, kk, r);
      const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      if constexpr (kAccum == PvAccum::kFp32) {
        mma_f32(acc[2 * tp], pf[kk], b0);
        mma_f32(acc[2 * tp + 1], pf[kk], b1);
      } else if constexpr (kAccum == PvAccum::kFp32ThenFp32) {
        mma_f32(c32[0], pf[kk], b0);
        mma_f32(c32[1], pf[kk], b1);
      } else {
        mma_f16(c16[0], pf[kk], b0);
        mma_f16(c16[1], pf[kk], b1);
      }
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if constexpr (kAccum == PvAccum::kFp32ThenFp32) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[2 * tp + j][e] += c32[j][e];
      } else if constexpr (kAccum == PvAccum::kFp16ThenFp32) {
        const float2 top = unpack_half2(c16[j][0]), bottom = unpack_half2(c16[j][1]);
        acc[2 * tp + j][0] += top.x;
        acc[2 * tp + j][1] += top.y;
        acc[2 * tp + j][2] += bottom.x;
        acc[2 * tp + j][3] += bottom.y;
      }
    }
  }
}

// Minimum CTAs per SM given to __launch_bounds__ (0: none). Both tile widths run one 256-thread CTA
// per SM (128 to 240 registers per thread). The values only steer ptxas's register target, measured
// with CUDA 13.0: without a minimum it aimed at 128 registers for some d = 64 instances and spilled;
// with a minimum of 1 it spilled in d = 128 instances on sm_90a; with 2 (128 registers) d = 64
// spilled 4 to 32 bytes. These settings give no spill and no stack frame in any instance
// (tests/unit/test_cuda_compile.py checks every target).
template <int D>
constexpr int kMinBlocksPerSm = D <= 64 ? 1 : 0;

template <class Pv, int D, bool kCausal, bool kResidual, PvAccum kAccum, typename OutT>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm<D>) attn_kernel(const MmaAttnArgs p) {
  using St = Stage<D, kResidual, Pv>;
  constexpr int kQSteps = D / 32;  // m16n8k32 steps over the head dim
  constexpr int kOTiles = D / 8;   // n8 output tiles
  extern __shared__ __align__(128) uint8_t smem[];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;
  // Causal: the last row blocks see the most keys; launching them first balances the tail.
  const int block_m = kCausal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, hk = h / p.kv_group;
  const int m0 = block_m * kBlockM;
  const int warp_row0 = m0 + warp * kRowsPerWarp;
  const int row[2] = {warp_row0 + group, warp_row0 + group + 8};
  const bool row_ok[2] = {row[0] < p.nq, row[1] < p.nq};

  // Q fragments, held for the whole CTA.
  uint32_t qf[kQSteps][4];
  {
    const int8_t* q_base = p.q + b * p.q_strides.b + h * p.q_strides.h;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int8_t* r = q_base + static_cast<int64_t>(row_ok[i] ? row[i] : 0) * p.q_strides.n + quad * 4;
#pragma unroll
      for (int kk = 0; kk < kQSteps; ++kk) {
        qf[kk][i] = load_u32_or_zero(r + kk * 32, row_ok[i]);
        qf[kk][i + 2] = load_u32_or_zero(r + kk * 32 + 16, row_ok[i]);
      }
    }
  }
  float q_scale[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    q_scale[i] = row_ok[i] ? p.q_scale[b * p.q_scale_strides.b + h * p.q_scale_strides.h +
                                       static_cast<int64_t>(row[i]) * p.q_scale_strides.n]
                           : 0.0f;
  }

  const int8_t* k_base = p.k + b * p.k_strides.b + hk * p.k_strides.h;
  const int8_t* kr_base = kResidual ? p.k_residual + b * p.k_residual_strides.b + hk * p.k_residual_strides.h
                                    : nullptr;
  const float* ks_base = p.k_scale + b * p.k_scale_strides.b + hk * p.k_scale_strides.h;
  const int kv_end = kCausal ? min(p.nk, m0 + kBlockM) : p.nk;
  const int n_blocks = (kv_end + kBlockN - 1) / kBlockN;

  auto load_block = [&](int blk) {
    const uint32_t stage = smem_addr(smem + (blk & 1) * St::kBytes);
    const int n0 = blk * kBlockN;
    load_k_tile<D>(stage, k_base, p.k_strides.n, n0, p.nk);
    if constexpr (kResidual) load_k_tile<D>(stage + St::kKBytes, kr_base, p.k_residual_strides.n, n0, p.nk);
    Pv::template load<D>(stage + St::kVOffset, p, b, hk, n0);
  };

  float acc[kOTiles][4];
#pragma unroll
  for (int t = 0; t < kOTiles; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
  float m_run[2] = {neg_inf(), neg_inf()};
  float l_part[2] = {0.0f, 0.0f};  // this thread's share of the row sum; reduced over the quad at the end

  // ldmatrix lane roles: matrix lane / 8, row lane % 8.
  const int ld_mat = lane / 8, ld_row = lane % 8;

  if (n_blocks > 0) load_block(0);
  cp_async_commit();

  for (int blk = 0; blk < n_blocks; ++blk) {
    if (blk + 1 < n_blocks) load_block(blk + 1);
    cp_async_commit();  // possibly empty: keeps the group count uniform for the wait below
    cp_async_wait<1>();
    __syncthreads();

    const int n0 = blk * kBlockN;
    // Causal: a warp whose 16 rows all precede this block sees none of its keys; it skips the MMAs
    // (its state is unchanged: every score would be -inf). Warp-uniform, so no divergence.
    const bool warp_active = !kCausal || n0 <= warp_row0 + kRowsPerWarp - 1;
    if (warp_active) {
      const uint32_t k_smem = smem_addr(smem + (blk & 1) * St::kBytes);

      // S = Q Kᵀ in INT32; two-level K: 254 * (Q K1ᵀ) + Q K2ᵀ, still exact (sage_attn_mma.h).
      int32_t s_int[kSTiles][4];
#pragma unroll
      for (int t = 0; t < kSTiles; ++t) s_int[t][0] = s_int[t][1] = s_int[t][2] = s_int[t][3] = 0;
      qk_mma<D>(s_int, qf, k_smem, ld_mat, ld_row);
      if constexpr (kResidual) {
#pragma unroll
        for (int t = 0; t < kSTiles; ++t) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s_int[t][e] *= kKResidualMul;
        }
        qk_mma<D>(s_int, qf, k_smem + St::kKBytes, ld_mat, ld_row);
      }

      // Scale into the log2 domain (the product q_scale * k_scale first, as sage_ref), mask, softmax.
      const float k_scale = __ldg(ks_base + static_cast<int64_t>(blk) * p.k_scale_strides.n);
      const float qk_scale[2] = {q_scale[0] * k_scale, q_scale[1] * k_scale};
      const bool edge = n0 + kBlockN > p.nk || (kCausal && n0 + kBlockN - 1 > warp_row0);
      float s[kSTiles][4];
#pragma unroll
      for (int t = 0; t < kSTiles; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = static_cast<float>(s_int[t][e]) * qk_scale[e / 2];
          if (edge) {
            const int key = n0 + t * 8 + quad * 2 + (e & 1);
            const bool visible = key < p.nk && (!kCausal || key <= row[e / 2]);
            x = visible ? x : neg_inf();
          }
          s[t][e] = x;
        }
      }
      float alpha[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mx = m_run[i];
#pragma unroll
        for (int t = 0; t < kSTiles; ++t) mx = fmaxf(mx, fmaxf(s[t][2 * i], s[t][2 * i + 1]));
        const float m_new = quad_max(mx);
        const float m_safe = m_new == neg_inf() ? 0.0f : m_new;  // a row that has seen no key yet
        alpha[i] = exp2f(m_run[i] - m_safe);
        m_run[i] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int t = 0; t < kSTiles; ++t) {
          s[t][2 * i] = exp2f(s[t][2 * i] - m_safe);
          s[t][2 * i + 1] = exp2f(s[t][2 * i + 1] - m_safe);
          sum += s[t][2 * i] + s[t][2 * i + 1];
        }
        l_part[i] = l_part[i] * alpha[i] + sum;
      }
#pragma unroll
      for (int t = 0; t < kOTiles; ++t) {
        acc[t][0] *= alpha[0];
        acc[t][1] *= alpha[0];
        acc[t][2] *= alpha[1];
        acc[t][3] *= alpha[1];
      }

      // O += P V, P straight from the accumulator layout (sage_mma.cuh).
      Pv::template mma<D, kAccum>(acc, s, k_smem + St::kVOffset, ld_mat, ld_row);
    }
    __syncthreads();  // the next iteration's copies overwrite the stage just read
  }
  cp_async_wait<0>();

  // Epilogue: divide by the row sum (and P's scale), apply the policy's channel scale, store the valid
  // rows and channels, then the LSE.
  using Pair = OutPair<OutT>;
  OutT* out_base = static_cast<OutT*>(p.out) + b * p.out_strides.b + h * p.out_strides.h;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float l = quad_sum(l_part[i]);
    const float inv = l > 0.0f ? 1.0f / (l * Pv::kPScale) : 0.0f;
    if (!row_ok[i]) continue;
    OutT* o = out_base + static_cast<int64_t>(row[i]) * p.out_strides.n;
#pragma unroll
    for (int t = 0; t < kOTiles; ++t) {
      const int ch = t * 8 + quad * 2;
      if (ch < p.head_dim) {  // head_dim is a multiple of 8, so ch + 1 is valid too
        const float2 f = Pv::channel_scale(p, b, hk, ch);
        *reinterpret_cast<typename Pair::type*>(o + ch) =
            Pair::make(acc[t][2 * i] * inv * f.x, acc[t][2 * i + 1] * inv * f.y);
      }
    }
    if (p.lse != nullptr && quad == 0) {
      const int64_t off = b * p.lse_strides.b + h * p.lse_strides.h + static_cast<int64_t>(row[i]) * p.lse_strides.n;
      float lse = (m_run[i] + log2f(l)) * kLn2;
      if (p.corr != nullptr) {
        lse += p.corr[b * p.corr_strides.b + h * p.corr_strides.h + static_cast<int64_t>(row[i]) * p.corr_strides.n];
      }
      p.lse[off] = lse;
    }
  }
}

template <class Pv, int D, bool kCausal, bool kResidual, PvAccum kAccum, typename OutT>
cudaError_t launch(const MmaAttnArgs& args, cudaStream_t stream) {
  auto* kernel = attn_kernel<Pv, D, kCausal, kResidual, kAccum, OutT>;
  constexpr int kSmem = Stage<D, kResidual, Pv>::kTotal;
  if constexpr (kSmem > 48 * 1024) {  // above the default dynamic limit: opt in (sm86/89 allow 99 KiB)
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) return err;
  }
  const dim3 grid((args.nq + kBlockM - 1) / kBlockM, args.heads_q, args.batch);
  kernel<<<grid, kThreads, kSmem, stream>>>(args);
  return cudaGetLastError();
}

// Runtime arguments -> template instance. kWithResidual: whether the family has two-level K instances
// (FP16 P·V); kAccums: the accumulations it is built with.
template <class Pv, bool kWithResidual, PvAccum... kAccums>
struct Dispatch {
  static cudaError_t run(const MmaAttnArgs& args, cudaStream_t stream) {
    if (args.head_dim <= 0 || args.head_dim % 8 != 0 || args.head_dim > args.d_pad) return cudaErrorInvalidValue;
    if (args.kv_group < 1 || args.heads_q % args.kv_group != 0) return cudaErrorInvalidValue;
    if (!kWithResidual && args.k_residual != nullptr) return cudaErrorInvalidValue;
    if (args.nq == 0 || args.batch == 0 || args.heads_q == 0) return cudaSuccess;  // nothing to compute
    switch (args.d_pad) {
      case 64:
        return by_causal<64>(args, stream);
      case 128:
        return by_causal<128>(args, stream);
      default:
        return cudaErrorInvalidValue;
    }
  }

 private:
  template <int D>
  static cudaError_t by_causal(const MmaAttnArgs& args, cudaStream_t stream) {
    return args.causal ? by_residual<D, true>(args, stream) : by_residual<D, false>(args, stream);
  }

  template <int D, bool kCausal>
  static cudaError_t by_residual(const MmaAttnArgs& args, cudaStream_t stream) {
    if constexpr (kWithResidual) {
      if (args.k_residual != nullptr) return by_accum<D, kCausal, true>(args, stream);
    }
    return by_accum<D, kCausal, false>(args, stream);
  }

  template <int D, bool kCausal, bool kResidual>
  static cudaError_t by_accum(const MmaAttnArgs& args, cudaStream_t stream) {
    cudaError_t err = cudaErrorInvalidValue;  // an accumulation this family is not built with
    (void)((args.accum == kAccums && ((err = by_out<D, kCausal, kResidual, kAccums>(args, stream)), true)) || ...);
    return err;
  }

  template <int D, bool kCausal, bool kResidual, PvAccum kAccum>
  static cudaError_t by_out(const MmaAttnArgs& args, cudaStream_t stream) {
    return args.out_type == HalfType::kFloat16 ? launch<Pv, D, kCausal, kResidual, kAccum, __half>(args, stream)
                                               : launch<Pv, D, kCausal, kResidual, kAccum, __nv_bfloat16>(args, stream);
  }
};

}  // namespace mma_attn
}  // namespace sage
