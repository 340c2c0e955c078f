// Launcher of the sm80-family attention kernel (csrc/sm80/attn_int8_f16.cu): INT8 Q·Kᵀ with
// mma.sync m16n8k32, FP16 P·V with mma.sync m16n8k16, online softmax in the log2 domain.
// Runs on every arch >= 8.0 (sm80/86/89/90...); plain C++ interface, no torch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "sage_types.h"

namespace sage {

// How P·V is accumulated inside one key block (64 keys); across blocks it is always FP32.
enum class PvAccum : int {
  kFp32 = 0,           // m16n8k16 with FP32 accumulators: the arithmetic of sage_ref
  kFp16ThenFp32 = 1,   // FP16 accumulators per 64-key block, added into FP32 (2x MMA rate on sm86/89)
};

// Keys per inner step. It must equal K's quantization block, so one k_scale covers one step.
constexpr int kSm80KeyBlock = 64;

// All tensors are [B, H, N, *] views with a unit last stride; strides are in elements.
struct AttnSm80Args {
  const int8_t* q;        // [B, Hq, Nq, d_pad] INT8, per-token scale below
  Strides3 q_strides;
  const int8_t* k;        // [B, Hkv, Nk, d_pad] INT8 of K minus its mean, per 64-key-block scale
  Strides3 k_strides;
  const void* v;          // [B, Hkv, Nk, head_dim] FP16
  Strides3 v_strides;
  const float* q_scale;   // [B, Hq, Nq]: amax / 127 * sm_scale * log2(e)
  Strides3 q_scale_strides;  // (b, h, n); n is the token stride
  const float* k_scale;   // [B, Hkv, ceil(Nk / 64)]
  Strides3 k_scale_strides;  // (b, h, block)
  const float* corr;      // [B, Hq, Nq] LSE correction of smooth-K, added to lse; may be null
  Strides3 corr_strides;
  void* out;              // [B, Hq, Nq, head_dim] of out_type
  Strides3 out_strides;
  HalfType out_type;
  float* lse;             // [B, Hq, Nq] natural-log LSE; null when not wanted
  Strides3 lse_strides;
  int batch, heads_q, kv_group, nq, nk, head_dim, d_pad;
  bool causal;            // top-left aligned: query i sees keys j <= i
  PvAccum accum;
};

// Checks nothing the caller already checked (bindings.cpp); returns cudaErrorInvalidValue for a
// d_pad other than 64 or 128 or a head_dim that is not a multiple of 8 or exceeds d_pad.
cudaError_t launch_qk_int8_sv_f16_attn_sm80(const AttnSm80Args& args, cudaStream_t stream);

}  // namespace sage
