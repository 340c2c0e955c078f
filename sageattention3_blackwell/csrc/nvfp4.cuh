// NVFP4 device primitives: conversions, the two MMA instructions the attention kernel uses, and the
// register-fragment layouts they expect. CUDA headers only. The arithmetic is the recipe of
// sageattn3/reference.py: conversions round to nearest even and saturate (the reference's clamp),
// divisions are correctly rounded.
//
// Which instruction exists where (checked with ptxas of CUDA 13.0):
//   cvt.rn.satfinite.e2m1x2.f32            sm_100a, sm_120a (not sm_90a: software rounding there)
//   cvt.rn.satfinite.e4m3x2.f32            sm_89 and newer
//   mma.sync ... kind::mxf4nvf4.block_scale sm_120a/sm_121a only ("not supported on .target sm_100a":
//                                          sm_100a does block-scaled FP4 only through tcgen05.mma)
//   mma.sync.m16n8k16 f16 -> f32           sm_80 and newer (sm_90a, sm_100a, sm_120a)
//
// Every inline-PTX instruction lives here, each with a plain C++ twin under SAGE3_HOST_EMULATION:
// tests/emulation/ runs the kernels on the CPU (a thread per CUDA thread) through those twins, so the
// fragment layouts and index arithmetic are checked on machines without the GPU.
#pragma once

#include <cuda_fp16.h>

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

// ------------------------------------------------------------------------------------------------
// Element conversions

// float -> E2M1 code (0..15) in software: the reference's thresholds, ties to the even code,
// saturating at 6; the sign bit is set iff y < 0. For targets without the cvt instruction.
__device__ __forceinline__ uint32_t e2m1_code_sw(float y) {
  const float a = fabsf(y);
  const uint32_t mag = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) +
                       (a > 5.0f);
  return mag | (y < 0.f ? 8u : 0u);
}

// Two floats -> two E2M1 codes in one byte: `lo` in bits 0..3, `hi` in bits 4..7 (the element with
// the lower index in the lower nibble, the order the tensor cores read).
__device__ __forceinline__ uint32_t e2m1x2(float lo, float hi) {
#if defined(SAGE3_HAS_FP4_CVT) && !defined(SAGE3_HOST_EMULATION)
  uint16_t out;
  // cvt ... d, a, b puts a in the upper nibble and b in the lower one.
  asm("{\n .reg .b8 t;\n cvt.rn.satfinite.e2m1x2.f32 t, %1, %2;\n cvt.u16.u8 %0, t;\n}" : "=h"(out) : "f"(hi), "f"(lo));
  return out & 0xFFu;
#else
  return e2m1_code_sw(lo) | (e2m1_code_sw(hi) << 4);
#endif
}

// Non-negative float -> E4M3 byte (round to nearest even, saturating at 448).
__device__ __forceinline__ uint32_t e4m3(float x) {
#ifdef SAGE3_HOST_EMULATION
  return emu::e4m3_rn_satfinite(x);
#else
  uint16_t out;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(out) : "f"(0.f), "f"(x));
  return out & 0xFFu;
#endif
}

__device__ __forceinline__ float e4m3_to_float(uint32_t b) {
  const uint32_t exp = (b >> 3) & 15, man = b & 7;
  return exp == 0 ? man * 0.001953125f : __uint_as_float((exp + 120) << 23 | man << 20);
}

// An E4M3 scale as the two halves of a half2 (every E4M3 value is exact in fp16: 2^-9 .. 448).
__device__ __forceinline__ uint32_t e4m3_to_half2(uint32_t b) {
  const __half h = __float2half_rn(e4m3_to_float(b));
  const uint32_t bits = __half_as_ushort(h);
  return bits | (bits << 16);
}

// One byte of two E2M1 codes -> half2 of their values (low nibble in the low half). The 8
// magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 have fp16 encodings whose low bytes are 0, so a byte
// permute of the table of their high bytes (0x00 38 3C 3E 40 42 44 46) builds both halves at
// once; the sign bits are copied in. Exact.
__device__ __forceinline__ uint32_t e2m1x2_to_half2(uint32_t byte) {
  const uint32_t select = ((byte & 0x70u) << 8) | ((byte & 0x07u) << 4);  // nibbles 1 and 3; 0 -> 0x00
  const uint32_t mags = __byte_perm(0x3E3C3800u, 0x46444240u, select);
  return mags | ((byte & 0x08u) << 12) | ((byte & 0x80u) << 24);
}

