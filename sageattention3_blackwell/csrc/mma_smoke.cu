// A single block-scaled FP4 MMA (mma.sync m16n8k64, kind::mxf4nvf4, UE4M3 scales per 16) run by one
// warp: the smallest check that the sm_120a tensor-core path reads our codes and scales as intended.
// sm_100a has no mma.sync with block scaling (it uses tcgen05.mma); there the kernel is empty and the
// launcher refuses.
#include "nvfp4.cuh"
#include "sage3_kernels.h"

namespace sage3 {
namespace {

__global__ void mma_smoke_kernel(const uint8_t* a_codes, const uint8_t* a_scales, const uint8_t* b_codes,
                                 const uint8_t* b_scales, float* out) {
#ifdef SAGE3_HAS_MMA_BLOCK_SCALE
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  // Codes are [rows][32 bytes]: 8 codes (4 bytes) per register, k = 8t .. 8t+7 starts at byte 4t.
  const auto word = [](const uint8_t* rowp, int byte) {
    return *reinterpret_cast<const uint32_t*>(rowp + byte);
  };
  const uint32_t a[4] = {word(a_codes + g * 32, 4 * t), word(a_codes + (g + 8) * 32, 4 * t),
                         word(a_codes + g * 32, 16 + 4 * t), word(a_codes + (g + 8) * 32, 16 + 4 * t)};
  const uint32_t b[2] = {word(b_codes + g * 32, 4 * t), word(b_codes + g * 32, 16 + 4 * t)};
  const int sfa_row = (t % 2 == 0) ? g : g + 8;
  const uint32_t sfa = word(a_scales + sfa_row * 4, 0);
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
  if (!(compiled_families() & 2)) return cudaErrorNotSupported;
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (major != 12) return cudaErrorNotSupported;  // the sm_120a code runs on the 12.x family only
  mma_smoke_kernel<<<1, 32, 0, stream>>>(a_codes, a_scales, b_codes, b_scales, out);
  return cudaGetLastError();
}

// Set by setup.py from the arch list: which Blackwell families this module was compiled for.
int compiled_families() {
  int bits = 0;
#ifdef SAGE3_BUILT_SM100A
  bits |= 1;
#endif
#ifdef SAGE3_BUILT_SM120A
  bits |= 2;
#endif
  return bits;
}

}  // namespace sage3
