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

// NVFP4 quantization along D (same bits as sageattn3.reference). Needs sm_100a or sm_120a code in
// the module and a device of that family; returns cudaErrorNotSupported otherwise.
cudaError_t launch_quant_rows(const RowsQuantArgs& args, cudaStream_t stream);

// One 16x8x64 block-scaled FP4 MMA (a warp's mma.sync on sm_120a): out[16][8] = A (16x64) . B^T (8x64)
// with A, B as packed codes [rows][32] bytes and E4M3 scales [rows][4]. For the hardware smoke test.
cudaError_t launch_mma_smoke(const uint8_t* a_codes, const uint8_t* a_scales, const uint8_t* b_codes,
                             const uint8_t* b_scales, float* out, cudaStream_t stream);

// Which of the kernels above this module holds SASS for: a bit set per family (1: sm_100a, 2: sm_120a).
int compiled_families();

}  // namespace sage3
