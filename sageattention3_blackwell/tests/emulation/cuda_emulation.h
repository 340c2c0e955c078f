// Host emulation of the CUDA features the sageattn3 kernels use, force-included (g++ -include) before
// the kernel sources. Every CUDA thread of a CTA becomes a std::thread; warp-wide operations
// (shuffles, mma.sync) meet at a barrier of the warp's 32 threads and compute from every lane's
// inputs, __syncthreads is a barrier of the CTA. CTAs run one after another, so `__shared__`
// variables can be function statics.
//
// The tensor-core instructions are computed from the register layouts of the PTX ISA, written here
// independently of the kernels' fragment code: an indexing mistake in a kernel gives wrong numbers
// here. What this cannot check is the hardware itself (that the GPU agrees with these layouts):
// `python -m sageattn3 selftest` does that on the GPU.
#pragma once

#define SAGE3_HOST_EMULATION 1
#define __shared__ static
#define __launch_bounds__(...)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 gridDim;
inline thread_local dim3 blockDim;

inline int min(int a, int b) { return a < b ? a : b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }

inline float __int_as_float(int x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

inline float __uint_as_float(unsigned x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// prmt.b32 (default mode): byte n of the result is byte (s >> 4n) & 7 of {y, x}; with bit 3 of that
// selector nibble set, the selected byte's sign bit replicated.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  unsigned out = 0;
  for (int n = 0; n < 4; ++n) {
    const unsigned sel = (s >> (4 * n)) & 15;
    unsigned byte = (v >> (8 * (sel & 7))) & 0xFF;
    if (sel & 8) byte = (byte & 0x80) ? 0xFF : 0x00;
    out |= byte << (8 * n);
  }
  return out;
}

namespace emu {

// One CTA's meeting points: a barrier of all its threads, and per warp a barrier of 32 with slots.
struct Warp {
  std::barrier<> meet{32};
  uint64_t slot[32];
  uint32_t mma_in[32][10];  // a[4], b[2], sfa, sfb, c as bits (4 words for a k16 f16 mma's c too)
  float mma_c[32][4];
  float mma_d[32][4];
};

struct Cta {
  explicit Cta(int threads) : all(threads), warps(threads / 32) {
    for (auto& w : warps) w = std::make_unique<Warp>();
  }
  std::barrier<> all;
  std::vector<std::unique_ptr<Warp>> warps;
};

inline Cta*& current_cta() {
  static Cta* cta = nullptr;
  return cta;
}

inline Warp& my_warp() { return *current_cta()->warps[threadIdx.x / 32]; }
inline int my_lane() { return threadIdx.x % 32; }

// Run `kernel` over a grid: a thread per CUDA thread, one CTA at a time.
template <class Kernel>
void launch(dim3 grid, int threads, Kernel&& kernel) {
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        Cta cta(threads);
        current_cta() = &cta;
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t)
          pool.emplace_back([&, t] {
            threadIdx = make_uint3(t, 0, 0);
            blockIdx = make_uint3(x, y, z);
            gridDim = grid;
            blockDim = dim3(threads, 1, 1);
            kernel();
          });
        for (auto& th : pool) th.join();
        current_cta() = nullptr;
      }
}

