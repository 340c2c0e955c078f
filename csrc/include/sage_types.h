// Plain C++ types shared by the kernel launchers and csrc/bindings.cpp. No CUDA or torch headers:
// the launch functions take pointers, strides, sizes and a stream, so kernel files compile without
// torch (one .cu with torch/extension.h took ~110 s on 2 cores; without it, ~3 s).
#pragma once

#include <cstdint>

namespace sage {

// Element type of a half-precision input tensor.
enum class HalfType : int { kFloat16 = 0, kBFloat16 = 1 };

// Strides, in elements, of a [B, H, N, D] view whose last dimension is contiguous.
struct Strides3 {
  int64_t b, h, n;
};

constexpr float kInt8Max = 127.0f;
constexpr float kFp8E4M3Max = 448.0f;

// Two-level INT8 K (sageattention.quant.K_RESIDUAL_MUL): K ~ scale * (k1 + k2 / 254), both digits
// INT8; the attention kernels form the exact score 254 * (q . k1) + q . k2 in INT32. The scale is
// amax * kKResidualScale: one float32 multiply by the float32 rounding of 1 / (127 * 254), as the
// Python side computes it, so every implementation gets the same bits.
constexpr int kKResidualMul = 254;
constexpr float kKResidualScale = static_cast<float>(1.0 / (127.0 * 254.0));

}  // namespace sage
