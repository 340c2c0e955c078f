// NVFP4 quantization of Q/K rows along the head dim, same bits as sageattn3/reference.py.
// One CTA per (block of `block` rows, batch*head); 128 threads; thread t owns row t of the block
// for the elementwise work (d <= 128 floats are read twice from global memory rather than held).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "nvfp4.cuh"
#include "sage3_kernels.h"

namespace sage3 {
namespace {

constexpr int kThreads = 128;

template <typename T>
__device__ __forceinline__ float load_f32(const T* p) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(*p);
  } else {
    return __bfloat162float(*p);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) quant_rows_kernel(RowsQuantArgs a) {
#ifdef SAGE3_HAS_FP4_CVT
  __shared__ float mean_s[128];
  __shared__ float amax_s[kThreads / 32];
  const int blk = blockIdx.x, bh = blockIdx.y, nblk = gridDim.x;
  const int b = bh / a.h, h = bh % a.h;
  const T* base = static_cast<const T*>(a.x) + b * a.stride_b + h * a.stride_h;
  const int row0 = blk * a.block;
  const int rows = min(a.block, a.n - row0);

  // Mean to subtract (per channel), in shared memory.
  for (int c = threadIdx.x; c < a.d; c += kThreads) {
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
  for (int r = threadIdx.x; r < rows; r += kThreads)
    for (int c = 0; c < a.d; ++c) amax = fmaxf(amax, fabsf(load_f32(base + (row0 + r) * a.stride_n + c) - mean_s[c]));
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  if (threadIdx.x % 32 == 0) amax_s[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = fmaxf(fmaxf(amax_s[0], amax_s[1]), fmaxf(amax_s[2], amax_s[3]));
  const float g = __fdiv_rn(amax, kFp4E4m3Range);
  if (threadIdx.x == 0) a.block_scales[static_cast<int64_t>(bh) * nblk + blk] = g;

  // Groups of 16 along D: scale = e4m3(amax / (g * 6)), codes = e2m1(x * (1 / (scale * g))).
  for (int r = threadIdx.x; r < a.block; r += kThreads) {
    const int64_t out_row = static_cast<int64_t>(bh) * a.n_pad + row0 + r;
    for (int g0 = 0; g0 < a.d; g0 += kGroup) {
      float x[kGroup];
      float gmax = 0.f;
      for (int i = 0; i < kGroup; ++i) {
        x[i] = r < rows ? load_f32(base + (row0 + r) * a.stride_n + g0 + i) - mean_s[g0 + i] : 0.f;
        gmax = fmaxf(gmax, fabsf(x[i]));
      }
      const uint8_t sf = e4m3(div_or_zero(gmax, g * kE2m1Max));
      const float inv = div_or_zero(1.f, e4m3_to_float(sf) * g);
      a.scales[out_row * (a.d / kGroup) + g0 / kGroup] = sf;
      for (int i = 0; i < kGroup; i += 2)
        a.codes[out_row * (a.d / 2) + (g0 + i) / 2] = e2m1x2(x[i] * inv, x[i + 1] * inv);
    }
  }
#endif
}

}  // namespace

cudaError_t launch_quant_rows(const RowsQuantArgs& args, cudaStream_t stream) {
  if ((args.d != 64 && args.d != 128) || args.block <= 0 || args.n_pad % args.block) return cudaErrorInvalidValue;
  if (!(compiled_families() & 3)) return cudaErrorNotSupported;
  const dim3 grid(args.n_pad / args.block, args.b * args.h);
  if (args.type == InputType::kFloat16) {
    quant_rows_kernel<__half><<<grid, kThreads, 0, stream>>>(args);
  } else {
    quant_rows_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

}  // namespace sage3
