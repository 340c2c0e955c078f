// sm89-family attention: INT8 Q·Kᵀ (mma.sync m16n8k32 s8), FP8 e4m3 P·V (mma.sync m16n8k32 e4m3),
// FP32 online softmax with exp2. The kernel is the shared mma.sync kernel of sage_attn_mma.cuh (the
// one the sm80 family runs) with the FP8 P·V policy below; it reproduces
// sageattention.reference.sage_ref(pv=FP8, block_m=1, block_n=64): P is scaled by 448 and rounded to
// e4m3, V is e4m3 per channel, the output is divided by 448 and multiplied by V's channel scale.
//
// P without shared memory. A thread's score accumulators of keys 32j..32j+31 are keys
// {2q, 2q+1, 8+2q, 9+2q} and the same +16 (q = lane % 4); the 8-bit A operand of m16n8k32 wants keys
// 4q..4q+3 and 16+4q..16+4q+3 from it. They are packed in their natural order, and V's keys are
// permuted to match by the fused quantization (quant_v_fp8(..., permute_keys=True)): slot 4q + r of
// each 16 holds key 8 * (r / 2) + 2q + r % 2. The B operand (32 keys x 8 channels, keys contiguous per
// channel) then comes from Vᵀ with ldmatrix (not .trans), like K for Q·Kᵀ.
//
// Accumulation (PvAccum): kFp32 adds every MMA into the running output; kFp32ThenFp32 gives each
// 64-key block fresh FP32 accumulators and adds them in ("fp32+fp32": sm89's FP8 tensor cores keep
// fewer than 23 mantissa bits while accumulating, so the long sum happens in registers);
// kFp16ThenFp32 uses the FP16-accumulating e4m3 MMA per block ("fp32+fp16", CUDA >= 12.8; V is then
// quantized with kSm89Fp16AccumVHeadroom so no block sum can overflow).
//
// Vᵀ tile: D channels x 64 key slots, rows padded to 80 bytes (conflict-free ldmatrix, see
// sage_attn_mma.cuh). Shared memory per stage: K 64 x (D + 16) + Vᵀ D x 80 bytes; two stages:
// 20 KiB (d = 64) or 38 KiB (d = 128), within the 48 KiB static limit.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "sage_attn_mma.cuh"
#include "sm89/attn.h"

namespace sage {
namespace sm89 {

using namespace mma_attn;

struct PvF8 {
  static constexpr float kPScale = kFp8E4M3Max;  // P in [0, 1] -> P * 448 in e4m3's range

  template <int D>
  struct VTile {
    static constexpr int kPitch = kBlockN + kSmemRowPad;  // one channel's 64 key slots
    static constexpr int kBytes = D * kPitch;
  };

  template <int D>
  static __device__ __forceinline__ void load(uint32_t dst, const MmaAttnArgs& p, int b, int hk, int n0) {
    constexpr int kChunks = kBlockN / kChunk;  // 16-byte chunks per channel row
    const uint8_t* base = static_cast<const uint8_t*>(p.v) + b * p.v_strides.b + hk * p.v_strides.h;
    for_each_chunk<D * kChunks>([&](int c) {
      const int ch = c / kChunks, part = c % kChunks;
      const int slot = n0 + part * kChunk;
      // Slots from nk to n_pad hold zeros (the quantization writes them); past n_pad the tile is
      // zero-filled. Either way P is 0 there, and 0 * 0 stays 0.
      const bool ok = slot < p.n_pad;
      const uint8_t* src = ok ? base + static_cast<int64_t>(ch) * p.v_strides.n + slot : base;
      cp_async_16(dst + ch * VTile<D>::kPitch + part * kChunk, src, ok);
    });
  }

  template <int D, PvAccum kAccum>
  static __device__ __forceinline__ void mma(float (&acc)[D / 8][4], const float (&s)[kSTiles][4], uint32_t v_smem,
                                             int ld_mat, int ld_row) {
    constexpr int kPSteps = kBlockN / 32;  // m16n8k32 steps over the keys
    // P * 448 in e4m3, packed in the natural key order of the accumulators (see above).
    uint32_t pf[kPSteps][4];
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      const float(&t0)[4] = s[4 * kk];
      const float(&t1)[4] = s[4 * kk + 1];
      const float(&t2)[4] = s[4 * kk + 2];
      const float(&t3)[4] = s[4 * kk + 3];
      pf[kk][0] = cvt_e4m3x4(t0[0] * kPScale, t0[1] * kPScale, t1[0] * kPScale, t1[1] * kPScale);
      pf[kk][1] = cvt_e4m3x4(t0[2] * kPScale, t0[3] * kPScale, t1[2] * kPScale, t1[3] * kPScale);
      pf[kk][2] = cvt_e4m3x4(t2[0] * kPScale, t2[1] * kPScale, t3[0] * kPScale, t3[1] * kPScale);
      pf[kk][3] = cvt_e4m3x4(t2[2] * kPScale, t2[3] * kPScale, t3[2] * kPScale, t3[3] * kPScale);
    }
    pv_mma_tile_pairs<D, kAccum>(
        acc, pf,
        [&](int tp, int kk, uint32_t(&r)[4]) {
          // Matrices: (channels +0..7, slots +0..15), (channels +0..7, slots +16..31), (channels +8..15, ...), ...
          const int ch = tp * 16 + (ld_mat >> 1) * 8 + ld_row;
          const int slot = kk * 32 + (ld_mat & 1) * 16;
          ldmatrix_x4(r, v_smem + ch * VTile<D>::kPitch + slot);
        },
        [](float(&c)[4], const uint32_t(&a)[4], const uint32_t(&b)[2]) { mma_m16n8k32_e4m3_f32(c, a, b); },
        [](uint32_t(&c)[2], const uint32_t(&a)[4], const uint32_t(&b)[2]) {
#if SAGE_HAS_MMA_E4M3_F16
          mma_m16n8k32_e4m3_f16(c, a, b);
#else
          (void)c, (void)a, (void)b;  // no instance accumulates in FP16 without the instruction
#endif
        });
  }

  static __device__ __forceinline__ float2 channel_scale(const MmaAttnArgs& p, int b, int hk, int ch) {
    const float* vs = p.v_scale + b * p.v_scale_strides.b + hk * p.v_scale_strides.h;
    return make_float2(__ldg(vs + static_cast<int64_t>(ch) * p.v_scale_strides.n),
                       __ldg(vs + static_cast<int64_t>(ch + 1) * p.v_scale_strides.n));
  }
};

}  // namespace sm89

bool sm89_fp16_accum_built() { return SAGE_HAS_MMA_E4M3_F16 != 0; }

cudaError_t launch_qk_int8_sv_f8_attn_sm89(const AttnSm89Args& args, cudaStream_t stream) {
#if SAGE_HAS_MMA_E4M3_F16
  return mma_attn::Dispatch<sm89::PvF8, /*kWithResidual=*/false, PvAccum::kFp32, PvAccum::kFp32ThenFp32,
                            PvAccum::kFp16ThenFp32>::run(args, stream);
#else
  if (args.accum == PvAccum::kFp16ThenFp32) return cudaErrorNotSupported;
  return mma_attn::Dispatch<sm89::PvF8, /*kWithResidual=*/false, PvAccum::kFp32, PvAccum::kFp32ThenFp32>::run(
      args, stream);
#endif
}

}  // namespace sage
