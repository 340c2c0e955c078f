// Helpers of the standalone CUDA measurement programs in bench/ (trace_sm90.cu, quant_sm_share.cu, call_sm90.cu):
// an error check that exits, the shape arguments, and fills of device buffers with hashed bytes, hashed
// bfloat16 values or a constant.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

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

}  // namespace bench
