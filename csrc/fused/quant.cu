// Fused quantization kernels: INT8 Q per token (+ the smooth-K LSE correction), INT8 K per block
// with smooth-K, FP8 V per channel written transposed. One pass over each input.
//
// Rounding matches sageattention.reference bit for bit through the helpers of quant_common.cuh
// (shared with quant_qkv.cu): IEEE division for 127 / amax, one rounded multiply, then
// round-half-even to INT8; FP8 through the e4m3 round-to-nearest-even conversion with saturation.

#include "quant.h"
#include "quant_common.cuh"

namespace sage {
namespace {

using namespace quant;

constexpr int kVTokens = 64;  // tokens per V tile: 64 fp8 bytes per output row

// One warp per token; lane l holds columns [l * E, l * E + E), E = d_pad / 32.
template <typename T, int E>
__global__ void quant_q_kernel(const T* __restrict__ q, Strides3 qs, int heads, int n, int head_dim,
                               float scale_mul, int8_t* __restrict__ q_int8, float* __restrict__ q_scale,
                               const float* __restrict__ k_mean, int kv_group, float sm_scale,
                               float* __restrict__ corr) {
  const int lane = threadIdx.x % kWarp;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarp;
  const int h = blockIdx.y, b = blockIdx.z;
  if (token >= n) return;
  const T* row = q + b * qs.b + h * qs.h + token * qs.n;
  float x[E];
  float amax = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int d = lane * E + e;
    x[e] = d < head_dim ? to_float(row[d]) : 0.f;
    amax = amax2(amax, fabsf(x[e]));
  }
  amax = warp_amax(amax);
  const float inv = inv_scale(kInt8Max, amax);
  const int64_t out_row = (static_cast<int64_t>(b) * heads + h) * n + token;
  int8_t packed[E];
#pragma unroll
  for (int e = 0; e < E; ++e) packed[e] = to_int8(x[e], inv);
  int8_t* dst = q_int8 + out_row * (E * kWarp) + lane * E;
#pragma unroll
  for (int e = 0; e < E; ++e) dst[e] = packed[e];
  if (lane == 0) q_scale[out_row] = amax * scale_mul;
  if (corr != nullptr) {
    const float* km = k_mean + (static_cast<int64_t>(b) * (heads / kv_group) + h / kv_group) * head_dim;
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int d = lane * E + e;
      if (d < head_dim) dot = dot_step(dot, x[e], km[d]);
    }
    dot = warp_sum(dot);
    if (lane == 0) corr[out_row] = dot * sm_scale;
  }
}

// One CTA per block of `block` tokens; warp w takes tokens w, w + 8, ... k_residual non-null: two-level
// K (quant.h).
template <typename T, int E>
__global__ void quant_k_kernel(const T* __restrict__ k, Strides3 ks, int heads, int n, int head_dim, int block,
                               const float* __restrict__ k_mean, int8_t* __restrict__ k_int8,
                               int8_t* __restrict__ k_residual, float* __restrict__ k_scale) {
  __shared__ float block_amax[kWarps];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int h = blockIdx.y, b = blockIdx.z;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * block;
  const int64_t last = min(first + block, static_cast<int64_t>(n));
  const T* base = k + b * ks.b + h * ks.h;
  float km[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int d = lane * E + e;
    km[e] = (k_mean != nullptr && d < head_dim) ? k_mean[(static_cast<int64_t>(b) * heads + h) * head_dim + d] : 0.f;
  }
  auto load = [&](int64_t token, int e) {
    const int d = lane * E + e;
    return d < head_dim ? __fsub_rn(to_float(base[token * ks.n + d]), km[e]) : 0.f;
  };
  float amax = 0.f;
  for (int64_t t = first + warp; t < last; t += kWarps) {
#pragma unroll
    for (int e = 0; e < E; ++e) amax = amax2(amax, fabsf(load(t, e)));
  }
  amax = warp_amax(amax);
  if (lane == 0) block_amax[warp] = amax;
  __syncthreads();
  amax = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) amax = amax2(amax, block_amax[w]);
  const float inv = inv_scale(kInt8Max, amax);
  const int64_t row0 = (static_cast<int64_t>(b) * heads + h) * n;
  for (int64_t t = first + warp; t < last; t += kWarps) {
    const int64_t off = (row0 + t) * (E * kWarp) + lane * E;
    if (k_residual == nullptr) {
#pragma unroll
      for (int e = 0; e < E; ++e) k_int8[off + e] = to_int8(load(t, e), inv);
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const float x = load(t, e);
        // |x * inv| <= 127 (1 + 2^-23): rint stays within INT8, and the residual within +-0.5, so
        // 254 * residual rounds to at most 127 in magnitude. The clamps of to_int8 never act.
        const float k1 = rintf(__fmul_rn(x, inv));
        const float rest = fmaf(x, inv, -k1);  // the exact x * inv - k1, rounded once
        k_int8[off + e] = static_cast<int8_t>(k1);
        k_residual[off + e] = to_int8(rest, static_cast<float>(kKResidualMul));
      }
    }
  }
  if (threadIdx.x == 0) {
    const int nblk = (n + block - 1) / block;
    const float scale = k_residual == nullptr ? __fmul_rn(amax, 1.0f / kInt8Max) : __fmul_rn(amax, kKResidualScale);
    k_scale[(static_cast<int64_t>(b) * heads + h) * nblk + blockIdx.x] = scale;
  }
}

