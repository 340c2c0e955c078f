// How fast can a quantization stream bfloat16 rows through shared memory? A probe for a persistent,
// bulk-copy fed design of the fused quantization (csrc/fused/quant_qkv.cu): each CTA walks its share
// of 128-token slabs (32 KiB at d=128) in order; one producer thread per CTA decodes each slab once
// (for the consumers, through shared memory) and keeps `stages` slabs in flight with cp.async.bulk
// (one copy per token row, as a [B, N, H, D] layout needs, or one per slab where the rows are
// contiguous), and PROBE_WARPS consumer warps (8 by default) turn each slab into 8-bit rows with
// PROBE_ARITH's arithmetic (kArith: 0 simple per-token INT8, 1 the same with cheaper conversions, 2 the
// product's, 3 none). With `stats`, every head's K and V slabs are also read once before their
// quantization, a few heads ahead (the statistics pass).
//
//   nvcc -std=c++17 -O3 -arch=sm_90a --use_fast_math -Icsrc/include -Icsrc bench/stream_probe.cu -o /tmp/probe
//   /tmp/probe n batch heads
// Prints µs per pass for grids of 1 and 2 CTAs per SM, 2-6 stages, row and slab copies, with and
// without the statistics pass, and the device-to-device copy of the same bytes for reference.
// PROBE_GRIDS=g1,g2,... in the environment times slab copies with the statistics on g CTAs (one an SM)
// instead, for a quantization running on a few SMs beside the attention.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <vector>

#include "bench_cuda.cuh"
#include "sage_mbarrier.cuh"
#include "fused/quant_common.cuh"

namespace {

constexpr int kD = 128, kTokens = 128, kSlabBytes = kTokens * kD * 2;
#ifndef PROBE_WARPS
#define PROBE_WARPS 8
#endif
#ifndef PROBE_ARITH
#define PROBE_ARITH 0
#endif
constexpr int kConsumerWarps = PROBE_WARPS, kThreads = (kConsumerWarps + 1) * 32;
// The consumers' work on a slab: 0 simple, 1 fast, 2 the product's (consume_*), 3 none (the slab
// released as it lands: what the bulk copies alone sustain).
constexpr int kArith = PROBE_ARITH;
constexpr int kLookaheadHeads = 2;

struct Probe {
  const __nv_bfloat16* in;  // Q, K, V: 3 x heads x n x kD
  int8_t* out;              // 3 x heads x n x kD
  float* scale;             // 3 x heads x n
  const float* k_mean;      // heads x kD (PROBE_ARITH=2)
  const float* v_inv;       // heads x kD: 448 / V's channel maxima (PROBE_ARITH=2)
  float* corr;              // heads x n: Q's smooth-K correction (PROBE_ARITH=2)
  int heads, n;             // n a multiple of kTokens
  bool rows, stats;
};

// Slab i of the walk: kind 0..2 = quantize Q/K/V slab, 3/4 = read K/V slab for the statistics.
struct Slab {
  int kind, head, blk;
};

// Per head h (in order): the statistics slabs of head h + kLookaheadHeads (K then V), then Q, K and V
// of head h; the first kLookaheadHeads heads' statistics come first.
__host__ __device__ Slab slab_of(const Probe& p, int i) {
  const int per = p.n / kTokens;
  if (!p.stats) return {i / (p.heads * per), (i / per) % p.heads, i % per};
  const int pre = (kLookaheadHeads < p.heads ? kLookaheadHeads : p.heads) * 2 * per;
  if (i < pre) return {3 + (i / per) % 2, i / (2 * per), i % per};
  i -= pre;
  const int early = p.heads > kLookaheadHeads ? p.heads - kLookaheadHeads : 0;  // heads followed by another head's statistics
  if (i < early * 5 * per) {
    const int h = i / (5 * per), r = i % (5 * per);
    if (r < 2 * per) return {3 + r / per, h + kLookaheadHeads, r % per};
    return {(r - 2 * per) / per, h, r % per};
  }
  i -= early * 5 * per;
  return {(i % (3 * per)) / per, early + i / (3 * per), i % per};
}

__host__ __device__ int slabs(const Probe& p) {
  const int per = p.n / kTokens;
  return p.stats ? p.heads * per * 5 : 3 * p.heads * per;
}

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
      "l"(src), "r"(bytes), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
      : "memory");
}

