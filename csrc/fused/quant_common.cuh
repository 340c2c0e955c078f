// Device helpers of the fused quantization kernels (quant.cu, quant_qkv.cu). Both files quantize
// with these, so their outputs agree bit for bit: IEEE division for limit / amax (the build uses
// --use_fast_math, so the intrinsics are spelled out), one rounded multiply, then round-half-even
// to INT8; FP8 through the e4m3 round-to-nearest-even conversion with saturation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "sage_types.h"

namespace sage {
namespace quant {

constexpr int kWarp = 32;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

// Max of magnitudes (values >= 0, or NaN with a clear sign bit, as fabsf gives) that keeps NaN: such
// floats order like their bit patterns, and a NaN's pattern is above +Inf's. fmaxf would drop a NaN,
// turning a NaN input into a finite output where SDPA's is NaN; with it the scale becomes NaN and the
// NaN reaches the scores it would reach in SDPA.
__device__ __forceinline__ float amax2(float a, float b) {
  return __uint_as_float(max(__float_as_uint(a), __float_as_uint(b)));
}

__device__ __forceinline__ float warp_amax(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v = amax2(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float inv_scale(float limit, float amax) {
  return amax > 0.f ? __fdiv_rn(limit, amax) : 0.f;
}

__device__ __forceinline__ int8_t to_int8(float x, float inv) {
  const int r = __float2int_rn(__fmul_rn(x, inv));
  return static_cast<int8_t>(max(-127, min(127, r)));
}

constexpr int kVec = 8;  // channels a thread loads at once: 8 halves, 16 bytes

// Element j (0..7) of eight packed halves, as to_float converts it.
template <typename T>
__device__ __forceinline__ float element(uint4 raw, int j);
template <>
__device__ __forceinline__ float element<__half>(uint4 raw, int j) {
  const uint32_t w = j < 2 ? raw.x : j < 4 ? raw.y : j < 6 ? raw.z : raw.w;
  return to_float(__ushort_as_half(static_cast<unsigned short>(j % 2 ? w >> 16 : w & 0xffffu)));
}
// A bfloat16 is the high half of the float32 of the same value: masked or shifted in place (the
// compiler does not see this through to_float, and keeps a shifted copy of every word).
template <>
__device__ __forceinline__ float element<__nv_bfloat16>(uint4 raw, int j) {
  const uint32_t w = j < 2 ? raw.x : j < 4 ? raw.y : j < 6 ? raw.z : raw.w;
  return __uint_as_float(j % 2 ? w & 0xffff0000u : w << 16);
}

template <typename T>
__device__ __forceinline__ void unpack8(uint4 raw, float (&x)[kVec]) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) x[j] = element<T>(raw, j);
}

// The value of a half (float16 or bfloat16) given by its 16 bits (the low ones of h), as float.
template <typename T>
__device__ __forceinline__ float half_bits_to_float(uint32_t h) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __uint_as_float(h << 16);
  } else {
    return to_float(__ushort_as_half(static_cast<unsigned short>(h)));
  }
}

// Magnitudes of two packed halves (sign bits cleared): as 16-bit integers they order as the values'
// magnitudes do, NaN above Inf, so __vmaxu2 of them is amax2 of their fabsf, bit for bit once
// converted (half_bits_to_float).
constexpr uint32_t kHalfMagnitudes = 0x7fff7fffu;

// Max |x| over eight packed halves, as float: the max of their 16-bit magnitudes, converted once. The
// same value, NaN bits included, as amax2 over fabsf(element<T>(raw, j)), in 4 masks and 2 packed
// maxima instead of 8 conversions, 8 abs and 8 maxima.
template <typename T>
__device__ __forceinline__ float amax8(uint4 raw) {
  const uint32_t m2 = __vmaxu2(__vmaxu2(raw.x & kHalfMagnitudes, raw.y & kHalfMagnitudes),
                               __vmaxu2(raw.z & kHalfMagnitudes, raw.w & kHalfMagnitudes));
  return half_bits_to_float<T>(max(m2 & 0xffffu, m2 >> 16));
}

// Elementwise max and min of two pairs of packed halves (T's 16-bit type, element 0 in the low half),
// NaN if either element is NaN. Exact: no rounding. Where a float result fl(f(x)) rises with x (a
// rounded subtraction x - m does), the largest |fl(f(x))| over a set of x is that of its max or its
// min, so a block's max |x - m| needs only these and two subtractions per channel.
template <typename T>
using Half2 = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, __nv_bfloat162, __half2>;
template <typename T>
__device__ __forceinline__ uint32_t max2_nan(uint32_t a, uint32_t b) {
  const Half2<T> r = __hmax2_nan(*reinterpret_cast<const Half2<T>*>(&a), *reinterpret_cast<const Half2<T>*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}
template <typename T>
__device__ __forceinline__ uint32_t min2_nan(uint32_t a, uint32_t b) {
  const Half2<T> r = __hmin2_nan(*reinterpret_cast<const Half2<T>*>(&a), *reinterpret_cast<const Half2<T>*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// to_int8's value in one conversion (F2I.S8): round to nearest even, saturated to [-128, 127]. The two
// differ only below -127.5, which x * inv never reaches when |x| <= amax and inv = inv_scale(127,
// amax), as for every caller here (|x * inv| <= 127 (1 + 2^-23)^2); NaN gives 0 in both.
__device__ __forceinline__ uint32_t to_int8_sat(float x, float inv) {
  uint32_t r;
  asm("cvt.rni.sat.s8.f32 %0, %1;" : "=r"(r) : "f"(__fmul_rn(x, inv)));
  return r;
}

// Eight values x * inv as INT8 (to_int8_sat), packed in order (element 0 in the low byte of .x).
__device__ __forceinline__ uint2 int8x8(const float (&x)[kVec], float inv) {
  uint32_t w[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t lo = __byte_perm(to_int8_sat(x[4 * i], inv), to_int8_sat(x[4 * i + 1], inv), 0x0040);
    const uint32_t hi = __byte_perm(to_int8_sat(x[4 * i + 2], inv), to_int8_sat(x[4 * i + 3], inv), 0x0040);
    w[i] = __byte_perm(lo, hi, 0x5410);
  }
  return make_uint2(w[0], w[1]);
}

// One term of the smooth-K correction q . k_mean: a fused multiply-add, columns in order.
__device__ __forceinline__ float dot_step(float acc, float x, float km) { return fmaf(x, km, acc); }

__device__ __forceinline__ uint8_t to_fp8(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// Two to_fp8 in one conversion (the same rounding per element): lo in the low byte.
__device__ __forceinline__ uint16_t to_fp8x2(float lo, float hi) {
  return static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}

// Token held by output slot `slot` when the keys are permuted for the sm_90a kernel (quant.h):
// slot 4q + 2 * hi + lo of a group of 16 holds token 8 * hi + 2q + lo.
__device__ __forceinline__ int permuted_token(int slot) {
  return (slot & ~15) | (((slot >> 1) & 1) << 3) | (((slot >> 2) & 3) << 1) | (slot & 1);
}

}  // namespace quant
}  // namespace sage
