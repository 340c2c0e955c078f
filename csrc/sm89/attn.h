// Launcher of the sm89-family attention kernel (csrc/sm89/attn_int8_fp8.cu): INT8 Q·Kᵀ with
// mma.sync m16n8k32 s8, FP8 e4m3 P·V with mma.sync m16n8k32 e4m3, online softmax in the log2 domain.
// Needs sm_89 or newer (the e4m3 MMA); built for sm_89, sm_90a, sm_100a and sm_120a (build-matrix.yaml).
// Plain C++ interface, no torch.
#pragma once

#include <cuda_runtime.h>

#include "sage_attn_mma.h"

namespace sage {

// Keys per inner step and K's quantization block (one k_scale per step).
constexpr int kSm89KeyBlock = kMmaKeyBlock;
// Vᵀ's key dimension is padded to a multiple of this: the key permutation group (csrc/fused/quant.h).
constexpr int kSm89KeyPermuteGroup = 16;
// "fp32+fp16" accumulates one 64-key block of P·V in FP16: P * 448 <= 448, so V must be quantized to
// at most 448 / 256 = 1.75 (v_amax * 256 passed to quant_v_fp8, v_scale = v_amax * 256 / 448) for a
// block sum to stay below 64 * 448 * 1.75 = 50176 < 65504. A power of two keeps the e4m3 digits of V
// those of the 448 scale, down to |v| >= 4 / 448 of the channel's amax (e4m3's normal range).
constexpr float kSm89Fp16AccumVHeadroom = 256.0f;

// Fields used: all but k_residual (K has one INT8 level here; FP8 P·V is limited by its own rounding).
// v: Vᵀ FP8 e4m3 [B, Hkv, d_pad, n_pad], keys permuted (quant_v_fp8(..., permute_keys=True)), strides
// (b, h, channel); n_pad >= nk, a multiple of 16. v_scale: [B, Hkv, head_dim], the output factor of
// each channel (v_amax / 448, times kSm89Fp16AccumVHeadroom for kFp16ThenFp32). accum: kFp32,
// kFp32ThenFp32 or kFp16ThenFp32 (when built with it, see sm89_fp16_accum_built).
using AttnSm89Args = MmaAttnArgs;

// Whether the kFp16ThenFp32 instances exist: the FP16-accumulating e4m3 MMA needs CUDA >= 12.8.
bool sm89_fp16_accum_built();

// Checks nothing the caller already checked (bindings.cpp); returns cudaErrorInvalidValue for a
// d_pad other than 64 or 128, a head_dim that is not a multiple of 8 or exceeds d_pad, a k_residual,
// or an accumulation this build does not have (cudaErrorNotSupported for kFp16ThenFp32 below CUDA 12.8).
cudaError_t launch_qk_int8_sv_f8_attn_sm89(const AttnSm89Args& args, cudaStream_t stream);

}  // namespace sage