// One CTA per 64 tokens (a multiple of the 16-token permutation group): quantize into shared memory
// as [d][token], then write 64-byte rows, tokens past N (up to n_pad) as zeros.
template <typename T, int D_PAD>
__global__ void quant_v_kernel(const T* __restrict__ v, Strides3 vs, int heads, int n, int head_dim, int n_pad,
                               const float* __restrict__ v_amax, uint8_t* __restrict__ vt, bool permute_keys) {
  __shared__ uint8_t tile[D_PAD][kVTokens + 4];  // +4 bytes: rows start in different banks
  const int h = blockIdx.y, b = blockIdx.z;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kVTokens;
  const T* base = v + b * vs.b + h * vs.h;
  const float* amax = v_amax + (static_cast<int64_t>(b) * heads + h) * head_dim;
  for (int i = threadIdx.x; i < kVTokens * D_PAD; i += kThreads) {
    const int t = i / D_PAD, d = i % D_PAD;  // consecutive threads read consecutive channels
    float x = 0.f;
    if (d < head_dim && first + t < n) x = __fmul_rn(to_float(base[(first + t) * vs.n + d]), inv_scale(kFp8E4M3Max, amax[d]));
    tile[d][t] = to_fp8(x);
  }
  __syncthreads();
  uint8_t* out = vt + (static_cast<int64_t>(b) * heads + h) * D_PAD * n_pad;
  for (int i = threadIdx.x; i < kVTokens * D_PAD; i += kThreads) {
    const int d = i / kVTokens, slot = i % kVTokens;
    if (first + slot < n_pad) {
      out[static_cast<int64_t>(d) * n_pad + first + slot] = tile[d][permute_keys ? permuted_token(slot) : slot];
    }
  }
}

template <template <typename, int> class Launch, typename... Args>
cudaError_t dispatch(HalfType type, int d_pad, Args&&... args) {
  // d_pad is 32, 64 or 128: one lane per 1, 2 or 4 columns.
  switch (d_pad) {
    case 32:
      return type == HalfType::kFloat16 ? Launch<__half, 1>::run(args...) : Launch<__nv_bfloat16, 1>::run(args...);
    case 64:
      return type == HalfType::kFloat16 ? Launch<__half, 2>::run(args...) : Launch<__nv_bfloat16, 2>::run(args...);
    case 128:
      return type == HalfType::kFloat16 ? Launch<__half, 4>::run(args...) : Launch<__nv_bfloat16, 4>::run(args...);
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename T, int E>
struct QLaunch {
  static cudaError_t run(const void* q, Strides3 qs, int batch, int heads, int n, int head_dim, float scale_mul,
                         int8_t* q_int8, float* q_scale, const float* k_mean, int kv_group, float sm_scale,
                         float* corr, cudaStream_t stream) {
    const dim3 grid((n + kWarps - 1) / kWarps, heads, batch);
    quant_q_kernel<T, E><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(q), qs, heads, n, head_dim, scale_mul,
                                                        q_int8, q_scale, k_mean, kv_group, sm_scale, corr);
    return cudaGetLastError();
  }
};

template <typename T, int E>
struct KLaunch {
  static cudaError_t run(const void* k, Strides3 ks, int batch, int heads, int n, int head_dim, int block,
                         const float* k_mean, int8_t* k_int8, int8_t* k_residual, float* k_scale,
                         cudaStream_t stream) {
    const dim3 grid((n + block - 1) / block, heads, batch);
    quant_k_kernel<T, E><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(k), ks, heads, n, head_dim, block,
                                                        k_mean, k_int8, k_residual, k_scale);
    return cudaGetLastError();
  }
};

template <typename T, int E>
struct VLaunch {
  static cudaError_t run(const void* v, Strides3 vs, int batch, int heads, int n, int head_dim, int n_pad,
                         const float* v_amax, uint8_t* vt, bool permute_keys, cudaStream_t stream) {
    const dim3 grid((n_pad + kVTokens - 1) / kVTokens, heads, batch);  // n_pad >= n: the padding too
    quant_v_kernel<T, E * kWarp><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(v), vs, heads, n, head_dim,
                                                                n_pad, v_amax, vt, permute_keys);
    return cudaGetLastError();
  }
};

}  // namespace

cudaError_t launch_quant_q_per_token(const void* q, HalfType type, Strides3 qs, int batch, int heads, int n,
                                     int head_dim, int d_pad, float scale_mul, int8_t* q_int8, float* q_scale,
                                     const float* k_mean, int kv_group, float sm_scale, float* corr,
                                     cudaStream_t stream) {
  return dispatch<QLaunch>(type, d_pad, q, qs, batch, heads, n, head_dim, scale_mul, q_int8, q_scale, k_mean,
                           kv_group, sm_scale, corr, stream);
}

cudaError_t launch_quant_k_per_block(const void* k, HalfType type, Strides3 ks, int batch, int heads, int n,
                                     int head_dim, int d_pad, int block, const float* k_mean, int8_t* k_int8,
                                     int8_t* k_residual, float* k_scale, cudaStream_t stream) {
  return dispatch<KLaunch>(type, d_pad, k, ks, batch, heads, n, head_dim, block, k_mean, k_int8, k_residual,
                           k_scale, stream);
}

cudaError_t launch_quant_v_fp8_transposed(const void* v, HalfType type, Strides3 vs, int batch, int heads, int n,
                                          int head_dim, int d_pad, int n_pad, const float* v_amax, uint8_t* vt,
                                          bool permute_keys, cudaStream_t stream) {
  if (permute_keys && n_pad % 16 != 0) return cudaErrorInvalidValue;
  return dispatch<VLaunch>(type, d_pad, v, vs, batch, heads, n, head_dim, n_pad, v_amax, vt, permute_keys, stream);
}

}  // namespace sage