// A consumer thread's share of one slab, by PROBE_ARITH: thread (row, c) takes channels [8c, 8c + 8)
// of tokens row, row + kRows, ... Returns what keeps the statistics' reads from being optimized away.
constexpr int kVecs = kD / 8, kRows = kConsumerWarps * 32 / kVecs;

// 0: per-token INT8 with fmaxf, a division per token and F2I per element; statistics slabs take the same
// per-token maxima (shuffles included).
__device__ __forceinline__ float consume_simple(const Probe& p, const Slab& sl, const uint8_t* slab, int64_t row0,
                                                int row, int c) {
  float keep = 0.f;
#pragma unroll 2
  for (int r = row; r < kTokens; r += kRows) {
    const uint4 raw = *reinterpret_cast<const uint4*>(slab + r * kD * 2 + c * 16);
    const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
    float x[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h2[j]);
      x[2 * j] = f.x;
      x[2 * j + 1] = f.y;
    }
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(x[j]));
#pragma unroll
    for (int o = kVecs / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (sl.kind >= 3) {
      keep += amax;
      continue;
    }
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int q = __float2int_rn(x[j] * inv);
      w[j / 4] |= (static_cast<uint32_t>(q) & 0xffu) << (8 * (j % 4));
    }
    *reinterpret_cast<uint2*>(p.out + (row0 + r) * kD + c * 8) = make_uint2(w[0], w[1]);
    if (c == 0) p.scale[row0 + r] = amax / 127.f;
  }
  return keep;
}

// 1: statistics slabs reduce per thread (channel-wise, as K's sums and V's maxima are); quantized rows
// convert by a float add (1.5 * 2^23 + q in the low bits) and pack by byte permutes.
__device__ __forceinline__ float consume_fast(const Probe& p, const Slab& sl, const uint8_t* slab, int64_t row0,
                                              int row, int c) {
  float keep = 0.f;
  if (sl.kind >= 3) {
#pragma unroll
    for (int r = row; r < kTokens; r += kRows) {
      const uint4 raw = *reinterpret_cast<const uint4*>(slab + r * kD * 2 + c * 16);
      const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) keep = fmaxf(keep, fmaxf(fabsf(__uint_as_float(u[j] << 16)), fabsf(__uint_as_float(u[j] & 0xffff0000u))));
    }
  } else {
#pragma unroll
    for (int r = row; r < kTokens; r += kRows) {
      const uint4 raw = *reinterpret_cast<const uint4*>(slab + r * kD * 2 + c * 16);
      const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
      float x[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        x[2 * j] = __uint_as_float(u[j] << 16);
        x[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
      }
      float amax = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(x[j]));
#pragma unroll
      for (int o = kVecs / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      const float inv = amax > 0.f ? __fdividef(127.f, amax) : 0.f;
      int q[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) q[j] = __float_as_int(fmaf(x[j], inv, 12582912.f));
      const uint32_t w0 = __byte_perm(__byte_perm(q[0], q[1], 0x0040), __byte_perm(q[2], q[3], 0x0040), 0x5410);
      const uint32_t w1 = __byte_perm(__byte_perm(q[4], q[5], 0x0040), __byte_perm(q[6], q[7], 0x0040), 0x5410);
      *reinterpret_cast<uint2*>(p.out + (row0 + r) * kD + c * 8) = make_uint2(w0, w1);
      if (c == 0) p.scale[row0 + r] = amax / 127.f;
    }
  }
  return keep;
}

