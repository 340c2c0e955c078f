// Issue throughput of the per-score softmax instructions of the sm_90a kernel, in operations per
// clock per SM: which of them share the 16-lane pipe with MUFU.EX2, what the integer-bias conversion
// (IADD + FADD) costs against I2FP, and whether exp2 in half precision (ex2.approx.f16x2) would make
// P at a higher rate. One CTA of 1024 threads per SM, 8 independent chains per thread, clock64 around
// an unrolled loop.
//
//   nvcc -O3 -arch=sm_90a bench/pipes_sm90.cu -o /tmp/pipes && /tmp/pipes
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

constexpr int kIters = 4096;
constexpr int kChains = 8;

enum Op { kI2F, kEx2, kF2Fp8, kBias, kFfma, kFmnmx, kEx2H2, kF2H2, kH2Fp8, kPairH2 };

template <Op op>
__global__ void run(float* sink, long long* cycles, int seed) {
  float f[kChains];
  int32_t s[kChains];
  uint32_t u[kChains];
  for (int c = 0; c < kChains; ++c) {
    s[c] = seed + c * 7 + threadIdx.x;
    f[c] = -0.001f * (c + threadIdx.x % 7);
    u[c] = 0;
  }
  __syncthreads();
  long long t0 = clock64();
#pragma unroll 16
  for (int it = 0; it < kIters; ++it) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      if constexpr (op == kI2F) {
        f[c] += __int_as_float(0) + static_cast<float>(s[c]);  // I2FP (+ an FADD)
        s[c] ^= it;
      } else if constexpr (op == kEx2) {
        asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(f[c]));
      } else if constexpr (op == kF2Fp8) {
        uint16_t r;
        asm volatile("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(f[c]), "f"(f[c + 0 & 7]));
        u[c] += r;
        f[c] += 1.0f;
      } else if constexpr (op == kBias) {
        f[c] += __int_as_float(s[c] + 0x4B400000) - 12582912.0f;  // IADD + FADD (+ the FADD)
        s[c] ^= it;
      } else if constexpr (op == kEx2H2) {
        uint32_t h = __float_as_uint(f[c]);
        asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(h));
        f[c] = __uint_as_float(h);
      } else if constexpr (op == kF2H2) {
        uint32_t h;
        asm volatile("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(f[c]), "f"(f[c + 1 & 7]));
        u[c] += h;
        f[c] += 1.0f;
      } else if constexpr (op == kH2Fp8) {
        uint16_t r;
        asm volatile("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(r) : "r"(u[c]));
        u[c] += r;
      } else if constexpr (op == kPairH2) {
        // A pair of P values through half precision: one f16x2 conversion, one packed exp2 (two
        // MUFU.EX2.F16 in SASS), one e4m3x2 conversion; pairs per clock.
        uint32_t h;
        uint16_t r;
        asm volatile("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(f[c + 1 & 7]), "f"(f[c]));
        asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(h));
        asm volatile("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(r) : "r"(h));
        u[c] += r;
        f[c] += 1.0f;
      } else if constexpr (op == kFfma) {
        f[c] = fmaf(f[c], 0.999f, 0.001f);
      } else {
        f[c] = fmaxf(f[c], __int_as_float(s[c]));
        s[c] ^= it;
      }
    }
  }
  long long t1 = clock64();
  float acc = 0.0f;
  for (int c = 0; c < kChains; ++c) acc += f[c] + static_cast<float>(u[c]);
  sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <Op op>
void measure(const char* name, float* sink, long long* cycles, int sms, int threads) {
  run<op><<<sms, threads>>>(sink, cycles, 1);
  run<op><<<sms, threads>>>(sink, cycles, 2);
  cudaDeviceSynchronize();
  long long c = 0;
  cudaMemcpy(&c, cycles, sizeof(c), cudaMemcpyDeviceToHost);
  const double ops = double(kIters) * kChains * threads;
  std::printf("%-34s %8.1f ops/clk/SM\n", name, ops / double(c));
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int threads = 1024;
  float* sink;
  long long* cycles;
  cudaMalloc(&sink, sizeof(float) * sms * threads);
  cudaMalloc(&cycles, sizeof(long long) * sms);
  measure<kI2F>("I2FP.F32.S32 (+FADD, LOP)", sink, cycles, sms, threads);
  measure<kBias>("IADD + FADD bias (+FADD, LOP)", sink, cycles, sms, threads);
  measure<kEx2>("MUFU.EX2", sink, cycles, sms, threads);
  measure<kF2Fp8>("F2FP e4m3x2 (+IADD, FADD)", sink, cycles, sms, threads);
  measure<kFfma>("FFMA", sink, cycles, sms, threads);
  measure<kFmnmx>("FMNMX (+LOP)", sink, cycles, sms, threads);
  measure<kEx2H2>("MUFU.EX2 f16x2 (instructions)", sink, cycles, sms, threads);
  measure<kF2H2>("F2FP f16x2 from f32 (+IADD, FADD)", sink, cycles, sms, threads);
  measure<kH2Fp8>("F2FP e4m3x2 from f16x2 (+IADD)", sink, cycles, sms, threads);
  measure<kPairH2>("P pair: f16x2 + EX2 f16x2 + e4m3x2 (pairs)", sink, cycles, sms, threads);
  return cudaGetLastError() != cudaSuccess;
}
