// Helpers of the standalone CUDA measurement programs in bench/ (trace_sm90.cu, quant_sm_share.cu,
// call_sm90.cu): an error check that exits, the shape arguments, fills of device buffers with hashed
// bytes, hashed bfloat16 values or a constant, device allocations, the fused quantization of random
// inputs, and the sm_90a attention's arguments over contiguous buffers with the op's split.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "fused/quant.h"
#include "sm90/attn.h"

#define CHECK(x)                                                                        \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));   \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

namespace bench {

// The attention shape the programs take first on their command line: n batch heads (4096 4 32).
struct Shape {
  int n, batch, heads;
};
inline Shape shape_args(int argc, char** argv) {
  return {argc > 1 ? std::atoi(argv[1]) : 4096, argc > 2 ? std::atoi(argv[2]) : 4, argc > 3 ? std::atoi(argv[3]) : 32};
}

// A hash of the element index and a seed: the same bytes at every run.
__device__ __forceinline__ uint32_t mix(int64_t i, uint32_t seed) {
  uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  return x ^ (x >> 15);
}

// p[i] = (hash & mask) + add.
__global__ void fill_bytes(uint8_t* p, int64_t n, uint32_t seed, uint32_t mask, uint32_t add) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    p[i] = static_cast<uint8_t>((mix(i, seed) & mask) + add);
  }
}

// bfloat16 in [-2, 2): sign, exponent 126..127, random mantissa.
__global__ void fill_bf16(uint16_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t x = mix(i, seed);
    p[i] = static_cast<uint16_t>((x & 0x8000u) | ((126u + ((x >> 7) & 1u)) << 7) | (x & 0x7fu));
  }
}

__global__ void fill_float(float* p, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) p[i] = v;
}

// n elements of T on the device (one at least), unset.
template <typename T>
T* dev(int64_t n) {
  T* p;
  CHECK(cudaMalloc(&p, sizeof(T) * (n > 1 ? n : 1)));
  return p;
}

// The fused quantization of random bfloat16 Q, K and V, [batch, heads, n, d] contiguous (fill_bf16,
// seeds 1-3), smooth-K without the LSE correction, its outputs and workspace allocated: what the
// programs time (quant_sm_share.cu, call_sm90.cu).
inline sage::QuantQkvArgs random_qkv(int n, int batch, int heads, int d) {
  const int n_pad = (n + 15) / 16 * 16;
  const int64_t elems = int64_t(batch) * heads * n * d;
  uint16_t *q = dev<uint16_t>(elems), *k = dev<uint16_t>(elems), *v = dev<uint16_t>(elems);
  fill_bf16<<<1024, 256>>>(q, elems, 1u);
  fill_bf16<<<1024, 256>>>(k, elems, 2u);
  fill_bf16<<<1024, 256>>>(v, elems, 3u);
  sage::QuantQkvArgs a{};
  a.q = q;
  a.k = k;
  a.v = v;
  a.type = sage::HalfType::kBFloat16;
  a.q_strides = a.k_strides = a.v_strides = {int64_t(heads) * n * d, int64_t(n) * d, d};
  a.batch = batch;
  a.heads_q = a.heads_kv = heads;
  a.nq = a.nk = n;
  a.head_dim = a.d_pad = d;
  a.n_pad = n_pad;
  a.smooth_k = true;
  a.sm_scale = 0.088f;
  a.scale_mul = 0.088f * 1.4427f / 127.0f;
  a.q_int8 = dev<int8_t>(elems);
  a.q_scale = dev<float>(int64_t(batch) * heads * n);
  a.corr = nullptr;
  a.k_int8 = dev<int8_t>(elems);
  a.k_scale = dev<float>(int64_t(batch) * heads * ((n + sage::kQkvKeyBlock - 1) / sage::kQkvKeyBlock));
  a.vt = dev<uint8_t>(int64_t(batch) * heads * d * n_pad);
  a.v_scale = dev<float>(int64_t(batch) * heads * d);
  a.k_mean = dev<float>(int64_t(batch) * heads * d);
  a.workspace = dev<float>(sage::quant_qkv_workspace_floats(batch, heads, n, d));
  return a;
}

// The sm_90a attention's inputs in contiguous buffers: Q, K and the output [batch, heads, n, d]
// (nq or nk tokens), Vᵀ [batch, heads, d, n_pad], one scale per query token, per 128 keys and per
// channel.
struct DenseAttn {
  const int8_t *q, *k;
  const uint8_t* vt;
  const float *q_scale, *k_scale, *v_scale;
  void* out;
};

// Their AttnSm90Args: bfloat16 output, one K/V head per query head, nothing split, no tile counter
// (the caller's).
inline sage::AttnSm90Args dense_attn_args(const DenseAttn& t, int batch, int heads, int nq, int nk, int n_pad,
                                          int d, bool causal) {
  const int key_blocks = (nk + sage::kSm90KeyBlock - 1) / sage::kSm90KeyBlock;
  sage::AttnSm90Args a{};
  a.q = t.q;
  a.q_strides = {int64_t(heads) * nq * d, int64_t(nq) * d, d};
  a.k = t.k;
  a.k_strides = {int64_t(heads) * nk * d, int64_t(nk) * d, d};
  a.vt = t.vt;
  a.vt_strides = {int64_t(heads) * d * n_pad, int64_t(d) * n_pad, n_pad};
  a.n_pad = n_pad;
  a.q_scale = t.q_scale;
  a.q_scale_strides = {int64_t(heads) * nq, nq, 1};
  a.k_scale = t.k_scale;
  a.k_scale_strides = {int64_t(heads) * key_blocks, key_blocks, 1};
  a.v_scale = t.v_scale;
  a.v_scale_strides = {int64_t(heads) * d, d, 1};
  a.out = t.out;
  a.out_strides = a.q_strides;
  a.out_type = sage::HalfType::kBFloat16;
  a.batch = batch;
  a.heads_q = a.heads_kv = heads;
  a.nq = nq;
  a.nk = nk;
  a.head_dim = a.d_pad = d;
  a.causal = causal;
  return a;
}

// Splits the last wave's tiles of `a` as the wheel's op does on this GPU (attn_sm90_split_plan),
// allocating the parts' workspace; returns the plan.
inline sage::AttnSm90Split apply_split_plan(sage::AttnSm90Args& a) {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const sage::AttnSm90Split split =
      sage::attn_sm90_split_plan(a.batch, a.heads_q, a.nq, a.nk, a.d_pad, a.causal, sms);
  if (split.parts > 1) {
    a.split_first = split.first;
    a.split_parts = split.parts;
    a.split_partials = dev<float>(split.partials_floats);
  }
  return split;
}

}  // namespace bench