// 2: the product's arithmetic (csrc/fused/quant_common.cuh): K's channel sums and V's channel maxima
// in the statistics slabs; Q per token with its smooth-K correction q . k_mean; K per token after the
// mean's subtraction; V to FP8 with per-channel scales, transposed through shared memory (`vt`, after
// the stages) into Vᵀ rows of 16-byte stores.
__device__ __forceinline__ float consume_product(const Probe& p, const Slab& sl, const uint8_t* slab, int64_t row0,
                                                 int row, int c, uint32_t* vt) {
  float keep = 0.f;
  if (sl.kind >= 3) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    uint32_t mag[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int r = row; r < kTokens; r += kRows) {
      const uint4 raw = *reinterpret_cast<const uint4*>(slab + r * kD * 2 + c * 16);
      if (sl.kind == 3) {
        float x[8];
        sage::quant::unpack8<__nv_bfloat16>(raw, x);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] += x[j];
      } else {
        mag[0] = __vmaxu2(mag[0], raw.x & sage::quant::kHalfMagnitudes);
        mag[1] = __vmaxu2(mag[1], raw.y & sage::quant::kHalfMagnitudes);
        mag[2] = __vmaxu2(mag[2], raw.z & sage::quant::kHalfMagnitudes);
        mag[3] = __vmaxu2(mag[3], raw.w & sage::quant::kHalfMagnitudes);
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) keep += acc[j];
    keep += __uint_as_float(mag[0] ^ mag[1] ^ mag[2] ^ mag[3]);
  } else if (sl.kind < 2) {
    const float* km = p.k_mean + sl.head * kD + c * 8;
    float kmv[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) kmv[j] = __ldg(km + j);
#pragma unroll
    for (int r = row; r < kTokens; r += kRows) {
      uint4 raw = *reinterpret_cast<const uint4*>(slab + r * kD * 2 + c * 16);
      float amax;
      uint2 w;
      if (sl.kind == 0) {
        w = sage::quant::quant_token_int8<__nv_bfloat16, kVecs>(raw, amax);
        float x[8];
        sage::quant::unpack8<__nv_bfloat16>(raw, x);
        float dot = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) dot = sage::quant::dot_step(dot, x[j], kmv[j]);
#pragma unroll
        for (int o = kVecs / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (c == 0) p.corr[int64_t{sl.head} * p.n + sl.blk * kTokens + r] = dot * amax;
      } else {
        float x[8];
        sage::quant::unpack8<__nv_bfloat16>(raw, x);
        amax = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          x[j] -= kmv[j];
          amax = sage::quant::amax2(amax, fabsf(x[j]));
        }
#pragma unroll
        for (int o = kVecs / 2; o > 0; o >>= 1) amax = sage::quant::amax2(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        w = sage::quant::int8x8(x, sage::quant::inv_scale(sage::kInt8Max, amax));
      }
      *reinterpret_cast<uint2*>(p.out + (row0 + r) * kD + c * 8) = w;
      if (c == 0) p.scale[row0 + r] = amax / 127.f;
    }
  } else {
    // Unit u takes tokens 4u .. 4u + 3 of channels 8c .. 8c + 7: one 4-byte word per channel into
    // vt[channel][token], 16-byte chunks swizzled by the channel group.
    const float* vi = p.v_inv + sl.head * kD + c * 8;
    float inv[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) inv[j] = __ldg(vi + j);
    asm volatile("bar.sync 1, %0;" ::"r"(kConsumerWarps * 32));
    for (int u = row; u < kTokens / 4; u += kRows) {
      float x[4][8];
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const uint4 raw = *reinterpret_cast<const uint4*>(slab + (4 * u + t) * kD * 2 + c * 16);
        sage::quant::unpack8<__nv_bfloat16>(raw, x[t]);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t lo = sage::quant::to_fp8x2(x[0][j] * inv[j], x[1][j] * inv[j]);
        const uint32_t hi = sage::quant::to_fp8x2(x[2][j] * inv[j], x[3][j] * inv[j]);
        const int d = 8 * c + j;
        vt[d * 32 + (((u / 4) ^ (c % 8)) * 4 + u % 4)] = lo | hi << 16;
      }
    }
    asm volatile("bar.sync 1, %0;" ::"r"(kConsumerWarps * 32));
    const int tid = threadIdx.x;
    for (int i = tid; i < kD * 8; i += kConsumerWarps * 32) {
      const int d = i / 8, q = i % 8;
      const uint4 v = reinterpret_cast<const uint4*>(vt + d * 32)[q ^ ((d / 8) % 8)];
      *reinterpret_cast<uint4*>(p.out + (int64_t{2} * p.heads * p.n * kD) +
                                (int64_t{sl.head} * kD + d) * p.n + sl.blk * kTokens + 16 * q) = v;
    }
  }
  return keep;
}

