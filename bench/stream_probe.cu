// How fast can a quantization stream bfloat16 rows through shared memory? A probe for a persistent,
// bulk-copy fed design of the fused quantization (csrc/fused/quant_qkv.cu): each CTA walks its share
// of 128-token slabs (32 KiB at d=128) in order; one producer thread per CTA keeps `stages` slabs in
// flight with cp.async.bulk (one copy per token row, as a [B, N, H, D] layout needs, or one per slab
// where the rows are contiguous), and 8 consumer warps turn each slab into INT8 rows with one scale
// per token (Q's arithmetic) and 8-byte stores. With `stats`, every head's K and V slabs are also read
// once before their quantization, a few heads ahead (the statistics pass), and reduced to nothing.
//
//   nvcc -std=c++17 -O3 -arch=sm_90a --use_fast_math -Icsrc/include -Icsrc bench/stream_probe.cu -o /tmp/probe
//   /tmp/probe n batch heads
// Prints µs per pass for grids of 1 and 2 CTAs per SM, 2-6 stages, row and slab copies, with and
// without the statistics pass, and the device-to-device copy of the same bytes for reference.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <vector>

#include "bench_cuda.cuh"
#include "sage_mbarrier.cuh"

namespace {

constexpr int kD = 128, kTokens = 128, kSlabBytes = kTokens * kD * 2;
constexpr int kConsumerWarps = 8, kThreads = (kConsumerWarps + 1) * 32;
constexpr int kLookaheadHeads = 2;

struct Probe {
  const __nv_bfloat16* in;  // Q, K, V: 3 x heads x n x kD
  int8_t* out;              // 3 x heads x n x kD
  float* scale;             // 3 x heads x n
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

template <int kStages>
__global__ void __launch_bounds__(kThreads) stream_kernel(const Probe p) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint64_t full[kStages], empty[kStages];
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
      if (lane == 0) sage::mbar_arrive_expect_tx(&full[s], kSlabBytes);
      __syncwarp();
      if (p.rows) {
        for (int r = lane; r < kTokens; r += 32) bulk_copy(dst + r * kD * 2, src + r * kD, kD * 2, &full[s]);
      } else if (lane == 0) {
        bulk_copy(dst, src, kSlabBytes, &full[s]);
      }
    }
    return;
  }
  constexpr int kVecs = kD / 8, kRows = kConsumerWarps * 32 / kVecs;
  const int c = threadIdx.x % kVecs, row = threadIdx.x / kVecs;
  int k = 0;
  for (int i = blockIdx.x; i < total; i += gridDim.x, ++k) {
    const int s = k % kStages;
    sage::mbar_wait(&full[s], (k / kStages) & 1);
    const Slab sl = slab_of(p, i);
    const uint8_t* slab = smem + s * kSlabBytes;
    const int64_t row0 = (int64_t{sl.kind % 3} * p.heads + sl.head) * p.n + sl.blk * kTokens;
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
    if (keep == 12345.f) p.scale[0] = keep;  // keeps the statistics' reads
    __syncwarp();
    if (lane == 0) sage::mbar_arrive(&empty[s]);
  }
}

template <int kStages>
float time_us(const Probe& p, int grid, int reps) {
  auto kernel = stream_kernel<kStages>;
  const int smem = kStages * kSlabBytes;
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
