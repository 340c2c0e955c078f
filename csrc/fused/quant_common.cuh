// Device helpers of the fused quantization kernels (quant.cu, quant_qkv.cu). Both files quantize
// with these, so their outputs agree bit for bit: IEEE division for limit / amax (the build uses
// --use_fast_math, so the intrinsics are spelled out), one rounded multiply, then round-half-even
// to INT8; FP8 through the e4m3 round-to-nearest-even conversion with saturation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

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