template <int kStages>
__global__ void __launch_bounds__(kThreads) stream_kernel(const Probe p) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint64_t full[kStages], empty[kStages];
  __shared__ Slab info[kStages];  // the producer's decoding of each stage's slab
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      sage::mbar_init(&full[s], 1);
      sage::mbar_init(&empty[s], kConsumerWarps);
    }
    sage::mbar_fence_init();
  }
  __syncthreads();
  const int total = slabs(p);
  const int64_t tensor = int64_t{p.heads} * p.n * kD;
  if (warp == kConsumerWarps) {  // producer
    int k = 0;
    for (int i = blockIdx.x; i < total; i += gridDim.x, ++k) {
      const int s = k % kStages;
      if (k >= kStages) sage::mbar_wait(&empty[s], ((k / kStages) - 1) & 1);
      const Slab sl = slab_of(p, i);
      const int t = sl.kind < 3 ? sl.kind : sl.kind - 2;
      const __nv_bfloat16* src = p.in + t * tensor + (int64_t{sl.head} * p.n + sl.blk * kTokens) * kD;
      uint8_t* dst = smem + s * kSlabBytes;
      if (lane == 0) {
        info[s] = sl;
        sage::mbar_arrive_expect_tx(&full[s], kSlabBytes);
      }
      __syncwarp();
      if (p.rows) {
        for (int r = lane; r < kTokens; r += 32) bulk_copy(dst + r * kD * 2, src + r * kD, kD * 2, &full[s]);
      } else if (lane == 0) {
        bulk_copy(dst, src, kSlabBytes, &full[s]);
      }
    }
    return;
  }
  const int c = threadIdx.x % kVecs, row = threadIdx.x / kVecs;
  int k = 0;
  for (int i = blockIdx.x; i < total; i += gridDim.x, ++k) {
    const int s = k % kStages;
    sage::mbar_wait(&full[s], (k / kStages) & 1);
    if constexpr (kArith == 3) {
      __syncwarp();
      if (lane == 0) sage::mbar_arrive(&empty[s]);
      continue;
    }
    const Slab sl = info[s];
    const uint8_t* slab = smem + s * kSlabBytes;
    const int64_t row0 = (int64_t{sl.kind % 3} * p.heads + sl.head) * p.n + sl.blk * kTokens;
    float keep = 0.f;
    if constexpr (kArith == 0) keep = consume_simple(p, sl, slab, row0, row, c);
    if constexpr (kArith == 1) keep = consume_fast(p, sl, slab, row0, row, c);
    if constexpr (kArith == 2) keep = consume_product(p, sl, slab, row0, row, c, reinterpret_cast<uint32_t*>(smem + kStages * kSlabBytes));
    if (keep == 12345.f) p.scale[0] = keep;  // keeps the statistics' reads
    __syncwarp();
    if (lane == 0) sage::mbar_arrive(&empty[s]);
  }
}

