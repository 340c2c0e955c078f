// Plain C++ launchers of the sageattn3 CUDA kernels (no torch): pointers, strides, sizes, stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace sage3 {

enum class InputType : int { kFloat16 = 0, kBFloat16 = 1 };

// How rows are smoothed before quantization (as sageattn3/triton/quant.py's MODE_*).
enum class Smoothing : int {
  kNone = 0,        // Q without per-block mean
  kSubMean = 1,     // subtract the given [B, H, D] float32 mean (K)
  kBlockMean = 2,   // subtract the block's own mean and store it to [B, H, nblk, D] (Q)
};

struct RowsQuantArgs {
  const void* x;             // [B, H, N, D] with strides below (last dimension contiguous)
  InputType type;
  int64_t stride_b, stride_h, stride_n;
  int b, h, n, n_pad, d;     // n_pad: n rounded up to `block`; d: 64 or 128
  int block;                 // rows per float32 block scale (128)
  Smoothing smoothing;
  float* mean;               // in (kSubMean) or out (kBlockMean); unused otherwise
  uint8_t* codes;            // [B, H, n_pad, d / 2]
  uint8_t* scales;           // [B, H, n_pad, d / 16], E4M3 bytes
  float* block_scales;       // [B, H, n_pad / block]
};

struct VtQuantArgs {
  const void* x;             // V [B, H, N, D] with strides below (last dimension contiguous)
  InputType type;
  int64_t stride_b, stride_h, stride_n;
  int b, h, n, n_pad, d;     // n_pad: n rounded up to `block`
  int block;                 // tokens per float32 block scale (128)
  uint8_t* codes;            // V^T [B, H, d, n_pad / 2]
  uint8_t* scales;           // V^T [B, H, d, n_pad / 16], E4M3 bytes
  float* block_scales;       // [B, H, n_pad / block]
};

// NVFP4 quantization (same bits as sageattn3.reference): Q/K along D, V^T along tokens. Need a
// compiled family in the module and a device of that family; cudaErrorNotSupported otherwise.
cudaError_t launch_quant_rows(const RowsQuantArgs& args, cudaStream_t stream);
cudaError_t launch_quant_vt(const VtQuantArgs& args, cudaStream_t stream);

enum class MaskKind : int { kNone = 0, kBool = 1, kAdditive = 2 };

// The attention kernel's operands: the outputs of the quantization kernels (HND, padded to whole
// blocks of 128 rows / keys) and the smoothing correction.
struct AttnArgs {
  const uint8_t* q_codes;    // [B, Hq, nq_pad, d / 2]
  const uint8_t* q_scales;   // [B, Hq, nq_pad, d / 16]
  const float* q_gs;         // [B, Hq, nq_pad / 128]
  const uint8_t* k_codes;    // [B, Hkv, nk_pad, d / 2]
  const uint8_t* k_scales;   // [B, Hkv, nk_pad, d / 16]
  const float* k_gs;         // [B, Hkv, nk_pad / 128]
  const uint8_t* v_codes;    // V^T [B, Hkv, d, nk_pad / 2]
  const uint8_t* v_scales;   // V^T [B, Hkv, d, nk_pad / 16]
  const float* v_gs;         // [B, Hkv, nk_pad / 128]
  const float* corr;         // q_mean . (k - k_mean): [B, Hq, nq_pad / 128, nk], or null
  const void* mask;          // kBool: uint8 (0 = masked); kAdditive: float32; [B, Hq, nq, nk] by strides
  MaskKind mask_kind;
  int64_t mask_stride_b, mask_stride_h, mask_stride_m, mask_stride_n;  // elements (0: broadcast)
  void* out;                 // [B, Hq, nq, d] by strides (elements; the last dimension contiguous)
  InputType out_type;
  int64_t out_stride_b, out_stride_h, out_stride_n;
  float* lse;                // [B, Hq, nq] log-sum-exp (natural log, without the K-mean term), or null
  int b, hq, hkv, nq, nk, nq_pad, nk_pad, d;
  float qk_scale;            // sm_scale * log2(e)
  bool causal;               // SDPA's top-left causal mask
};

// NVFP4 attention. sm_120a: block-scaled FP4 mma.sync; sm_100a and sm_90a: the FP4 tiles decoded
// exactly to fp16 in registers and fp16 mma.sync. Returns cudaErrorNotSupported when the module has
// no code for this device's family.
cudaError_t launch_attention(const AttnArgs& args, cudaStream_t stream);

// One 16x8x64 block-scaled FP4 MMA (a warp's mma.sync on sm_120a): out[16][8] = A (16x64) . B^T (8x64)
// with A, B as packed codes [rows][32] bytes and E4M3 scales [rows][4]. For the hardware smoke test.
cudaError_t launch_mma_smoke(const uint8_t* a_codes, const uint8_t* a_scales, const uint8_t* b_codes,
                             const uint8_t* b_scales, float* out, cudaStream_t stream);

// Which families this module holds SASS for: a bit per family (1: sm_100a, 2: sm_120a, 4: sm_90a).
int compiled_families();

// The family bit (as above) this device runs, or 0 when the module has no code for it.
int device_family();

}  // namespace sage3