template <class T>
T shuffle(T v, int src) {
  static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
  Warp& w = my_warp();
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  w.slot[my_lane()] = bits;
  w.meet.arrive_and_wait();
  bits = w.slot[src & 31];
  w.meet.arrive_and_wait();
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

inline void copy_bytes(void* dst, const void* src, int n) { std::memcpy(dst, src, n); }

// ---- number formats ------------------------------------------------------------------------------

inline float e2m1_value(unsigned code) {
  static const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  return (code & 8) ? -mag[code & 7] : mag[code & 7];
}

inline float ue4m3_value(unsigned b) {
  const unsigned exp = (b >> 3) & 15, man = b & 7;
  return exp == 0 ? std::ldexp(static_cast<float>(man), -9) : std::ldexp(1.f + man / 8.f, static_cast<int>(exp) - 7);
}

// cvt.rn.satfinite.e4m3x2.f32 for one non-negative value: nearest E4M3 (ties to even), at most 448.
inline uint32_t e4m3_rn_satfinite(float x) {
  if (!(x > 0.f)) return 0;
  if (x > 448.f) x = 448.f;
  int e;
  std::frexp(x, &e);  // x = f * 2^e, f in [0.5, 1): the leading bit is 2^(e - 1)
  const int lead = e - 1 < -6 ? -6 : e - 1;
  const float quantum = std::ldexp(1.f, lead - 3);
  const float r = std::nearbyint(x / quantum) * quantum;  // exact: power-of-two scaling; ties to even
  if (r == 0.f) return 0;
  if (r < std::ldexp(1.f, -6)) return static_cast<uint32_t>(r / std::ldexp(1.f, -9));  // subnormal
  int re;
  const float f = std::frexp(r, &re);  // r = f * 2^re
  const uint32_t man = static_cast<uint32_t>((f * 2.f - 1.f) * 8.f);
  return static_cast<uint32_t>(((re - 1 + 7) << 3) | man);
}

inline float half_bits_to_float(uint32_t bits) { return __half2float(__ushort_as_half(static_cast<unsigned short>(bits))); }
inline uint32_t float_to_half_bits(float f) { return __half_as_ushort(__float2half_rn(f)); }

inline uint32_t hmul2(uint32_t a, uint32_t b) {
  const uint32_t lo = float_to_half_bits(half_bits_to_float(a & 0xFFFF) * half_bits_to_float(b & 0xFFFF));
  const uint32_t hi = float_to_half_bits(half_bits_to_float(a >> 16) * half_bits_to_float(b >> 16));
  return lo | (hi << 16);
}

// ---- mma.sync --------------------------------------------------------------------------------------
// Lane l, g = l / 4, t = l % 4. C/D: c[0], c[1] row g cols 2t, 2t+1; c[2], c[3] row g+8.

template <class Compute>
void warp_mma(float (&d)[4], const uint32_t* in, int n_in, Compute&& compute) {
  Warp& w = my_warp();
  const int lane = my_lane();
  for (int i = 0; i < n_in; ++i) w.mma_in[lane][i] = in[i];
  for (int i = 0; i < 4; ++i) w.mma_c[lane][i] = d[i];
  w.meet.arrive_and_wait();
  if (lane == 0) {
    double acc[16][8];
    for (int l = 0; l < 32; ++l)
      for (int i = 0; i < 4; ++i) acc[l / 4 + 8 * (i / 2)][2 * (l % 4) + i % 2] = w.mma_c[l][i];
    compute(w, acc);
    for (int l = 0; l < 32; ++l)
      for (int i = 0; i < 4; ++i) w.mma_d[l][i] = static_cast<float>(acc[l / 4 + 8 * (i / 2)][2 * (l % 4) + i % 2]);
  }
  w.meet.arrive_and_wait();
  for (int i = 0; i < 4; ++i) d[i] = w.mma_d[lane][i];
}

// m16n8k64 kind::mxf4nvf4 block_scale scale_vec::4X, thread-id 0 and byte-id 0 for both scales.
// A (row-major 16x64): register i of lane (g, t) holds row g + 8 (i % 2), k = 8t + 32 (i / 2) + n in
// nibble n. B (8x64, "col"): register i holds col g, k = 8t + 32 i + n in nibble n. Scales: byte j
// covers k in [16j, 16j + 16); A's row r comes from lane 4 (r % 8) + r / 8, B's col n from lane 4n.
inline void mma_nvfp4_16x8x64(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], uint32_t sfa,
                              uint32_t sfb) {
  const uint32_t in[8] = {a[0], a[1], a[2], a[3], b[0], b[1], sfa, sfb};
  warp_mma(d, in, 8, [](Warp& w, double (&acc)[16][8]) {
    double A[16][64], B[8][64];
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      for (int i = 0; i < 4; ++i)
        for (int n = 0; n < 8; ++n) A[g + 8 * (i % 2)][8 * t + 32 * (i / 2) + n] = e2m1_value(w.mma_in[l][i] >> (4 * n));
      for (int i = 0; i < 2; ++i)
        for (int n = 0; n < 8; ++n) B[g][8 * t + 32 * i + n] = e2m1_value(w.mma_in[l][4 + i] >> (4 * n));
    }
    for (int r = 0; r < 16; ++r) {
      const uint32_t sa = w.mma_in[4 * (r % 8) + r / 8][6];
      for (int k = 0; k < 64; ++k) A[r][k] *= ue4m3_value((sa >> (8 * (k / 16))) & 0xFF);
    }
    for (int n = 0; n < 8; ++n) {
      const uint32_t sb = w.mma_in[4 * n][7];
      for (int k = 0; k < 64; ++k) B[n][k] *= ue4m3_value((sb >> (8 * (k / 16))) & 0xFF);
    }
    for (int r = 0; r < 16; ++r)
      for (int n = 0; n < 8; ++n) {
        double sum = 0;
        for (int k = 0; k < 64; ++k) sum += A[r][k] * B[n][k];
        acc[r][n] = static_cast<float>(acc[r][n] + sum);
      }
  });
}

// m16n8k16 f16 -> f32. A: register i of lane (g, t) holds row g + 8 (i % 2), k = 2t + 8 (i / 2) + h in
// half h. B: register i holds col g, k = 2t + 8i + h.
inline void mma_f16_16x8x16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const uint32_t in[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  warp_mma(d, in, 6, [](Warp& w, double (&acc)[16][8]) {
    double A[16][16], B[8][16];
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      for (int i = 0; i < 4; ++i)
        for (int h = 0; h < 2; ++h)
          A[g + 8 * (i % 2)][2 * t + 8 * (i / 2) + h] = half_bits_to_float(w.mma_in[l][i] >> (16 * h) & 0xFFFF);
      for (int i = 0; i < 2; ++i)
        for (int h = 0; h < 2; ++h) B[g][2 * t + 8 * i + h] = half_bits_to_float(w.mma_in[l][4 + i] >> (16 * h) & 0xFFFF);
    }
    for (int r = 0; r < 16; ++r)
      for (int n = 0; n < 8; ++n) {
        double sum = 0;
        for (int k = 0; k < 16; ++k) sum += A[r][k] * B[n][k];
        acc[r][n] = static_cast<float>(acc[r][n] + sum);
      }
  });
}

}  // namespace emu

inline void __syncthreads() { emu::current_cta()->all.arrive_and_wait(); }

template <class T>
T __shfl_sync(unsigned, T v, int src) {
  return emu::shuffle(v, src);
}

template <class T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  return emu::shuffle(v, emu::my_lane() ^ lane_mask);
}
