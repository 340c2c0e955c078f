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
//   m16n8k32 e4m3 A and B: as the s8 shape (one byte per element).
// The C layout of one m16n8 tile pair (keys 16j..16j+15) is exactly the A layout of m16n8k16, which
// is why the softmax probabilities go from the QK^T accumulators into the P·V MMA without shared memory.
// For the 8-bit m16n8k32 A operand it is not: a thread's accumulators of keys 32j..32j+31 are keys
// {2q, 2q+1, 8+2q, 9+2q} (+16), while A wants keys 4q..4q+3 (+16) from it. Packing them in their
// natural order and permuting V's keys the same way (csrc/fused/quant.h, permute_keys) pairs every
// P element with its own key, again without shared memory.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

// mma.sync with e4m3 inputs and FP16 accumulators is PTX ISA 8.7, first shipped with CUDA 12.8.
// (-DSAGE_HAS_MMA_E4M3_F16=0 builds what an older CUDA builds; tests/unit/test_cuda_compile.py does.)
#ifndef SAGE_HAS_MMA_E4M3_F16
#if defined(__CUDACC_VER_MAJOR__) && \
    (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 8))
#define SAGE_HAS_MMA_E4M3_F16 1
#else
#define SAGE_HAS_MMA_E4M3_F16 0
#endif
#endif

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

// D = A * B + C, FP8 e4m3 x e4m3 -> FP32, 16x8x32 per warp. sm_89 and newer only (ptxas rejects it
// below); sm_89/sm_120 run it as QMMA, sm_90/sm_100 convert to FP16 and run HMMA (exact: every e4m3
// value is an FP16 value).
__device__ __forceinline__ void mma_m16n8k32_e4m3_f32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

#if SAGE_HAS_MMA_E4M3_F16
// D = A * B + C, FP8 e4m3 x e4m3 -> FP16 accumulators (two halves per register: row group / group + 8).
__device__ __forceinline__ void mma_m16n8k32_e4m3_f16(uint32_t (&d)[2], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f16.e4m3.e4m3.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%0,%1};\n"
      : "+r"(d[0]), "+r"(d[1])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// Four floats -> one register of four e4m3 (round to nearest even, as torch's float -> float8_e4m3fn;
// saturating at +-448, which only values past the e4m3 range would notice), `b0` in the lowest byte.
__device__ __forceinline__ uint32_t cvt_e4m3x4(float b0, float b1, float b2, float b3) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(b0, b1), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(b2, b3), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
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
