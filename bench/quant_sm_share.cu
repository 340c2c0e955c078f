// How the fused quantization's time scales with the SMs it gets: whether the quantization could run
// beside the attention on a share of the SMs instead of before it on all of them. The quantization
// (csrc/fused/quant_qkv.cu) of random bfloat16 Q, K, V runs once alone and then next to a blocker:
// an attention launch (csrc/sm90) of (SMs - share) long CTAs, one per SM (its shared memory and
// registers leave no room for a quantization CTA), started first on another stream. The quantization
// then gets `share` SMs; the blocker is sized to outlast it (checked).
//
//   nvcc -std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr --use_fast_math -Icsrc/include -Icsrc bench/quant_sm_share.cu \
//     csrc/fused/quant_qkv.cu csrc/sm90/attn_int8_fp8.cu -o /tmp/share
//   /tmp/share n batch heads share...
// Prints, per share, the quantization's time and its SM-time against the run on every SM.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_cuda.cuh"
#include "fused/quant.h"
#include "sm90/attn.h"

namespace {

using bench::dev;
using bench::fill_bytes;
using bench::fill_float;

__global__ void spin(long long cycles) {
  const long long t = clock64();
  while (clock64() - t < cycles) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace sage;
  const bench::Shape shape = bench::shape_args(argc, argv);
  const int n = shape.n, batch = shape.batch, heads = shape.heads;
  std::vector<int> shares;
  for (int i = 4; i < argc; ++i) shares.push_back(std::atoi(argv[i]));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  constexpr int D = 128;

  // The quantization's inputs and outputs.
  const QuantQkvArgs a = bench::random_qkv(n, batch, heads, D);

  cudaStream_t sa, sb;
  CHECK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
  cudaEvent_t e0, e1, eb;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  CHECK(cudaEventCreate(&eb));
  for (int i = 0; i < 3; ++i) CHECK(launch_quant_qkv_sm90(a, sb));
  CHECK(cudaStreamSynchronize(sb));
  constexpr int kReps = 10;
  CHECK(cudaEventRecord(e0, sb));
  for (int i = 0; i < kReps; ++i) CHECK(launch_quant_qkv_sm90(a, sb));
  CHECK(cudaEventRecord(e1, sb));
  CHECK(cudaEventSynchronize(e1));
  float ms_all = 0;
  CHECK(cudaEventElapsedTime(&ms_all, e0, e1));
  ms_all /= kReps;
  std::printf("n=%d b=%d h=%d: quantization on all %d SMs %.1f us\n", n, batch, heads, sms, ms_all * 1e3);

  for (const int share : shares) {
    if (share < 1 || share >= sms) continue;
    // The blocker: one CTA per SM on sms - share SMs, each long enough (about 1.1 us per 128-key step)
    // to outlast the quantization even if its time grew as 1 / share.
    const double want_us = 4.0 * ms_all * 1e3 * sms / share;
    const int nk = static_cast<int>(std::min(4.0e6, std::max(8192.0, want_us / 1.1 * 128))) / 128 * 128;
    const int nq = (sms - share) * 128;
    int8_t *bq = dev<int8_t>(int64_t(nq) * D), *bk = dev<int8_t>(int64_t(nk) * D);
    uint8_t* bv = dev<uint8_t>(int64_t(D) * nk);
    float *bqs = dev<float>(nq), *bks = dev<float>(nk / 128), *bvs = dev<float>(D);
    void* bo = dev<uint16_t>(int64_t(nq) * D);
    fill_bytes<<<1024, 256>>>(reinterpret_cast<uint8_t*>(bq), int64_t(nq) * D, 4u, 0xffu, 0u);
    fill_bytes<<<1024, 256>>>(reinterpret_cast<uint8_t*>(bk), int64_t(nk) * D, 5u, 0xffu, 0u);
    fill_bytes<<<1024, 256>>>(bv, int64_t(nk) * D, 6u, 0x0fu, 0x30u);
    fill_float<<<64, 256>>>(bqs, nq, 1e-4f);
    fill_float<<<64, 256>>>(bks, nk / 128, 1e-3f);
    fill_float<<<1, 128>>>(bvs, D, 1.0f / 448.0f);
    AttnSm90Args b = bench::dense_attn_args({bq, bk, bv, bqs, bks, bvs, bo}, 1, 1, nq, nk, nk, D, false);
    int* counters = dev<int>(3);  // one tile counter per blocker launch, zero at its start
    CHECK(cudaMemset(counters, 0, 3 * sizeof(int)));
    CHECK(cudaDeviceSynchronize());
    std::vector<float> times;
    int outlasted = 0;
    for (int rep = 0; rep < 3; ++rep) {
      b.tile_counter = counters + rep;
      CHECK(launch_qk_int8_sv_f8_attn_sm90(b, sa));
      spin<<<1, 32, 0, sb>>>(40000);  // the blocker's CTAs take their SMs meanwhile
      CHECK(cudaEventRecord(e0, sb));
      CHECK(launch_quant_qkv_sm90(a, sb));
      CHECK(cudaEventRecord(e1, sb));
      CHECK(cudaEventRecord(eb, sa));
      CHECK(cudaDeviceSynchronize());
      float ms = 0, ms_b = 0;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      CHECK(cudaEventElapsedTime(&ms_b, e0, eb));
      times.push_back(ms);
      outlasted += ms_b > ms;
    }
    std::sort(times.begin(), times.end());
    const float ms = times[1];
    std::printf("  share %3d SMs: %8.1f us (%.2fx the time), SM-time %.2fx; blocker outlasted it %d/3 (nk=%d)\n",
                share, ms * 1e3, ms / ms_all, ms * share / (ms_all * sms), outlasted, nk);
    CHECK(cudaFree(bq));
    CHECK(cudaFree(bk));
    CHECK(cudaFree(bv));
    CHECK(cudaFree(bqs));
    CHECK(cudaFree(bks));
    CHECK(cudaFree(bvs));
    CHECK(cudaFree(bo));
  }
  return 0;
}
