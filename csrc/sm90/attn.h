// Launcher of the Hopper attention kernel (csrc/sm90/attn_int8_fp8.cu): INT8 Q·Kᵀ with
// wgmma m64n128k32 s8, FP8 e4m3 P·V with wgmma m64nDk32, TMA loads, warp specialization.
// sm_90a only (wgmma, setmaxnreg); plain C++ interface, no torch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "sage_types.h"

namespace sage {

// Keys per inner step. It must equal K's quantization block, so one k_scale covers one step, and
// the P·V product of one step is promoted into the FP32 output once (Hopper's FP8 MMA adds into an
// accumulator of about 22 mantissa bits; a fresh accumulator per 128 keys keeps that error small).
constexpr int kSm90KeyBlock = 128;
// Vᵀ keys are permuted within groups of this many keys (see quant_v_fp8's permute_keys); n_pad
// of Vᵀ must be a multiple of it (TMA also needs 16-byte row strides).
constexpr int kSm90KeyPermuteGroup = 16;

// Query/key tensors are [B, H, N, d_pad] with a unit last stride; strides are in elements (= bytes
// for the 8-bit tensors). TMA needs the base and the three outer strides in bytes to be multiples
// of 16, which bindings.cpp checks; the output is written by TMA too (its base and strides in bytes
// multiples of 16: the op allocates it so), else the launch returns cudaErrorInvalidValue.
struct AttnSm90Args {
  const int8_t* q;           // [B, Hq, Nq, d_pad] INT8, one scale per token
  Strides3 q_strides;
  const int8_t* k;           // [B, Hkv, Nk, d_pad] INT8 of K minus its mean, one scale per 128 keys
  Strides3 k_strides;
  const uint8_t* vt;         // [B, Hkv, d_pad, n_pad] FP8 e4m3 of Vᵀ, keys permuted (quant_v_fp8)
  Strides3 vt_strides;       // (b, h, channel); keys are contiguous
  int n_pad;                 // Vᵀ's key extent: >= Nk, a multiple of 16, zeros past Nk
  const float* q_scale;      // [B, Hq, Nq]: amax / 127 * sm_scale * log2(e)
  Strides3 q_scale_strides;  // (b, h, n)
  const float* k_scale;      // [B, Hkv, ceil(Nk / 128)]
  Strides3 k_scale_strides;  // (b, h, block)
  const float* v_scale;      // [B, Hkv, head_dim]: v_amax / 448 per channel, unit channel stride
  Strides3 v_scale_strides;  // (b, h, channel)
  const float* corr;         // [B, Hq, Nq] LSE correction of smooth-K, added to lse; may be null
  Strides3 corr_strides;
  void* out;                 // [B, Hq, Nq, head_dim] of out_type, unit last stride, 16-byte aligned
  Strides3 out_strides;
  HalfType out_type;
  float* lse;                // [B, Hq, Nq] natural-log LSE; null when not wanted
  Strides3 lse_strides;
  int batch, heads_q, heads_kv, nq, nk, head_dim, d_pad;
  bool causal;               // top-left aligned: query i sees keys j <= i
  int* tile_counter;         // zero at launch, for this launch alone: the kernel's CTAs draw tiles from it
};

// Checks nothing the caller already checked (bindings.cpp). Returns cudaErrorInvalidValue for a
// d_pad other than 64 or 128, a head_dim that is not a multiple of 8 or exceeds d_pad, no
// tile_counter, 2^31 tiles (64 x consumer warpgroups query rows of one head each) or more, or
// tensors the TMA unit cannot describe; cudaErrorNoKernelImageForDevice on a GPU other than sm_90;
// cudaErrorNotSupported when the driver has no cuTensorMapEncodeTiled.
cudaError_t launch_qk_int8_sv_f8_attn_sm90(const AttnSm90Args& args, cudaStream_t stream);

}  // namespace sage
