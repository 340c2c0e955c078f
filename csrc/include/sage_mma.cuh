// Warp-level tensor-core MMA wrappers (mma.sync, sm_80 and newer) and the register packing they need.
//
// Fragment ownership, for a warp's lane = 4 * group + quad (group = lane / 4, quad = lane % 4):
//   m16n8 accumulators (s32, f32): c[0], c[1] at row `group`, columns 2*quad, 2*quad+1;
//                                  c[2], c[3] at row `group + 8`, same columns.
//   m16n8k32 s8 A (16x32, row-major): a[0] row group, bytes 4*quad..+3; a[1] row group+8, same bytes;
//                                     a[2], a[3] as a[0], a[1] at byte offset +16.
//   m16n8k32 s8 B (32x8, column n = one key): b[0] column group, bytes 4*quad..+3; b[1] at +16.
//   m16n8k16 f16 A (16x16): a[0] row group, halves 2*quad, 2*quad+1; a[1] row group+8; a[2], a[3] as
//                           a[0], a[1] at column +8.
//   m16n8k16 f16 B (16x8): b[0] rows 2*quad, 2*quad+1 of column group; b[1] at row +8.
// The C layout of one m16n8 tile pair (keys 16j..16j+15) is exactly the A layout of m16n8k16, which
// is why the softmax probabilities go from the QK^T accumulators into the P·V MMA without shared memory.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace sage {

// D = A * B + C, INT8 x INT8 -> INT32, 16x8x32 per warp (exact: |sum| <= 32 * 127^2 << 2^31).
__device__ __forceinline__ void mma_m16n8k32_s8(int32_t (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// D = A * B + C, FP16 x FP16 -> FP32 accumulators, 16x8x16 per warp.
__device__ __forceinline__ void mma_m16n8k16_f16_f32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// D = A * B + C, FP16 x FP16 -> FP16 accumulators (two halves per register: row group / group + 8).
__device__ __forceinline__ void mma_m16n8k16_f16_f16(uint32_t (&d)[2], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%0,%1};\n"
      : "+r"(d[0]), "+r"(d[1])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two floats -> one register of two FP16 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ float2 unpack_half2(uint32_t x) {
  return __half22float2(*reinterpret_cast<const __half2*>(&x));
}

}  // namespace sage
