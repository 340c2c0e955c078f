// NVFP4 quantization kernels, same bits as sageattn3/reference.py:
//   quant_rows_kernel: Q/K rows along the head dim (one float32 block scale per `block` rows);
//   quant_vt_kernel:   V transposed, along tokens (one float32 block scale per `block` tokens).
// One CTA per (block, batch*head), 128 threads. The E2M1 rounding is the cvt instruction on sm_100a
// and sm_120a and the same rounding in software elsewhere (sm_90a, so that these kernels run and are
// checked on Hopper too).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "nvfp4.cuh"
#include "sage3_kernels.h"

namespace sage3 {
namespace {

constexpr int kQuantThreads = 128;

template <typename T>
__device__ __forceinline__ float load_f32(const T* p) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(*p);
  } else {
    return __bfloat162float(*p);
  }
}

// Largest value of `v` over the CTA (every thread gets it). `scratch`: kQuantThreads / 32 floats.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  return fmaxf(fmaxf(scratch[0], scratch[1]), fmaxf(scratch[2], scratch[3]));
}

// One group of 16 values with block scale g -> (E4M3 scale byte, 8 bytes of codes in two words).
__device__ __forceinline__ uint32_t quantize_group(const float (&x)[kGroup], float g, uint32_t (&codes)[2]) {
  float gmax = 0.f;
#pragma unroll
  for (int i = 0; i < kGroup; ++i) gmax = fmaxf(gmax, fabsf(x[i]));
  // scale = e4m3(amax / (g * 6)); inv = 1 / (scale * g); codes = e2m1(x * inv)
  const uint32_t sf = e4m3(div_or_zero(gmax, __fmul_rn(g, kE2m1Max)));
  const float inv = div_or_zero(1.f, __fmul_rn(e4m3_to_float(sf), g));
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    uint32_t word = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      word |= e2m1x2(__fmul_rn(x[8 * w + 2 * i], inv), __fmul_rn(x[8 * w + 2 * i + 1], inv)) << (8 * i);
    codes[w] = word;
  }
  return sf;
}

template <typename T>
__global__ void __launch_bounds__(kQuantThreads) quant_rows_kernel(RowsQuantArgs a) {
  __shared__ float mean_s[128];
  __shared__ float amax_s[kQuantThreads / 32];
  const int blk = blockIdx.x, bh = blockIdx.y, nblk = gridDim.x;
  const int b = bh / a.h, h = bh % a.h;
  const T* base = static_cast<const T*>(a.x) + b * a.stride_b + h * a.stride_h;
  const int row0 = blk * a.block;
  const int rows = min(a.block, a.n - row0);

  // Mean to subtract (per channel), in shared memory.
  for (int c = threadIdx.x; c < a.d; c += kQuantThreads) {
    float m = 0.f;
    if (a.smoothing == Smoothing::kSubMean) {
      m = a.mean[static_cast<int64_t>(bh) * a.d + c];
    } else if (a.smoothing == Smoothing::kBlockMean) {
      float sum = 0.f;
      for (int r = 0; r < rows; ++r) sum += load_f32(base + (row0 + r) * a.stride_n + c);
      m = __fdiv_rn(sum, static_cast<float>(rows));
      a.mean[(static_cast<int64_t>(bh) * nblk + blk) * a.d + c] = m;
    }
    mean_s[c] = m;
  }
  __syncthreads();

  // Block amax -> float32 block scale.
  float amax = 0.f;
  for (int r = threadIdx.x; r < rows; r += kQuantThreads)
    for (int c = 0; c < a.d; ++c)
      amax = fmaxf(amax, fabsf(__fsub_rn(load_f32(base + (row0 + r) * a.stride_n + c), mean_s[c])));
  amax = block_max(amax, amax_s);
  const float g = __fdiv_rn(amax, kFp4E4m3Range);
  if (threadIdx.x == 0) a.block_scales[static_cast<int64_t>(bh) * nblk + blk] = g;

  // Groups of 16 along D; rows past n (padding) get zero codes and scales.
  for (int r = threadIdx.x; r < a.block; r += kQuantThreads) {
    const int64_t out_row = static_cast<int64_t>(bh) * a.n_pad + row0 + r;
    for (int g0 = 0; g0 < a.d; g0 += kGroup) {
      float x[kGroup];
#pragma unroll
      for (int i = 0; i < kGroup; ++i)
        x[i] = r < rows ? __fsub_rn(load_f32(base + (row0 + r) * a.stride_n + g0 + i), mean_s[g0 + i]) : 0.f;
      uint32_t codes[2];
      a.scales[out_row * (a.d / kGroup) + g0 / kGroup] = static_cast<uint8_t>(quantize_group(x, g, codes));
      uint32_t* dst = reinterpret_cast<uint32_t*>(a.codes + out_row * (a.d / 2) + g0 / 2);  // 8-byte aligned
      dst[0] = codes[0];
      dst[1] = codes[1];
    }
  }
}

