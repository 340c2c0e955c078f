// Launcher of the sm80-family attention kernel (csrc/sm80/attn_int8_f16.cu): INT8 Q·Kᵀ with
// mma.sync m16n8k32 (one or two INT8 digits of K), FP16 P·V with mma.sync m16n8k16, online softmax
// in the log2 domain. Runs on every arch >= 8.0 (sm80/86/89/90...); plain C++ interface, no torch.
#pragma once

#include <cuda_runtime.h>

#include "sage_attn_mma.h"

namespace sage {

// Keys per inner step. It must equal K's quantization block, so one k_scale covers one step.
constexpr int kSm80KeyBlock = kMmaKeyBlock;

// Fields used: all but n_pad, v_scale (V is FP16 [B, Hkv, Nk, head_dim], scale 1). k_residual, when
// not null, is K's second INT8 digit (quantize_per_block_ref(residual=True)) and k_scale then holds
// the two-level scale amax * K_RESIDUAL_SCALE. accum: kFp32 or kFp16ThenFp32.
using AttnSm80Args = MmaAttnArgs;

// Checks nothing the caller already checked (bindings.cpp); returns cudaErrorInvalidValue for a
// d_pad other than 64 or 128, a head_dim that is not a multiple of 8 or exceeds d_pad, or an
// accumulation this kernel is not built with.
cudaError_t launch_qk_int8_sv_f16_attn_sm80(const AttnSm80Args& args, cudaStream_t stream);

}  // namespace sage
