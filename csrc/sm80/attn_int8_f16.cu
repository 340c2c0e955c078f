// sm80-family attention: INT8 Q·Kᵀ (mma.sync m16n8k32 s8, optionally two-level K), FP16 P·V
// (mma.sync m16n8k16), FP32 online softmax with exp2. The kernel is the shared mma.sync kernel of
// sage_attn_mma.cuh with the FP16 P·V policy below; it reproduces
// sageattention.reference.sage_ref(pv=FP16, block_m=1, block_n=64, k_residual=<k_residual given>).
//
// V tile: 64 keys x D channels of FP16, key-major as V is stored, rows of 2D bytes padded to 2D + 16
// (144 or 272 bytes: conflict-free ldmatrix, see sage_attn_mma.cuh); ldmatrix.trans turns it into
// m16n8k16 B fragments. Shared memory per stage: K 64 x (D + 16) bytes, K's second digit the same
// when two-level, V 64 x (2D + 16); two stages: 28 / 38 KiB (d = 64, one / two K digits) or
// 52 / 70 KiB (d = 128), the last two above the 48 KiB static limit, hence dynamic shared memory
// with the opt-in attribute.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "sage_attn_mma.cuh"
#include "sm80/attn.h"

namespace sage {
namespace sm80 {

using namespace mma_attn;

struct PvF16 {
  static constexpr float kPScale = 1.0f;  // P in [0, 1] is an FP16 value as it is

  template <int D>
  struct VTile {
    static constexpr int kPitch = D * 2 + kSmemRowPad;  // one key's FP16 row
    static constexpr int kBytes = kBlockN * kPitch;
  };

  template <int D>
  static __device__ __forceinline__ void load(uint32_t dst, const MmaAttnArgs& p, int b, int hk, int n0) {
    constexpr int kChunks = D * 2 / kChunk;  // 16-byte chunks per V row
    const __half* base = static_cast<const __half*>(p.v) + b * p.v_strides.b + hk * p.v_strides.h;
    for_each_chunk<kBlockN * kChunks>([&](int c) {
      const int row = c / kChunks, ch = c % kChunks;
      const int key = n0 + row;
      // Channels past head_dim (a head dim of 72 in a 128 tile, say) are zero-filled: they meet zero
      // output columns that are never stored, but must not be NaN.
      const bool ok = key < p.nk && ch * (kChunk / 2) < p.head_dim;
      const __half* src = ok ? base + static_cast<int64_t>(key) * p.v_strides.n + ch * (kChunk / 2) : base;
      cp_async_16(dst + row * VTile<D>::kPitch + ch * kChunk, src, ok);
    });
  }

  template <int D, PvAccum kAccum>
  static __device__ __forceinline__ void mma(float (&acc)[D / 8][4], const float (&s)[kSTiles][4], uint32_t v_smem,
                                             int ld_mat, int ld_row) {
    constexpr int kPSteps = kBlockN / 16;  // m16n8k16 steps over the keys
    // P in FP16: the C layout of two n8 tiles is the m16n8k16 A layout.
    uint32_t pf[kPSteps][4];
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      pf[kk][0] = pack_half2(s[2 * kk][0], s[2 * kk][1]);
      pf[kk][1] = pack_half2(s[2 * kk][2], s[2 * kk][3]);
      pf[kk][2] = pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pf[kk][3] = pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
    pv_mma_tile_pairs<D, kAccum>(
        acc, pf,
        [&](int tp, int kk, uint32_t(&r)[4]) {
          // Matrices: (keys +0..7, ch +0..7), (keys +8..15, ch +0..7), (keys +0..7, ch +8..15), ...
          const int key = kk * 16 + (ld_mat & 1) * 8 + ld_row;
          const int ch = tp * 16 + (ld_mat >> 1) * 8;
          ldmatrix_x4_trans(r, v_smem + key * VTile<D>::kPitch + ch * 2);
        },
        [](float(&c)[4], const uint32_t(&a)[4], const uint32_t(&b)[2]) { mma_m16n8k16_f16_f32(c, a, b); },
        // FP16 accumulators for one 64-key block: P <= 1, so a block sum is at most 64 * max|V|.
        [](uint32_t(&c)[2], const uint32_t(&a)[4], const uint32_t(&b)[2]) { mma_m16n8k16_f16_f16(c, a, b); });
  }

  static __device__ __forceinline__ float2 channel_scale(const MmaAttnArgs&, int, int, int) {
    return make_float2(1.0f, 1.0f);
  }
};

}  // namespace sm80

cudaError_t launch_qk_int8_sv_f16_attn_sm80(const AttnSm80Args& args, cudaStream_t stream) {
  return mma_attn::Dispatch<sm80::PvF16, /*kWithResidual=*/true, PvAccum::kFp32, PvAccum::kFp16ThenFp32>::run(args, stream);
}

}  // namespace sage
