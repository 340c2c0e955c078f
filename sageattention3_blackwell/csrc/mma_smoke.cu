// A single block-scaled FP4 MMA (mma.sync m16n8k64, kind::mxf4nvf4, UE4M3 scales per 16) run by one
// warp: the smallest check that the sm_120a tensor-core path reads our codes and scales as intended
// (the attention kernel uses the same fragment loads). Also: which families this module was built for.
#include "nvfp4.cuh"
#include "sage3_kernels.h"

namespace sage3 {
namespace {

__global__ void mma_smoke_kernel(const uint8_t* a_codes, const uint8_t* a_scales, const uint8_t* b_codes,
                                 const uint8_t* b_scales, float* out) {
#ifdef SAGE3_HAS_MMA_BLOCK_SCALE
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  // Codes are [rows][32 bytes]: 8 codes (4 bytes) per register, k = 8t .. 8t+7 starts at byte 4t.
  const auto word = [](const uint8_t* rowp, int byte) { return *reinterpret_cast<const uint32_t*>(rowp + byte); };
  const uint32_t a[4] = {word(a_codes + g * 32, 4 * t), word(a_codes + (g + 8) * 32, 4 * t),
                         word(a_codes + g * 32, 16 + 4 * t), word(a_codes + (g + 8) * 32, 16 + 4 * t)};
  const uint32_t b[2] = {word(b_codes + g * 32, 4 * t), word(b_codes + g * 32, 16 + 4 * t)};
  const uint32_t sfa = word(a_scales + (t & 1 ? g + 8 : g) * 4, 0);
  const uint32_t sfb = word(b_scales + g * 4, 0);
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  mma_nvfp4_16x8x64(d, a, b, sfa, sfb);
  out[g * 8 + 2 * t] = d[0];
  out[g * 8 + 2 * t + 1] = d[1];
  out[(g + 8) * 8 + 2 * t] = d[2];
  out[(g + 8) * 8 + 2 * t + 1] = d[3];
#endif
}

}  // namespace

cudaError_t launch_mma_smoke(const uint8_t* a_codes, const uint8_t* a_scales, const uint8_t* b_codes,
                             const uint8_t* b_scales, float* out, cudaStream_t stream) {
  if (device_family() != 2) return cudaErrorNotSupported;  // the instruction exists on sm_120a only
  mma_smoke_kernel<<<1, 32, 0, stream>>>(a_codes, a_scales, b_codes, b_scales, out);
  return cudaGetLastError();
}

// Set by setup.py from the arch list: which families this module was compiled for.
int compiled_families() {
  int bits = 0;
#ifdef SAGE3_BUILT_SM100A
  bits |= 1;
#endif
#ifdef SAGE3_BUILT_SM120A
  bits |= 2;
#endif
#ifdef SAGE3_BUILT_SM90A
  bits |= 4;
#endif
  return bits;
}

// Arch-specific ("a") SASS runs only on its exact compute capability: sm_100a on 10.0, sm_120a on 12.0,
// sm_90a on 9.0 (not on 10.3, 12.1, ...).
int device_family() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  const int bit = major == 10 && minor == 0 ? 1 : major == 12 && minor == 0 ? 2 : major == 9 && minor == 0 ? 4 : 0;
  return compiled_families() & bit;
}

}  // namespace sage3