template <int kStages>
float time_us(const Probe& p, int grid, int reps) {
  auto kernel = stream_kernel<kStages>;
  const int smem = kStages * kSlabBytes + kD * kTokens;  // the slabs, then consume_product's Vᵀ tile
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  kernel<<<grid, kThreads, smem>>>(p);
  CHECK(cudaGetLastError());
  std::vector<float> ts;
  for (int r = 0; r < 5; ++r) {
    CHECK(cudaEventRecord(a));
    for (int i = 0; i < reps; ++i) kernel<<<grid, kThreads, smem>>>(p);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms * 1e3f / reps);
  }
  std::sort(ts.begin(), ts.end());
  return ts[2];
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Shape shape = bench::shape_args(argc, argv);
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  Probe p{};
  p.heads = shape.batch * shape.heads;
  p.n = shape.n / kTokens * kTokens;
  const int64_t elems = 3 * int64_t{p.heads} * p.n * kD;
  p.in = bench::dev<__nv_bfloat16>(elems);
  bench::fill_bf16<<<1024, 256>>>(reinterpret_cast<uint16_t*>(const_cast<__nv_bfloat16*>(p.in)), elems, 7);
  p.out = bench::dev<int8_t>(elems);
  p.scale = bench::dev<float>(elems / kD);
  {
    float* km = bench::dev<float>(int64_t{p.heads} * kD);
    float* vi = bench::dev<float>(int64_t{p.heads} * kD);
    bench::fill_float<<<64, 256>>>(km, int64_t{p.heads} * kD, 0.01f);
    bench::fill_float<<<64, 256>>>(vi, int64_t{p.heads} * kD, 100.f);
    p.k_mean = km;
    p.v_inv = vi;
    p.corr = bench::dev<float>(int64_t{p.heads} * p.n);
  }
  for (int stats = 0; stats < 2; ++stats) {  // the walk quantizes every slab once and reads K, V once more
    p.stats = stats;
    const int per = p.n / kTokens;
    std::vector<int> seen(5 * p.heads * per, 0);
    for (int i = 0; i < slabs(p); ++i) {
      const Slab s = slab_of(p, i);
      ++seen[(s.kind * p.heads + s.head) * per + s.blk];
    }
    for (int j = 0; j < static_cast<int>(seen.size()); ++j) {
      if (seen[j] != (j < 3 * p.heads * per || stats ? 1 : 0)) {
        std::printf("walk error at %d (stats=%d)\n", j, stats);
        return 1;
      }
    }
  }
  const int reps = std::max(3, static_cast<int>(4e8 / (elems * 3)));
  // The same bytes as one device-to-device copy (reads the inputs, writes as many bytes).
  {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    uint8_t* dst = bench::dev<uint8_t>(elems * 2);
    CHECK(cudaMemcpy(dst, p.in, elems * 2, cudaMemcpyDeviceToDevice));
    CHECK(cudaEventRecord(a));
    for (int i = 0; i < reps; ++i) CHECK(cudaMemcpyAsync(dst, p.in, elems * 2, cudaMemcpyDeviceToDevice));
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    const double us = ms * 1e3 / reps;
    std::printf("n=%d heads=%d: %.1f MB in, %.1f MB out; copy of the inputs %.1f us (%.2f TB/s read+write)\n", p.n,
                p.heads, elems * 2 / 1e6, elems / 1e6, us, elems * 4 / us / 1e6);
    CHECK(cudaFree(dst));
  }
  // PROBE_GRIDS=g1,g2,...: slab copies with the statistics on g CTAs (one an SM) only, for a quantization
  // that runs on a few SMs beside the attention.
  if (const char* grids = std::getenv("PROBE_GRIDS")) {
    p.stats = true;
    p.rows = false;
    const double bytes = elems * 3.0;  // bf16 in, 8-bit out
    for (const char* g = grids; *g;) {
      const int grid = std::atoi(g);
      const float t4 = time_us<4>(p, grid, reps), t6 = time_us<6>(p, grid, reps);
      const float t = std::min(t4, t6);
      std::printf("grid=%d: 4 stages %.1f us, 6 stages %.1f us; %.2f TB/s, %.1f GB/s per SM\n", grid, t4, t6,
                  bytes / t / 1e6, bytes / t / 1e3 / grid);
      while (*g && *g != ',') ++g;
      if (*g == ',') ++g;
    }
    return 0;
  }
  for (int stats = 0; stats < 2; ++stats) {
    for (int rows = 0; rows < 2; ++rows) {
      p.stats = stats;
      p.rows = rows;
      for (int per_sm = 1; per_sm <= 2; ++per_sm) {
        std::printf("stats=%d rows=%d ctas/SM=%d:", stats, rows, per_sm);
        if (per_sm == 1) {
          std::printf(" 4 stages %.1f, 5 %.1f, 6 %.1f", time_us<4>(p, sms, reps), time_us<5>(p, sms, reps),
                      time_us<6>(p, sms, reps));
        } else {
          std::printf(" 2 stages %.1f, 3 %.1f", time_us<2>(p, 2 * sms, reps), time_us<3>(p, 2 * sms, reps));
        }
        std::printf(" us\n");
      }
    }
  }
  // Spot check: token 5 of head 0 of K, against the host's arithmetic.
  std::vector<uint16_t> h(kD);
  std::vector<int8_t> q(kD);
  const int64_t tok = (int64_t{1} * p.heads * p.n + 5) * kD;
  CHECK(cudaMemcpy(h.data(), p.in + tok, kD * 2, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(q.data(), p.out + tok, kD, cudaMemcpyDeviceToHost));
  float amax = 0.f;
  std::vector<float> x(kD);
  for (int j = 0; j < kD; ++j) {
    uint32_t bits = static_cast<uint32_t>(h[j]) << 16;
    std::memcpy(&x[j], &bits, 4);
    amax = std::max(amax, std::fabs(x[j]));
  }
  int bad = 0;
  for (int j = 0; j < kD; ++j) bad += std::abs(static_cast<int>(std::nearbyint(x[j] * (127.f / amax))) - q[j]) > 1;
  std::printf("spot check: %d of %d channels off\n", bad, kD);
  return bad != 0;
}
