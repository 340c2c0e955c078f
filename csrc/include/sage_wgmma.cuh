// Warpgroup MMA (wgmma.mma_async, sm_90a only) wrappers, shared-memory matrix descriptors, register
// allocation hand-off (setmaxnreg) and the FP8 packing the P·V product needs.
//
// Fragment ownership (PTX ISA, "Register Fragments" of wgmma). A warpgroup is 4 warps = 128
// threads; warp w of the warpgroup owns rows 16w..16w+15 of the 64-row tile. For lane
// l = 4 * group + quad (group = l / 4, quad = l % 4):
//   Accumulator D of m64nN (s32 or f32), N/2 registers d[0..N/2): register i holds
//       row 16w + group + 8 * ((i / 2) % 2), column 8 * (i / 4) + 2 * quad + (i % 2).
//   A of m64nNk32 with 8-bit elements (e4m3/s8) from registers, 4 x 32-bit a[0..3], the element of
//   lowest k in the lowest byte:
//       a[0]: row 16w + group,     k = 4 * quad + 0..3
//       a[1]: row 16w + group + 8, k = 4 * quad + 0..3
//       a[2]: row 16w + group,     k = 16 + 4 * quad + 0..3
//       a[3]: row 16w + group + 8, k = 16 + 4 * quad + 0..3
// So a row's accumulator registers cover columns {2q, 2q+1, 8+2q, 9+2q} of each 16 columns while
// an A register wants k = {4q..4q+3}: the two layouts differ by a fixed permutation inside each
// group of 16, which the FP8 V quantization applies to V's keys (csrc/fused/quant.cu) so that the
// accumulator values can be packed in their natural order.
//
// Shared-memory operands are K-major (the reduction dimension contiguous), rows of 64 or 128 bytes
// written by TMA with the matching swizzle: the wgmma and TMA swizzles are the same function of the
// shared-memory address (16-byte chunk index XOR address bits 7.., within 512- or 1024-byte
// atoms), so a tile whose base is aligned to the atom is read back exactly as TMA wrote it.
#pragma once

#include <cstdint>

namespace sage {

// Swizzle modes of the descriptor's bits 62..63 (PTX ISA "Matrix Descriptor Format").
enum class WgmmaSwizzle : uint64_t { kNone = 0, k128B = 1, k64B = 2, k32B = 3 };

// Descriptor of a K-major tile starting at shared address `addr` (atom-aligned): 8-row groups of
// `row_bytes`-byte rows lie `sbo_bytes` apart. For swizzled K-major layouts whose K extent fits in
// one swizzle row the leading-byte offset is not used; it is set to 1 (16 bytes). Advancing K by
// 32 bytes inside the row is done by adding 2 (32 >> 4) to the descriptor's start address.
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr, uint32_t sbo_bytes, WgmmaSwizzle swizzle) {
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);             // bits 0..13: start address
  desc |= static_cast<uint64_t>(1) << 16;                            // bits 16..29: leading offset
  desc |= static_cast<uint64_t>((sbo_bytes & 0x3FFFF) >> 4) << 32;   // bits 32..45: stride offset
  desc |= static_cast<uint64_t>(swizzle) << 62;                      // bits 62..63: swizzle
  return desc;                                                       // base offset 0: aligned atoms
}

// Orders this thread's earlier register and shared-memory accesses before the next wgmma reads its
// operands: needed before the first wgmma of a batch whose accumulator or A registers were written.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Wait until at most `Pending` committed wgmma groups of this warpgroup are in flight.
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}

// An empty asm that "redefines" the register: code that reads an accumulator cannot be moved above
// the wgmma_wait that precedes this fence (the compiler sees no other dependency between the two).
__device__ __forceinline__ void fence_operand(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void fence_operand(int32_t& x) { asm volatile("" : "+r"(x)::"memory"); }
__device__ __forceinline__ void fence_operand(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }

template <typename T, int N>
__device__ __forceinline__ void fence_operands(T (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) fence_operand(x[i]);
}

// Per-thread register budget hand-off between warpgroups (all threads of a warpgroup execute it).
template <int Regs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs));
}
template <int Regs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs));
}

// Two values -> two FP8 e4m3 bytes (round to nearest even, saturating to +-448), x0 in the low byte:
// from two floats, or (kF16x2) from the f16x2 held in x0's bits, its low half x0's value.
// cvt.*.e4m3x2 puts its first source (an f16x2's high half) in the upper byte.
template <bool kF16x2>
__device__ __forceinline__ uint16_t e4m3x2_of(float x0, float x1) {
  uint16_t r;
  if constexpr (kF16x2) {
    asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(r) : "r"(__float_as_uint(x0)));
  } else {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;" : "=h"(r) : "f"(x0), "f"(x1));
  }
  return r;
}

// ------------------------------------------------------------------------------------------------
// MMAs. kAccumulate = false computes D = A * B (scale-d false: the old D is not read, so the
// outputs are write-only "=" operands); true computes D = A * B + D.

// Operand lists: SAGE_WG_OPS8(c, d, i) is c(d[i]), ..., c(d[i + 7]) with c a constraint string.
#define SAGE_WG_OPS8(c, d, i) \
  c(d[i]), c(d[i + 1]), c(d[i + 2]), c(d[i + 3]), c(d[i + 4]), c(d[i + 5]), c(d[i + 6]), c(d[i + 7])