__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
#ifdef SAGE3_HOST_EMULATION
  return emu::hmul2(a, b);
#else
  uint32_t out;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(out) : "r"(a), "r"(b));
  return out;
#endif
}

// value(code) * scale for the two codes of a byte, as half2: exact (at most 6 significant bits,
// magnitudes in [2^-10, 2688]), so an fp16 MMA of these multiplies the NVFP4 group values exactly.
__device__ __forceinline__ uint32_t group_values_half2(uint32_t byte, uint32_t scale_half2) {
  return hmul2(e2m1x2_to_half2(byte), scale_half2);
}

__device__ __forceinline__ uint32_t byte_of(uint32_t word, int i) { return (word >> (8 * i)) & 0xFFu; }

// ------------------------------------------------------------------------------------------------
// Warp-level MMAs. Lane l: g = l / 4 (group), t = l % 4 (thread in group). C/D fragments of both:
//   d[0], d[1]: row g, cols 2t, 2t+1;  d[2], d[3]: row g+8, cols 2t, 2t+1.

#ifdef SAGE3_HAS_MMA_BLOCK_SCALE
// D += (A * sfa) (B * sfb)^T with A 16x64 and B 8x64 in E2M1 (8 codes per register, the lower k in
// the lower nibble) and one UE4M3 scale per 16 k: scale_vec::4X, byte j of a scale register
// scales k in [16j, 16j + 16).
//   a[0]: row g,   k 8t..8t+7      a[1]: row g+8, k 8t..8t+7
//   a[2]: row g,   k 32+8t..+7     a[3]: row g+8, k 32+8t..+7
//   b[0]: col g,   k 8t..8t+7      b[1]: col g,   k 32+8t..+7
//   sfa: with thread-id-a = 0, lanes t = 0 (and 2) give row g's 4 scales, t = 1 (and 3) row g+8's
//   sfb: with thread-id-b = 0, lane t = 0 gives col g's 4 scales (the kernels fill all 4 lanes)
__device__ __forceinline__ void mma_nvfp4_16x8x64(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                  uint32_t sfa, uint32_t sfb) {
#ifdef SAGE3_HOST_EMULATION
  emu::mma_nvfp4_16x8x64(d, a, b, sfa, sfb);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}, %10, {0, 0}, %11, {0, 0};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(sfa), "r"(sfb));
#endif
}
#endif

// D += A B^T with A 16x16 and B 8x16 in fp16 (half2 registers, the lower k in the lower half).
//   a[0]: row g, k 2t, 2t+1    a[1]: row g+8, k 2t, 2t+1    a[2]: row g, k 8+2t..    a[3]: row g+8, k 8+2t..
//   b[0]: col g, k 2t, 2t+1    b[1]: col g, k 8+2t, 8+2t+1
__device__ __forceinline__ void mma_f16_16x8x16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef SAGE3_HOST_EMULATION
  emu::mma_f16_16x8x16(d, a, b);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// ------------------------------------------------------------------------------------------------
// cp.async (sm_80 and newer): global -> shared copies that overlap the MMAs of the previous tile.

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#ifdef SAGE3_HOST_EMULATION
  emu::copy_bytes(smem, gmem, 16);
#else
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
#endif
}

__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
#ifdef SAGE3_HOST_EMULATION
  emu::copy_bytes(smem, gmem, 8);
#else
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(gmem));
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#ifndef SAGE3_HOST_EMULATION
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifndef SAGE3_HOST_EMULATION
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// ------------------------------------------------------------------------------------------------
// Quad (4 lanes of one group g) helpers.

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// 4x4 byte transpose within a quad: byte s of the result of lane t is byte t of lane s's `x`.
// Turns bytes held in the accumulator layout (lane t: keys 2t, 2t+1 of each of 4 consecutive
// 8-key tiles) into an A operand register of the k64 FP4 MMA (lane t: keys 8t..8t+7 of the
// 32 keys).
__device__ __forceinline__ uint32_t quad_transpose_bytes(uint32_t x) {
  const int lane = threadIdx.x & 31, t = lane & 3;
  uint32_t y = 0;
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const uint32_t w = __shfl_sync(0xffffffffu, x, (lane & ~3) | s);
    y |= byte_of(w, t) << (8 * s);
  }
  return y;
}

}  // namespace sage3
