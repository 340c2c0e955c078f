// Device pieces every attention kernel shares (the mma.sync kernels of sage_attn_mma.cuh and the
// sm_90a kernel): ln 2, -inf as a float, and the packed pair of the output's element type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace sage {

constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Two output elements of type T, packed (round to nearest even from float).
template <typename T>
struct OutPair;
template <>
struct OutPair<__half> {
  using type = __half2;
  static __device__ __forceinline__ type make(float a, float b) { return __floats2half2_rn(a, b); }
};
template <>
struct OutPair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ type make(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

}  // namespace sage
