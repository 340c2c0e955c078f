// NVFP4 device primitives for Blackwell (sm_100a, sm_120a): conversions and the block-scaled MMA.
// CUDA headers only. The arithmetic is the recipe of sageattn3/reference.py: the conversions round
// to nearest even and saturate (the reference's clamp), divisions are correctly rounded.
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM120_ALL) || \
    defined(__CUDA_ARCH_FEAT_SM121_ALL)
#define SAGE3_HAS_FP4_CVT 1  // cvt.*.e2m1x2 exists only on the arch-specific Blackwell targets
#endif

#if defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_FEAT_SM121_ALL)
#define SAGE3_HAS_MMA_BLOCK_SCALE 1  // mma.sync ... block_scale: sm_120a; sm_100a has tcgen05.mma instead
#endif

namespace sage3 {

// 6 * 448: a block's largest magnitude maps to the top of the E2M1 x E4M3 range.
constexpr float kFp4E4m3Range = 2688.0f;
constexpr float kE2m1Max = 6.0f;
constexpr int kGroup = 16;  // elements per E4M3 scale

// a / b correctly rounded; 0 when b == 0 (all-zero block or group).
__device__ __forceinline__ float div_or_zero(float a, float b) { return b > 0.f ? __fdiv_rn(a, b) : 0.f; }

#ifdef SAGE3_HAS_FP4_CVT
// Two floats -> two E2M1 codes in one byte: `lo` in bits 0..3, `hi` in bits 4..7.
__device__ __forceinline__ uint8_t e2m1x2(float lo, float hi) {
  uint16_t out;
  asm("{\n .reg .b8 t;\n cvt.rn.satfinite.e2m1x2.f32 t, %1, %2;\n cvt.u16.u8 %0, t;\n}" : "=h"(out) : "f"(hi), "f"(lo));
  return static_cast<uint8_t>(out);
}
#endif

// Non-negative float -> E4M3 byte (round to nearest even, saturating at 448).
__device__ __forceinline__ uint8_t e4m3(float x) {
  uint16_t out;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(out) : "f"(0.f), "f"(x));
  return static_cast<uint8_t>(out & 0xFF);
}

__device__ __forceinline__ float e4m3_to_float(uint8_t b) {
  const int exp = (b >> 3) & 15, man = b & 7;
  return exp == 0 ? man * 0.001953125f : __uint_as_float(static_cast<uint32_t>((exp + 120) << 23 | man << 20));
}

#ifdef SAGE3_HAS_MMA_BLOCK_SCALE
// D = (A * sfa) (B * sfb)^T + C for one warp: A 16x64 and B 8x64 E2M1 (8 codes per register, the
// lower k in the lower nibble), one UE4M3 scale per 16 k (4 per row, byte j for k in [16j, 16j+16)).
// Fragments: lane l, g = l / 4, t = l % 4:
//   a[0]: row g, k 8t..8t+7; a[1]: row g+8; a[2]: row g, k+32; a[3]: row g+8, k+32
//   b[0]: col g, k 8t..8t+7; b[1]: k+32
//   sfa: lanes with t == 0 hold row g's 4 scales, t == 1 row g+8's; sfb: every lane col g's
//   c/d[0..1]: row g, cols 2t, 2t+1; c/d[2..3]: row g+8
__device__ __forceinline__ void mma_nvfp4_16x8x64(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                  uint32_t sfa, uint32_t sfb) {
  const uint16_t byte_id = 0, thread_id = 0;
  asm volatile(
      "mma.sync.aligned.kind::mxf4nvf4.block_scale.scale_vec::4X.m16n8k64.row.col.f32.e2m1.e2m1.f32.ue4m3 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13}, {%14}, {%15, %16}, {%17}, {%18, %19};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(d[0]), "f"(d[1]), "f"(d[2]),
        "f"(d[3]), "r"(sfa), "h"(byte_id), "h"(thread_id), "r"(sfb), "h"(byte_id), "h"(thread_id));
}
#endif

}  // namespace sage3