// V [B, H, N, D] -> V^T codes [B, H, D, n_pad / 2] and scales [B, H, D, n_pad / 16]: thread c owns
// channel c of the block's tokens (reads are coalesced across channels).
template <typename T>
__global__ void __launch_bounds__(kQuantThreads) quant_vt_kernel(VtQuantArgs a) {
  __shared__ float amax_s[kQuantThreads / 32];
  const int blk = blockIdx.x, bh = blockIdx.y, nblk = gridDim.x;
  const int b = bh / a.h, h = bh % a.h;
  const T* base = static_cast<const T*>(a.x) + b * a.stride_b + h * a.stride_h;
  const int tok0 = blk * a.block;
  const int toks = min(a.block, a.n - tok0);
  const int c = threadIdx.x;

  float amax = 0.f;
  if (c < a.d)
    for (int r = 0; r < toks; ++r) amax = fmaxf(amax, fabsf(load_f32(base + (tok0 + r) * a.stride_n + c)));
  amax = block_max(amax, amax_s);
  const float g = __fdiv_rn(amax, kFp4E4m3Range);
  if (threadIdx.x == 0) a.block_scales[static_cast<int64_t>(bh) * nblk + blk] = g;
  if (c >= a.d) return;

  const int64_t chan = static_cast<int64_t>(bh) * a.d + c;
  for (int r0 = 0; r0 < a.block; r0 += kGroup) {
    float x[kGroup];
#pragma unroll
    for (int i = 0; i < kGroup; ++i) x[i] = r0 + i < toks ? load_f32(base + (tok0 + r0 + i) * a.stride_n + c) : 0.f;
    uint32_t codes[2];
    a.scales[chan * (a.n_pad / kGroup) + (tok0 + r0) / kGroup] = static_cast<uint8_t>(quantize_group(x, g, codes));
    uint32_t* dst = reinterpret_cast<uint32_t*>(a.codes + chan * (a.n_pad / 2) + (tok0 + r0) / 2);
    dst[0] = codes[0];
    dst[1] = codes[1];
  }
}

}  // namespace

#ifndef SAGE3_HOST_EMULATION
cudaError_t launch_quant_rows(const RowsQuantArgs& args, cudaStream_t stream) {
  if ((args.d != 64 && args.d != 128) || args.block <= 0 || args.block > 1024 || args.n_pad % args.block)
    return cudaErrorInvalidValue;
  if (!compiled_families()) return cudaErrorNotSupported;
  const dim3 grid(args.n_pad / args.block, args.b * args.h);
  if (args.type == InputType::kFloat16) {
    quant_rows_kernel<__half><<<grid, kQuantThreads, 0, stream>>>(args);
  } else {
    quant_rows_kernel<__nv_bfloat16><<<grid, kQuantThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

cudaError_t launch_quant_vt(const VtQuantArgs& args, cudaStream_t stream) {
  if ((args.d != 64 && args.d != 128) || args.block <= 0 || args.block % kGroup || args.n_pad % args.block)
    return cudaErrorInvalidValue;
  if (!compiled_families()) return cudaErrorNotSupported;
  const dim3 grid(args.n_pad / args.block, args.b * args.h);
  if (args.type == InputType::kFloat16) {
    quant_vt_kernel<__half><<<grid, kQuantThreads, 0, stream>>>(args);
  } else {
    quant_vt_kernel<__nv_bfloat16><<<grid, kQuantThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

#endif

}  // namespace sage3
