// Plain C++ interface shared by the mma.sync attention kernels (csrc/sm80: FP16 P·V, csrc/sm89: FP8
// P·V) and csrc/bindings.cpp: the argument block and the accumulation choices. No CUDA or torch
// headers (see sage_types.h).
#pragma once

#include <cstdint>

#include "sage_types.h"

namespace sage {

// How P·V is accumulated inside one key block; across blocks it is always FP32.
enum class PvAccum : int {
  kFp32 = 0,           // MMAs accumulate straight into the running FP32 output (the arithmetic of sage_ref)
  kFp16ThenFp32 = 1,   // FP16 accumulators per key block, then added into FP32 (2x MMA rate on sm86/89)
  kFp32ThenFp32 = 2,   // fresh FP32 accumulators per key block, then added into FP32: bounds the error of
                       // tensor cores whose FP8 accumulation keeps fewer than 23 mantissa bits (sm89)
};

// Keys per inner step of both kernels. It must equal K's quantization block, so one k_scale covers
// one step: 64 keys keep the INT32 score tile at 32 registers per thread next to a 64-register FP32
// output tile (d = 128), which is what lets 128-row CTAs run without spills.
constexpr int kMmaKeyBlock = 64;

// Two-level INT8 K (kKResidualMul, sage_types.h): the score 254 * (q . k1) + q . k2 is exact in INT32,
// since |q . k1| <= 127 * 127 * 128 = 2064512 and the sum stays below 255 * 2064512 = 526 M < 2^31.
static_assert(kKResidualMul * 127 * 127 * 128 + 127 * 127 * 128 < (int64_t{1} << 31),
              "two-level scores must fit INT32 at d_pad = 128");

// All tensors are [B, H, N, *] views with a unit last stride; strides are in elements.
struct MmaAttnArgs {
  const int8_t* q;            // [B, Hq, Nq, d_pad] INT8, per-token scale below
  Strides3 q_strides;
  const int8_t* k;            // [B, Hkv, Nk, d_pad] INT8 of K minus its mean, per 64-key-block scale
  Strides3 k_strides;
  const int8_t* k_residual;   // [B, Hkv, Nk, d_pad] second INT8 digit of K, or null for one level
  Strides3 k_residual_strides;
  // sm80: V [B, Hkv, Nk, head_dim] FP16. sm89: Vᵀ [B, Hkv, d_pad, n_pad] FP8 e4m3, keys permuted
  // within groups of 16 (csrc/fused/quant.h); its strides are (b, h, channel).
  const void* v;
  Strides3 v_strides;
  int n_pad;                  // sm89: key extent of Vᵀ (>= nk, a multiple of 16)
  const float* v_scale;       // sm89: [B, Hkv, head_dim] dequantization scale of V per channel
  Strides3 v_scale_strides;   // (b, h, channel)
  const float* q_scale;       // [B, Hq, Nq]: amax / 127 * sm_scale * log2(e)
  Strides3 q_scale_strides;   // (b, h, n); n is the token stride
  const float* k_scale;       // [B, Hkv, ceil(Nk / 64)]: amax / 127, or amax / (127 * 254) for two levels
  Strides3 k_scale_strides;   // (b, h, block)
  const float* corr;          // [B, Hq, Nq] LSE correction of smooth-K, added to lse; may be null
  Strides3 corr_strides;
  void* out;                  // [B, Hq, Nq, head_dim] of out_type
  Strides3 out_strides;
  HalfType out_type;
  float* lse;                 // [B, Hq, Nq] natural-log LSE; null when not wanted
  Strides3 lse_strides;
  int batch, heads_q, kv_group, nq, nk, head_dim, d_pad;
  bool causal;                // top-left aligned: query i sees keys j <= i
  PvAccum accum;
};

}  // namespace sage