#define SAGE_WG_OPS32(c, d) SAGE_WG_OPS8(c, d, 0), SAGE_WG_OPS8(c, d, 8), SAGE_WG_OPS8(c, d, 16), SAGE_WG_OPS8(c, d, 24)
#define SAGE_WG_OPS64(c, d)                                                                            \
  SAGE_WG_OPS32(c, d), SAGE_WG_OPS8(c, d, 32), SAGE_WG_OPS8(c, d, 40), SAGE_WG_OPS8(c, d, 48), \
      SAGE_WG_OPS8(c, d, 56)
#define SAGE_WG_REGS32                                                                  \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "              \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define SAGE_WG_REGS64                                                                  \
  SAGE_WG_REGS32 ", "                                                                   \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "     \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

// S = Q Kᵀ: INT8 x INT8 -> INT32, 64 x 128 x 32 per warpgroup, both operands from shared memory
// (K-major). Exact: |sum| <= 128 * 127^2 per head dim of 128, far below 2^31.
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n128k32_s32_s8(int32_t (&d)[64], uint64_t desc_a, uint64_t desc_b);

// Both specializations: scale-d 0 with write-only accumulator operands (C: "=r"), 1 with read-write
// ones ("+r").
#define SAGE_WGMMA_S32_S8_AS(K, C, SCALE_D)                                                                       \
  template <>                                                                                                     \
  __device__ __forceinline__ void wgmma_m64n128k32_s32_s8<K>(int32_t(&d)[64], uint64_t desc_a, uint64_t desc_b) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                     \
                 "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {" SAGE_WG_REGS64 "}, %64, %65, p;\n}\n"      \
                 : SAGE_WG_OPS64(C, d)                                                                            \
                 : "l"(desc_a), "l"(desc_b), "n"(SCALE_D));                                                       \
  }
SAGE_WGMMA_S32_S8_AS(false, "=r", 0)
SAGE_WGMMA_S32_S8_AS(true, "+r", 1)
#undef SAGE_WGMMA_S32_S8_AS

// O_blk = P V: FP8 e4m3 x e4m3 -> FP32, 64 x N x 32 per warpgroup, P (A) from registers, Vᵀ (B)
// from shared memory (K-major: keys contiguous per channel; FP8 wgmma has no transposed form).
// N = 72 / 136: head dim 64 / 128 and 8 more columns (the row sums, see csrc/sm90).
template <int N, bool kAccumulate>
__device__ __forceinline__ void wgmma_m64nNk32_f32_e4m3(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b);

// Both specializations (scale-d 0 with write-only accumulator operands, 1 with read-write ones) of
// one N: its accumulator is NREG = N / 2 registers listed by OPS / REGS, followed by the A registers
// (A4), the B descriptor (DESC) and the scale-d immediate (PRED), spelled as operand numbers.
#define SAGE_WGMMA_F32_E4M3_AS(N, NREG, K, C, OPS, REGS, A4, DESC, PRED, SCALE_D)                              \
  template <>                                                                                                 \
  __device__ __forceinline__ void wgmma_m64nNk32_f32_e4m3<N, K>(float(&d)[NREG], const uint32_t(&a)[4],        \
                                                                uint64_t desc_b) {                            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                            \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 {" REGS "}, " A4 ", " DESC           \
                 ", p, 1, 1;\n}\n"                                                                             \
                 : OPS(C, d)                                                                                  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(SCALE_D));                     \
  }
#define SAGE_WGMMA_F32_E4M3(N, NREG, OPS, REGS, A4, DESC, PRED)          \
  SAGE_WGMMA_F32_E4M3_AS(N, NREG, false, "=f", OPS, REGS, A4, DESC, PRED, 0) \
  SAGE_WGMMA_F32_E4M3_AS(N, NREG, true, "+f", OPS, REGS, A4, DESC, PRED, 1)

#define SAGE_WG_OPS36(c, d) SAGE_WG_OPS32(c, d), c(d[32]), c(d[33]), c(d[34]), c(d[35])
#define SAGE_WG_OPS68(c, d) SAGE_WG_OPS64(c, d), c(d[64]), c(d[65]), c(d[66]), c(d[67])
#define SAGE_WG_REGS36 SAGE_WG_REGS32 ", %32, %33, %34, %35"
#define SAGE_WG_REGS68 SAGE_WG_REGS64 ", %64, %65, %66, %67"

SAGE_WGMMA_F32_E4M3(72, 36, SAGE_WG_OPS36, SAGE_WG_REGS36, "{%36, %37, %38, %39}", "%40", "%41")
SAGE_WGMMA_F32_E4M3(136, 68, SAGE_WG_OPS68, SAGE_WG_REGS68, "{%68, %69, %70, %71}", "%72", "%73")

#undef SAGE_WGMMA_F32_E4M3
#undef SAGE_WGMMA_F32_E4M3_AS
#undef SAGE_WG_OPS36
#undef SAGE_WG_OPS68
#undef SAGE_WG_REGS36
#undef SAGE_WG_REGS68
#undef SAGE_WG_OPS8
#undef SAGE_WG_OPS32
#undef SAGE_WG_OPS64
#undef SAGE_WG_REGS32
#undef SAGE_WG_REGS64

}  // namespace sage
