// Hopper (sm_90a) attention: INT8 Q·Kᵀ (wgmma m64n128k32 s32.s8.s8), FP8 e4m3 P·V (wgmma
// m64n(D+8)k32 f32.e4m3.e4m3, P from registers), FP32 online softmax with exp2. Reproduces
// sageattention.reference.sage_ref(pv=FP8, block_m=1, block_n=128, rowsum="rounded"): scores = int32 dot *
// (q_scale * k_scale) already in the log2 domain; P = exp2(s - running max) is scaled by 448 and
// rounded to e4m3; each 128-key block's P·V goes into a fresh FP32 accumulator that is then added
// to the running output (promotion: Hopper's FP8 MMA accumulates with about 22 mantissa bits);
// the row sum adds the rounded P (8 rows of ones after Vᵀ's D channels: the P·V wgmma's last 8
// columns are the row sums, so the tensor cores add them up); the end divides by that sum and
// multiplies by V's per-channel scale.
//
// Warp specialization. One CTA = one producer warpgroup and kWgs consumer warpgroups
// (consumer_wgs: 3 at D = 128, 4 at D = 64):
//   warpgroup 0, the producer: its warp 0 draws the tiles, hands them to the consumers and issues
//     every TMA copy (each consumer warpgroup's Q, then K and Vᵀ tiles into a ring of kStages
//     stages); its registers are given back with setmaxnreg.dec (32 per thread).
//   warpgroups 1 .. kWgs, the consumers: 64 query rows each (the wgmma M), so a tile covers 64 kWgs
//     rows (192 / 256) and every K/Vᵀ tile the CTA loads serves all of them. setmaxnreg.inc raises
//     them to what the launch's registers leave: (65536 / threads, in multiples of 8) x threads less
//     the producer's, shared evenly: 160 at D = 128 ((32 + 3 x 160) x 128 = 65536), 112 at D = 64
//     (the launch's 96 x 640 = 61440 hold 32 x 128 + 4 x 112 x 128). One CTA per SM.
//
// Persistent CTAs. The launch has one CTA per SM (at most one per tile); a CTA's first tile is
// blockIdx.x, each later one is drawn from a counter (AttnSm90Args::tile_counter), so CTAs that
// finish early take more tiles and causal tiles of unequal length even out. The producer hands each
// tile to the consumers through a shared-memory slot; the K/Vᵀ ring runs on from tile to tile; each
// consumer warpgroup's Q is a TMA box of its own, reloaded as soon as that warpgroup's last Q·Kᵀ of
// the previous tile has completed (in the order the warpgroups release them), so the next tile's
// first blocks are in flight while the CTA's other warpgroups finish. K's scale of a block travels
// with it through the ring (the producer stores it next to the stage), which keeps the consumers'
// key loop free of a pointer and of spills. Against one tile per CTA, H100, kernel alone, b=4 h=32
// d=128: 6.0% faster at n=1024, 1.4% at 4096, 0.4% at 16384, causal 5.9% / 1.2% / -0.1% at 1024 /
// 4096 / 16384; d=64: 7.9% / 2.4% / -1.0% at 1024 / 4096 / 16384 (bench/NOTES.md). A CTA draws its
// next tile once the current one's blocks are all in the ring (drawn a tile ahead, an SM could hold a
// tile back from SMs that had run out: causal n=4096 3% slower).
//
// The last wave split along the keys (non-causal; AttnSm90Split, Work, merge_parts). The last
// T mod S of T tiles on S SMs run as 2-4 parts over ranges of their key blocks, drawn like tiles;
// each part leaves its rows' float32 output, max and row sum in a workspace, and the tile's last part
// merges them and writes the output. Kernel alone, H100: the diffusion shape (b=1 h=24 n=4608) 8.6%
// faster, b=1 h=8 n=4096 25%, b=2 h=10 n=4096 13%, b=4 h=32 n=4096 1.3% (bench/NOTES.md).
//
// The schedule. Each consumer warpgroup runs its blocks one after the other: Q·Kᵀ, wait, softmax,
// P·V, wait, promotion. Per 128-key block of 128 rows at D = 128 the MMAs are 8.4 M ops, 1024 cycles
// of the SM's 8192 dense 8-bit ops per cycle (1979 TOPS / 132 SMs / 1.83 GHz), and the softmax
// needs 16384 exp2, 1024 cycles of the SM's 16 MUFU lanes, plus ~5 other instructions per score:
// the tensor cores, the MUFU and the issue slots are all near their limit, and the softmax is a
// chain of dependent instructions. With three or four warpgroups on the SM, one warpgroup's MMAs
// run while the others' softmax runs, and each scheduler has three or four warps to pick from. That
// measured faster than two warpgroups that overlap their own MMAs with their softmax (a Q·Kᵀ of
// the next block and the P·V of this one in flight across the softmax: 212 live registers a thread
// at D = 128, so at most two such warpgroups fit), with or without turns between the two: kernel
// alone, H100, 2-3.5% at D = 128 (1.5% slower at the diffusion shape, b=1 h=24 n=4608, whose
// 192-row CTAs fill 4.4 waves of the SMs), 16-20% at D = 64 (bench/NOTES.md).
// Registers of a consumer thread at D = 128: O (64 f32) and the P·V accumulator (68 f32 with the row
// sums) and P (16) while the P·V runs; O and the scores (64) during the softmax; 160 is enough
// because the masked softmax (only the last block needs it) lives in a copy of the step peeled off
// the loop.
//
// Softmax cost per score (non-masked blocks): I2FP (int32 -> f32, exact below 2^24: |dot| <= 128 x
// 128^2 = 2^21; at D = 64 an integer add instead, see softmax), 0.6
// VIMNMX3 for the row max (over the INT32 scores), one FFMA x * (q_scale k_scale) + (log2(448) - m),
// MUFU.EX2 (ex2.approx.ftz; in the non-causal D = 128 kernels 1/8 of them in f16x2 on the FMA and ALU
// pipes instead, exp2_h2 and kH2ExpTiles), half an F2FP pack to e4m3, plus one FFMA per output element
// for the promotion; the row sum costs nothing here (tensor cores). About 430 SASS instructions per thread
// and block at D = 128, 400 at D = 64 (an early version: 796, 925 causal, with a multiply for the
// scale, a subtract, a multiply by 448 and the mask's compare and select on every score). Folding the
// 448 of the FP8 range into the exponent makes exp2 return 448 P directly; the row sum is then
// 448 l, and the end divides by it (the reference divides by l * 448). The extra rounding (one FFMA
// instead of a multiply, a subtract and a multiply) moves the exponent by a few float32 ulps, the
// size of ex2.approx's own error. The max is taken over the raw products and scaled once per row:
// round(x * scale) is monotonic in x for scale >= 0, so this is exactly the reference's max of the
// rounded scores. Masks (-inf) are applied only in the blocks that straddle Nk or the causal
// diagonal (a warpgroup's last block), by a warp-uniform branch.
//
// Pipeline. Per stage: a full barrier for K, one for Vᵀ (so Q·Kᵀ starts before Vᵀ has landed),
// and an empty barrier that every consumer warp arrives on once its P·V wgmma group, the last
// reader of the stage, has completed; a warpgroup that does not read the block (its rows past Nq,
// or causal rows before its keys) waits for the block to land and arrives all the same, which keeps
// the producer at its pace (see the pass-through at the end of the tile loop). The producer
// refills a stage only after its empty barrier completes.
//
// Shared memory (bytes), all tiles K-major and written by TMA with the swizzle the wgmma
// descriptors name, each tile aligned to its 1024-byte swizzle atom, D = 128 (3 consumers) / D = 64
// (4 consumers):
//   Q  kWgs x 64 rows x D                24576 / 16384
//   K  kStages x 128 keys x D            65536 / 32768
//   Vᵀ kStages x (D + 8) rows x 128 keys 69632 / 36864 (the 8 rows of ones written once)
//   barriers and tile slots             200
//   O  kWgs x 64 rows x 2D, the output on its way to the TMA store: 49152 / 32768
//   with alignment: total 209920 / 119808, below the 227 KiB limit.
// Rows are D bytes: D = 128 uses the 128-byte swizzle, D = 64 the 64-byte one (a TMA box row may
// not exceed the swizzle span). Vᵀ rows are 128 keys = 128 bytes: 128-byte swizzle for both D.
//
// Masking. Rows and keys past the tensors' extents arrive zero-filled (TMA), and Vᵀ's keys from Nk
// to n_pad are zeros written by quant_v_fp8, so every tile is finite (0 * NaN would be NaN in
// P·V). Keys past Nk and, for causal attention, keys after the query get P = 0 (exp2(-inf)), only in
// blocks that straddle the end or the diagonal. Causal tiles skip key blocks entirely above the
// diagonal; the CTAs draw the heaviest (last) row blocks of a head first, and a launch's last tiles
// are its shortest (causal_tile).
//
// Vᵀ layout. The FP32 accumulator gives a thread the scores of keys {2q, 2q+1, 8+2q, 9+2q} (+16,
// ...) of a row, while wgmma's 8-bit A fragment wants k = {4q..4q+3}. Rather than shuffling P
// between lanes, quant_v_fp8(permute_keys=True) stores each group of 16 keys of Vᵀ so that
// position 4q + r holds key 8 * (r / 2) + 2q + (r % 2): packing the accumulator values in their
// natural order then multiplies every P element with its own key's V row (sage_wgmma.cuh,
// sageattention.reference.permute_keys_sm90).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "sage_attn_common.cuh"
#include "sage_copy.cuh"
#include "sage_mbarrier.cuh"
#include "sage_pdl.cuh"
#include "sage_tma.cuh"
#include "sage_wgmma.cuh"
#include "sm90/attn.h"

namespace sage {
namespace {

constexpr int kWgThreads = 128;                            // threads per warpgroup
constexpr int kWgRows = 64;                                // wgmma M: query rows per consumer
constexpr int kBlockN = kSm90KeyBlock;                     // 128 keys per step
constexpr int kStages = 4;                                 // K/Vᵀ ring depth (smem budget above)
constexpr int kProducerRegs = 32;                          // setmaxnreg target of the producer
constexpr int kTileSlots = 2;                              // tiles handed from the producer to the consumers
constexpr int kMaxConsumerWgs = 4;
constexpr int kWgmmaK = 32;                                // bytes of K per 8-bit wgmma
[[maybe_unused]] constexpr int kSTiles = kBlockN / 8;      // 16 n8 column tiles of the score accumulator
constexpr int kSRegs = kBlockN / 2;                        // 64 score registers per thread
constexpr int kPSteps = kBlockN / kWgmmaK;                 // 4 P·V wgmmas (k32) per block
constexpr int kSumRows = 8;                                // Vᵀ rows of ones: one 8-row group of the wgmma N
[[maybe_unused]] constexpr uint32_t kE4m3One4 = 0x38383838u;  // four e4m3 1.0
constexpr float kCvtBias = 12582912.0f;                   // 1.5 * 2^23
constexpr int32_t kCvtBiasBits = 0x4B400000;               // its bits; + s: float kCvtBias + s (|s| < 2^22)
constexpr float kLog2Fp8Max = 8.807354922057604f;          // log2(448): exp2(x + this) = 448 exp2(x)
// Named barrier of consumer warpgroup w's output tile: kOutBarrier + w, its 128 threads (0 is
// __syncthreads').
constexpr uint32_t kOutBarrier = 1;
// The output tile of a consumer warpgroup goes out as TMA stores of boxes of 64 rows x 128 bytes (64
// channels of 2 bytes: the 128-byte swizzle's span).
constexpr int kOutBoxBytes = 128;
constexpr int kOutBoxRows = kWgRows;

// Consumer warpgroups per CTA, by head dim: as many as the registers that one key block needs allow
// (see the budget above). D = 128: 3 of 160 registers; D = 64: 4 of 112.
__host__ __device__ constexpr int consumer_wgs(int d) { return d == 64 ? 4 : 3; }

// Float32 values a consumer thread leaves per part of a split tile (merge_parts): its D / 2 output
// values, then its two rows' running maxima and row sums.
__host__ __device__ constexpr int split_values(int d) { return d / 2 + 4; }

// The CTA of a kernel with kWgs consumer warpgroups (64 query rows each) and one producer.
template <int kWgs>
struct Cta {
  static_assert(kWgs >= 2 && kWgs <= kMaxConsumerWgs, "2 to 4 consumer warpgroups");
  static constexpr int kThreads = (1 + kWgs) * kWgThreads;
  static constexpr int kBlockM = kWgs * kWgRows;               // query rows per CTA
  // setmaxnreg target of a consumer: the CTA's registers at launch (65536 / kThreads per thread, in
  // multiples of 8) less the producer's, shared evenly, in multiples of 8: 240 for 2 warpgroups, 160
  // for 3, 112 for 4. (setmaxnreg.inc waits until the CTA's pool has the registers: asking for more
  // than it holds hangs the warpgroup.)
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kConsumerRegs = (kLaunchRegs * (1 + kWgs) - kProducerRegs) / kWgs / 8 * 8;
  static_assert(kProducerRegs + kWgs * kConsumerRegs <= kLaunchRegs * (1 + kWgs), "within the launch's pool");
};

// A tile as the producer hands it to the consumers, decoded by the producer (Work, TileOf): what the
// consumers need at the tile's start, read from shared memory. (Decoded by every consumer warp there,
// with its integer divisions, it was about 250 instructions on each warpgroup's way into the tile;
// the kernels ran 1-3% slower, d=64 causal 7%, bench/NOTES.md.) No consumer reads `part` as a part: they
// decode the tile again for its last key block and the epilogue (see there). It stays because the kernels
// were measured with this layout (without it, or with a field more, ptxas allocates the registers
// differently throughout); the kKeyLens kernels, which split nothing, hand the consumers the keys of the
// tile's batch entry in it.
struct TileTask {
  int work;      // the work item's tile (drawn_tile), -1: no more
  int m0, h, b;  // its first query row, query head and batch (TileOf)
  int hk;        // its K/V head
  int kb0, kb1;  // its key blocks [kb0, kb1) (Work)
  int part;      // Work::slot: a part's slot among the launch's parts, -1 for a whole tile; kKeyLens: keys_of
};

struct Barriers {
  uint64_t q_full[kMaxConsumerWgs];   // a consumer warpgroup's 64 rows of Q have landed
  uint64_t q_empty[kMaxConsumerWgs];  // its last Q·Kᵀ of the tile has completed
  uint64_t k_full[kStages];
  uint64_t v_full[kStages];
  uint64_t empty[kStages];
  uint64_t tile_full[kTileSlots];   // the producer wrote the slot's tile
  uint64_t tile_empty[kTileSlots];  // every consumer warp is done with it (at the tile's end)
  TileTask task[kTileSlots];
  float k_scale[kStages];           // K's scale of the stage's block
  int split_rank[kMaxConsumerWgs];  // a consumer warpgroup's count on its split tile's counter (merge_parts)
};

// Shared-memory layout for head dim (d_pad) D; offsets in bytes from a 1024-aligned base.
template <int D, int kWgs>
struct Smem {
  static constexpr int kAtom = 1024;  // 128-byte swizzle repeats every 8 rows x 128 bytes
  static constexpr int kQWgBytes = kWgRows * D;  // one consumer warpgroup's rows
  static constexpr int kQBytes = kWgs * kQWgBytes;
  static constexpr int kKBytes = kBlockN * D;
  // Each Vᵀ stage holds the D channels TMA loads and kSumRows rows of e4m3 ones after them, written
  // once: the P·V wgmma (N = D + kSumRows) then also returns the row sums of P in its last columns.
  static constexpr int kVLoadBytes = D * kBlockN;
  static constexpr int kVBytes = (D + kSumRows) * kBlockN;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;
  static constexpr int kV = kK + kStages * kKBytes;
  static constexpr int kBar = kV + kStages * kVBytes;
  // Each consumer warpgroup's output tile (64 rows x D channels of 2 bytes) on its way to the TMA
  // store: D / 64 boxes of 64 rows x 128 bytes, 128-byte swizzled.
  static constexpr int kOutBoxes = D * 2 / kOutBoxBytes;
  static constexpr int kOutWgBytes = kOutBoxes * kOutBoxRows * kOutBoxBytes;
  static constexpr int kOut = (kBar + sizeof(Barriers) + kAtom - 1) / kAtom * kAtom;
  // Each consumer warpgroup's copy of V's channel scales for its tile (float32, D of them).
  static constexpr int kVsc = kOut + kWgs * kOutWgBytes;
  static constexpr int kBytes = kVsc + kWgs * D * 4;
  static constexpr int kAlloc = kBytes + kAtom;  // the dynamic base is only 16-byte aligned
  static_assert(kQBytes % kAtom == 0 && kKBytes % kAtom == 0 && kVBytes % kAtom == 0, "tiles keep atom alignment");
  static_assert(kAlloc <= 227 * 1024, "above the sm_90 shared-memory limit per CTA");
  // Q and K rows are D bytes: the swizzle spans one row. Vᵀ rows are 128 keys = 128 bytes.
  static constexpr WgmmaSwizzle kQKSwizzle = D == 128 ? WgmmaSwizzle::k128B : WgmmaSwizzle::k64B;
  static constexpr uint32_t kQKGroupBytes = 8 * D;  // stride between 8-row groups (SBO)
  static constexpr uint32_t kVGroupBytes = 8 * kBlockN;
};

// The shared-memory address of a generic pointer into shared memory, converted where it is used (derived
// from the kernel's own shared base instead, ptxas moved that base out of the key loop's uniform
// registers: 2-10 instructions more a block).
__device__ __forceinline__ uint32_t shared_addr(const void* p) {
  uint32_t a;
  asm volatile("{\n.reg .u64 g;\ncvta.to.shared.u64 g, %1;\ncvt.u32.u64 %0, g;\n}" : "=r"(a) : "l"(p));
  return a;
}

// One MUFU.EX2: exp2f without its range handling (what --use_fast_math gives, spelled out so the
// build flags cannot change it). ftz: results below 2^-126 are 0, far below e4m3's smallest 2^-9.
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 448 P of two scores off the MUFU pipe, as an f16x2 (lo: a0): the FFMA's arguments biased by
// kH2ExpBias, then in f16x2: relu (below 2^-kH2ExpBias e4m3 rounds to 0 anyway), j = round(a) by adding
// 1536 (1.5 * 2^10: its mantissa's low bits hold j), 2^f (|f| <= 1/2) by a degree-2 polynomial scaled by
// 2^-kH2ExpBias, and j added to the exponent field. Eight instructions a pair on the FMA and ALU pipes
// where the f32 path takes two MUFU.EX2.
constexpr float kH2ExpBias = 11.0f;
__device__ __forceinline__ uint32_t exp2_h2(float a0, float a1) {
  uint32_t h, r, t, f, q;
  asm("cvt.rn.relu.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(a1), "f"(a0));
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(h), "r"(0x66006600u));
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(t) : "r"(r), "r"(0x66006600u));
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(f) : "r"(h), "r"(t));
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(q) : "r"(f), "r"(0x07A107A1u), "r"(0x0DA10DA1u));
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(q) : "r"(q), "r"(f), "r"(0x10001000u));
  // r << 10 puts each lane's j in its exponent field, and the low lane's 0x6600 << 10 (1536's bits)
  // adds 0x198 to the high lane: taken off again (the lanes never carry: j <= 20).
  return q + (r << 10) - 0x01980000u;
}

// The column tiles (bit c: keys 8c..8c+7 of a block) whose unmasked scores take exp2_h2: 8 of a
// thread's 64 exp2 a block off the MUFU pipe, for 27 more instructions in the key loop (445 against
// 418). Which tiles decides ptxas's schedule of the loop more than the count does: of 33 sets of one to
// four tiles, measured on two H200s in the call harness (bench/NOTES.md, run ab), tiles 7 and 11 in the
// non-causal head-dim-128 kernels ran the attention 1.3-2.7% faster and the flushed call 0.7-2.0%
// faster at b=4 h=32 n=1024, 4096 and 16384 and b=1 h=24 n=4608; most other sets ran slower than
// MUFU.EX2 alone, by up to 2.5%.
// The causal and head-dim-64 kernels keep MUFU.EX2 for every score.
template <int D, bool kCausal>
constexpr uint32_t kH2ExpTiles = D == 128 && !kCausal ? 0x0880u : 0u;

__device__ __forceinline__ float max2(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ int32_t max2(int32_t a, int32_t b) { return max(a, b); }

template <typename T>
__device__ __forceinline__ T quad_max(T x) {
  x = max2(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return max2(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// Max of row i's scores (i = 0: row `group`, 1: row group + 8) over the quad, in the accumulator
// layout, in kChains (2 or 4) partial maxima: chain k takes element k % 2 of every (kChains / 2)-th
// column tile from tile k / 2 on. The values are the same either way; the chains only change the
// dependencies that ptxas schedules around (see softmax).
template <int kChains, typename T>
__device__ __forceinline__ T row_max(const T (&v)[kSRegs], int i) {
  static_assert(kChains == 2 || kChains == 4, "2 or 4 chains");
  constexpr int kStep = kChains / 2;  // column tiles per round
  T mx[kChains];
#pragma unroll
  for (int k = 0; k < kChains; ++k) mx[k] = v[4 * (k / 2) + 2 * i + k % 2];
#pragma unroll
  for (int c = kStep; c < kSTiles; c += kStep) {
#pragma unroll
    for (int k = 0; k < kChains; ++k) mx[k] = max2(mx[k], v[4 * (c + k / 2) + 2 * i + k % 2]);
  }
  if constexpr (kChains == 4) {
    return quad_max(max2(max2(mx[0], mx[1]), max2(mx[2], mx[3])));
  } else {
    return quad_max(max2(mx[0], mx[1]));
  }
}


// S = Q Kᵀ of one block in INT32: D / 32 wgmmas, K advancing 32 bytes along the (swizzled) rows.
template <int D>
__device__ __forceinline__ void issue_qk(int32_t (&s)[kSRegs], uint64_t desc_q, uint64_t desc_k) {
  wgmma_m64n128k32_s32_s8<false>(s, desc_q, desc_k);
#pragma unroll
  for (int kk = 1; kk < D / kWgmmaK; ++kk) wgmma_m64n128k32_s32_s8<true>(s, desc_q + 2 * kk, desc_k + 2 * kk);
}

// O_blk = P Vᵀᵀ of one block into a fresh FP32 accumulator (the promotion step).
// Its N = D + kSumRows: the last kSumRows columns multiply P with Vᵀ's rows of ones, so each of them
// is the block's row sum of 448 P as e4m3, added up by the tensor cores (sage_ref(rowsum="rounded")).
template <int D>
__device__ __forceinline__ void issue_pv(float (&pv)[(D + kSumRows) / 2], const uint32_t (&pa)[kPSteps][4],
                                         uint64_t desc_v) {
  constexpr int kN = D + kSumRows;
  wgmma_m64nNk32_f32_e4m3<kN, false>(pv, pa[0], desc_v);
#pragma unroll
  for (int kk = 1; kk < kPSteps; ++kk) wgmma_m64nNk32_f32_e4m3<kN, true>(pv, pa[kk], desc_v + 2 * kk);
}

// Online softmax of one 128-key block for this thread's two rows (i = 0: row `group`, 1: row
// group + 8 of its warp's 16). In: the INT32 scores, scale[i] = q_scale * k_scale of the block (log2
// domain). kMask: key 8c + 2 quad + (e & 1) of column tile c is visible iff 8c + (e & 1) <= limit[i]
// (limit = last visible key - n0 - 2 quad). Updates m_run, sets alpha[i] = exp2(old max - new max)
// for the output and the row sum, and x = 448 P in the accumulator layout. (The row sum comes from
// the P·V wgmma, see issue_pv.) kMaxChains: row_max's chains. ptxas schedules the whole key loop
// around them; two measured faster in the causal D = 128 kernels (1-2% at n = 2k ... 8k), four in
// the others (two: 1% slower non-causal; bench/NOTES.md, run n). kH2, unmasked: the column tiles whose
// pairs take exp2_h2 (kH2ExpTiles); x[j] then holds the pair's f16x2 bits and x[j + 1] 0 (unread), and
// pack_p<kH2> packs them.
template <bool kMask, bool kBiasCvt, int kMaxChains, uint32_t kH2 = 0>
__device__ __forceinline__ void softmax(const int32_t (&s)[kSRegs], const float (&scale)[2], const int (&limit)[2],
                                        float (&m_run)[2], float (&alpha)[2], float (&x)[kSRegs]) {
  float shift[2];  // log2(448) - the new max
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    // Row max over the raw products. Unmasked, over the INT32 scores themselves (the conversion is
    // exact and monotonic, so it is the same value): it need not wait for the conversions, and ptxas
    // fuses the integer maxima into 3-input VIMNMX3 (38 instructions instead of 68 FMNMX; measured
    // +4% at n=16384, bench/NOTES.md).
    float m_raw;
    if constexpr (!kMask) {
      m_raw = static_cast<float>(row_max<kMaxChains>(s, i));
    } else {
#pragma unroll
      for (int c = 0; c < kSTiles; ++c) {
#pragma unroll
        for (int e = 2 * i; e < 2 * i + 2; ++e) {
          const int j = 4 * c + e;
          x[j] = 8 * c + (e & 1) > limit[i] ? neg_inf() : static_cast<float>(s[j]);  // exact: |s| <= 2^21
        }
      }
      m_raw = row_max<kMaxChains>(x, i);
    }
    // Scaled once: max_j round(x_j * scale) = round(max_j x_j * scale) for scale >= 0. A row with
    // every key masked has m_raw = -inf, and -inf * 0 = NaN when its scale is 0: fmaxf drops it.
    const float m_new = fmaxf(m_run[i], m_raw * scale[i]);
    const float m_safe = m_new == neg_inf() ? 0.0f : m_new;  // a row that has seen no key yet
    alpha[i] = ex2_approx(m_run[i] - m_safe);
    m_run[i] = m_new;
    shift[i] = kLog2Fp8Max - m_safe;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    // kBiasCvt, unmasked: the score as float by an integer add, v = 1.5 * 2^23 + s exactly (|s| <=
    // 2^21 < 2^22), the bias taken off by the FFMA's addend (one more rounding, at most 0.75 * scale:
    // under one unit of the INT8 product).
    const float addend = kBiasCvt && !kMask ? fmaf(-kCvtBias, scale[i], shift[i]) : shift[i];
#pragma unroll
    for (int c = 0; c < kSTiles; ++c) {
      if constexpr (!kMask && kH2 != 0) {
        if ((kH2 >> c) & 1) {
          const int j = 4 * c + 2 * i;
          const float add_h2 = addend + kH2ExpBias;
          const float v0 = kBiasCvt ? __int_as_float(s[j] + kCvtBiasBits) : static_cast<float>(s[j]);
          const float v1 = kBiasCvt ? __int_as_float(s[j + 1] + kCvtBiasBits) : static_cast<float>(s[j + 1]);
          x[j] = __uint_as_float(exp2_h2(fmaf(v0, scale[i], add_h2), fmaf(v1, scale[i], add_h2)));
          x[j + 1] = 0.0f;  // unread; without it ptxas schedules the kernel otherwise
          continue;
        }
      }
#pragma unroll
      for (int e = 2 * i; e < 2 * i + 2; ++e) {
        const int j = 4 * c + e;
        const float v = kMask      ? x[j]
                        : kBiasCvt ? __int_as_float(s[j] + kCvtBiasBits)
                                   : static_cast<float>(s[j]);  // exact: |s| <= 2^21
        float arg = fmaf(v, scale[i], addend);
        // Masked again after the FFMA: -inf * scale is NaN when the scale is 0 (an all-zero row of
        // Q or block of K), and such a key must still get P = 0.
        if (kMask && 8 * c + (e & 1) > limit[i]) arg = neg_inf();
        x[j] = ex2_approx(arg);  // 448 P
      }
    }
  }
}

// 448 P in e4m3, packed in the accumulator's order (Vᵀ's keys are permuted to match): for k step kk
// (keys 32kk..32kk+31) a[0]/a[2] take row `group`'s values of column tiles 4kk, 4kk+1 / 4kk+2,
// 4kk+3, a[1]/a[3] those of row group + 8. The column tiles in kH2 hold exp2_h2's f16x2 in their pair's
// first float (softmax) and are converted from f16x2.
template <uint32_t kH2 = 0>
__device__ __forceinline__ void pack_p(const float (&x)[kSRegs], uint32_t (&pa)[kPSteps][4]) {
#pragma unroll
  for (int kk = 0; kk < kPSteps; ++kk) {
    const float* y = x + 16 * kk;
    const auto half = [&](int off, int tile) -> uint16_t {
      return ((kH2 >> tile) & 1) ? e4m3x2_of<true>(y[off], y[off + 1]) : e4m3x2_of<false>(y[off], y[off + 1]);
    };
    const auto join = [](uint16_t lo, uint16_t hi) {
      uint32_t r;
      asm("mov.b32 %0, {%1, %2};" : "=r"(r) : "h"(lo), "h"(hi));
      return r;
    };
    pa[kk][0] = join(half(0, 4 * kk), half(4, 4 * kk + 1));
    pa[kk][1] = join(half(2, 4 * kk), half(6, 4 * kk + 1));
    pa[kk][2] = join(half(8, 4 * kk + 2), half(12, 4 * kk + 3));
    pa[kk][3] = join(half(10, 4 * kk + 2), half(14, 4 * kk + 3));
  }
}

// The SM's id and the global nanosecond timer, for the timestamps below (compiled only with them).
#if defined(SAGE_SM90_TRACE) || defined(SAGE_SM90_CTA_TIMES)
__device__ __forceinline__ long long sm_id() {
  unsigned r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r;
}
__device__ __forceinline__ long long global_ns() {
  long long r;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(r));
  return r;
}
#endif

// Phase timestamps for bench/trace_sm90.cu, compiled in only with SAGE_SM90_TRACE defined: thread 0 of
// each consumer warpgroup of the first kTraceCtas CTAs writes clock64() at the events of every step.
#ifdef SAGE_SM90_TRACE
constexpr int kTraceCtas = 2, kTraceBlocks = 64, kTraceEvents = 7;
__device__ long long g_sm90_trace[kTraceCtas][kMaxConsumerWgs][kTraceBlocks][kTraceEvents];
// Per CTA and consumer warpgroup: clock64 at entry, at the loop, at the end; globaltimer at entry, at the end.
__device__ long long g_sm90_trace_cta[kTraceCtas][kMaxConsumerWgs][5];
#define SAGE_TRACE(blk, ev)                                                                              \
  do {                                                                                                   \
    if (trace_on && (blk) < kTraceBlocks) g_sm90_trace[blockIdx.x][cw][(blk)][(ev)] = clock64();          \
  } while (0)
#define SAGE_TRACE_CTA(ev, value)                                                                        \
  do {                                                                                                   \
    if (trace_on) g_sm90_trace_cta[blockIdx.x][cw][(ev)] = (value);                                       \
  } while (0)
#endif
// Per-CTA timeline for bench/trace_sm90.cu (SAGE_SM90_CTA_TIMES; the step loop stays as built for the
// wheel): the SM, globaltimer at entry and exit, clock64 at entry, when Q has landed, after the last
// promotion, and at the exit of the first and of the last consumer warpgroup.
#ifdef SAGE_SM90_CTA_TIMES
constexpr int kCtaTimesMax = 1 << 16, kCtaTimeFields = 8;
__device__ long long g_sm90_cta_times[kCtaTimesMax][kCtaTimeFields];
#define SAGE_CTA_TIME(tile, field, value)                                                                \
  do {                                                                                                   \
    if ((tile) < kCtaTimesMax) g_sm90_cta_times[(tile)][(field)] = (value);                               \
  } while (0)
#else
#define SAGE_CTA_TIME(tile, field, value) \
  do {                                    \
  } while (0)
#endif
#ifndef SAGE_SM90_TRACE
#define SAGE_TRACE(blk, ev) \
  do {                      \
  } while (0)
#define SAGE_TRACE_CTA(ev, value) \
  do {                            \
  } while (0)
#endif

// The tiles of a launch: 64 kWgs query rows of one (batch, query head), numbered head by head (row
// blocks fastest). Causal: each head's heaviest (last) row blocks first. The CTAs draw causal tiles in
// another order (causal_tile), so that the last ones drawn are short.
template <int kBlockM, bool kCausal>
struct TileOf {
  int block_m, h, b;
  __host__ __device__ __forceinline__ TileOf(int tile, int blocks_m, int heads) {
    const int x = tile % blocks_m, rest = tile / blocks_m;
    block_m = kCausal ? blocks_m - 1 - x : x;
    h = rest % heads;
    b = rest / heads;
  }
  __host__ __device__ __forceinline__ int m0() const { return block_m * kBlockM; }
};

// The tile of causal work item `item`, in the order the CTAs draw them: the tiles of the last
// causal_tail_heads (b, h) heads (about kCausalTailWaves waves of the launch's CTAs) row block by row
// block, the heaviest of every one of those heads first; the heads before them head by head, as
// TileOf numbers them. The CTAs that draw the launch's last tiles then draw its shortest. (Drawn head
// by head throughout, the last heads' long tiles came last: at b=4 h=32 n=4096 the SMs idled 30 us
// on average at the end, 9.5 us with this order; kernel alone, H100, 4.4% faster there, 7.6% at
// n=1024, 0.6% at 16384, bench/NOTES.md. Drawn row block by row block throughout, the SMs start and
// end their tiles together, their Q and first blocks load at once, and the kernel was 3-4% slower.)
// The producer hands the consumers the tile, which they decode as it is.
constexpr int kCausalTailWaves = 2;
__host__ __device__ __forceinline__ int causal_tile(const AttnSm90Args& p, int item, int blocks_m) {
  if (item < p.causal_tail_first) return item;
  const int r = item - p.causal_tail_first, x = r / p.causal_tail_heads;
  return (p.causal_tail_first / blocks_m + (r - x * p.causal_tail_heads)) * blocks_m + x;
}

// The tile of non-causal work item `item`, in the order the CTAs draw them: with light_heads > 0 (see
// plan_tile_order), every row block but the last of every head, head by head, then every head's light
// last row block. The CTAs that draw the launch's last tiles then draw its shortest, and the SMs leave
// the kernel closer together. The producer hands the consumers the tile, which they decode as it is.
__host__ __device__ __forceinline__ int light_last_tile(const AttnSm90Args& p, int item, int blocks_m) {
  const int per = blocks_m - 1, light0 = p.light_heads * per;  // from light0 on: the light row blocks
  if (p.light_heads == 0 || item >= light0 + p.light_heads) return item;
  if (item >= light0) return (item - light0) * blocks_m + per;
  const int h = item / per;
  return h * blocks_m + (item - h * per);
}

// The tile of work item `item` (below the launch's item count), in the order the CTAs draw them.
template <bool kCausal>
__host__ __device__ __forceinline__ int drawn_tile(const AttnSm90Args& p, int item, int blocks_m) {
  return kCausal ? causal_tile(p, item, blocks_m) : light_last_tile(p, item, blocks_m);
}

// Key blocks consumer warpgroup w (rows m0 + 64 w .. + 63) needs: causal (top-left), up to its last
// row's keys; every block before its last one ends before key m0 + 64 w (a multiple of 64), so each
// of them holds a visible key for every row of the warpgroup and only its last block needs the mask.
template <bool kCausal>
__device__ __forceinline__ int wg_blocks(int m0, int w, int nk) {
  return ((kCausal ? min(nk, m0 + (w + 1) * kWgRows) : nk) + kBlockN - 1) / kBlockN;
}

// The keys batch entry b attends to (AttnSm90Args::kv_len; nk without it).
// kKeyLens: the kernels that take AttnSm90Args::kv_len (a kernel of their own: in the others, the keys
// of a batch entry read from memory instead of a parameter cost registers around the key loop, which
// then spilled). The producer reads them and hands them to the consumers in the tile's slot. A tile runs through one key block at least, so that a batch entry without keys
// runs one block with every key masked, which gives its rows 0 and an LSE of -inf. (TileTask::part)
template <bool kKeyLens>
__device__ __forceinline__ int keys_of(const AttnSm90Args& p, int b) { return kKeyLens ? __ldg(p.kv_len + b) : p.nk; }
template <bool kKeyLens>
__device__ __forceinline__ int loop_keys(int keys) { return kKeyLens ? max(keys, 1) : keys; }

// A work item the CTAs draw: a whole tile, or one part of a split tile (AttnSm90Split), with the key
// blocks it covers. Items below `first` are the tiles of the same index; from `first` on, item first +
// j is part j % parts of tile first + j / parts, its blocks [part * blocks / parts, (part + 1) * blocks
// / parts) (the launch's parts never exceed its key blocks, so none is empty).
struct Work {
  int tile;      // TileOf's index
  int kb0, kb1;  // key blocks [kb0, kb1); causal tiles (never split) take their warpgroups' own ends
  int slot;      // a part's slot among the launch's parts, j above; -1 for a whole tile
  template <bool kCausal>
  static __host__ __device__ __forceinline__ Work of(const AttnSm90Args& p, int item) {
    // Causal launches split nothing (the launcher checks): their items are their tiles, whose key
    // blocks wg_blocks bounds.
    constexpr int kAll = 1 << 30;
    if (kCausal) return Work(item, item + 1, 1, kAll);
    return Work(item, p.split_first, p.split_parts, (p.nk + kBlockN - 1) / kBlockN);
  }
  __host__ __device__ __forceinline__ Work(int item, int first, int parts, int blocks) {
    if (item < first) {
      tile = item;
      kb0 = 0;
      kb1 = blocks;
      slot = -1;
    } else {
      const int j = item - first, part = j % parts;
      tile = first + j / parts;
      kb0 = part * blocks / parts;
      kb1 = (part + 1) * blocks / parts;
      slot = j;
    }
  }
};

// A part of a split tile (Work::slot >= 0), once its last block is in: stores this thread's share of
// its warpgroup's rows (o, the running max and the row sum, float32) in the part's slot of the
// workspace and counts the part on its tile's counter for this warpgroup. The warpgroup that counts
// last merges the tile's parts, in part order (the same bits whichever part ends last), into o, m_run
// and l_run, and returns true; the others return false. The workspace: [slot][consumer warpgroup]
// [value][thread], so that a warp's stores and loads of a value are 128 contiguous bytes.
template <int D, int kWgs>
__device__ __forceinline__ bool merge_parts(const AttnSm90Args& p, int slot, int cw, int t, int* rank,
                                            float (&o)[D / 2], float (&m_run)[2], float (&l_run)[2]) {
  constexpr int kVals = split_values(D);  // o, then m_run[0..1], then l_run[0..1]
  constexpr int64_t kSlotFloats = int64_t{kWgs} * kVals * kWgThreads;
  const int parts = p.split_parts, part = slot % parts;
  const float* const first = p.split_partials + (slot - part) * kSlotFloats + cw * kVals * kWgThreads + t;
  float* const mine = p.split_partials + slot * kSlotFloats + cw * kVals * kWgThreads + t;
#pragma unroll
  for (int i = 0; i < D / 2; ++i) mine[i * kWgThreads] = o[i];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    mine[(D / 2 + i) * kWgThreads] = m_run[i];
    mine[(D / 2 + 2 + i) * kWgThreads] = l_run[i];
  }
  __threadfence();  // this thread's stores, before the count that publishes them
  named_barrier_sync(kOutBarrier + cw, kWgThreads);
  if (t == 0) {  // fences in the counting thread too: release before the count, acquire after it
    __threadfence();
    *rank = atomicAdd(p.tile_counter + 1 + (slot / parts) * kWgs + cw, 1);
    __threadfence();
  }
  named_barrier_sync(kOutBarrier + cw, kWgThreads);
  // Broadcast from lane 0 (as the tile index): ptxas then knows the branch to be warp-uniform, and the
  // key loop keeps its uniform registers (read by every thread, the key loop spilled: 475 instructions
  // a block instead of 418).
  if (__shfl_sync(0xffffffffu, *static_cast<volatile int*>(rank), 0) != parts - 1) return false;
  __threadfence();  // the other parts' stores, published by their counts, before the loads below
  float m_all[2] = {neg_inf(), neg_inf()};
  for (int j = 0; j < parts; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) m_all[i] = fmaxf(m_all[i], __ldcg(first + j * kSlotFloats + (D / 2 + i) * kWgThreads));
  }
  float m_safe[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    m_safe[i] = m_all[i] == neg_inf() ? 0.0f : m_all[i];
    m_run[i] = m_all[i];
    l_run[i] = 0.0f;
  }
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  for (int j = 0; j < parts; ++j) {
    const float* src = first + j * kSlotFloats;
    float f[2];  // exp2(the part's max - the tile's): its rows' weight
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      f[i] = ex2_approx(__ldcg(src + (D / 2 + i) * kWgThreads) - m_safe[i]);
      l_run[i] = fmaf(__ldcg(src + (D / 2 + 2 + i) * kWgThreads), f[i], l_run[i]);
    }
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = fmaf(__ldcg(src + i * kWgThreads), f[(i / 2) % 2], o[i]);
  }
  return true;
}

template <int D, bool kCausal, typename OutT, bool kKeyLens>
__global__ void __launch_bounds__(Cta<consumer_wgs(D)>::kThreads, 1)
    attn_int8_fp8_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                              const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o,
                              const AttnSm90Args p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kWgs = consumer_wgs(D);
  using C = Cta<kWgs>;
  using L = Smem<D, kWgs>;
  using Tile = TileOf<C::kBlockM, kCausal>;
  constexpr int kOTiles = D / 8;  // n8 column tiles of the output accumulator
  constexpr int kPvRegs = (D + kSumRows) / 2;
  // Scores to float by an integer add (see softmax) at D = 64, where the softmax bounds the step
  // (non-causal 4-7% faster than I2FP, causal within 1.5%); at D = 128 the two measure the same, and
  // the kernels keep I2FP (bench/NOTES.md).
  constexpr bool kBiasCvt = D == 64;
  // The tile decoded again for the last block and the epilogue under that block's Q·Kᵀ at D = 128 (its
  // divisions then overlap the wgmma: 0.4-0.9% off the kernels at n <= 2048 and causal n = 4096, the
  // same elsewhere); at D = 64 before the block, as ptxas scheduled the non-causal D = 64 key loop
  // differently with the former and it ran 1.6% slower (bench/NOTES.md).
  constexpr bool kDecodeUnderQk = D == 128;
  // The softmax's row maxima in two chains in the causal D = 128 kernels, four elsewhere (see softmax).
  constexpr int kMaxChains = kCausal && D == 128 ? 2 : 4;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + L::kAtom - 1) &
                                             ~static_cast<uintptr_t>(L::kAtom - 1));
  Barriers& bar = *reinterpret_cast<Barriers*>(smem + L::kBar);
  const int blocks_m = (p.nq + C::kBlockM - 1) / C::kBlockM;
  // The work items: whole tiles, then the parts of the split ones (the launcher sets first = tiles and
  // parts = 1 when none is split; causal launches split none).
  const int tiles = blocks_m * p.heads_q * p.batch;
  const int items = kCausal ? tiles : static_cast<int>(sm90_work_items(tiles, p.split_first, p.split_parts));
  // Broadcast from lane 0, so that ptxas knows the warpgroup index is warp-uniform: the descriptors
  // derived from it then stay in uniform registers, and the loop top issues the wgmmas without
  // recomputing them and moving them over (R2UR) every step (20 instructions fewer per block when
  // measured, bench/NOTES.md).
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / kWgThreads), 0);

  if (threadIdx.x == 0) {
    for (int w = 0; w < kWgs; ++w) {
      mbar_init(&bar.q_full[w], 1);
      mbar_init(&bar.q_empty[w], kWgThreads / 32);
    }
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&bar.k_full[s], 1);
      mbar_init(&bar.v_full[s], 1);
      mbar_init(&bar.empty[s], kWgs * kWgThreads / 32);  // every consumer warp
    }
    for (int s = 0; s < kTileSlots; ++s) {
      mbar_init(&bar.tile_full[s], 1);
      mbar_init(&bar.tile_empty[s], kWgs * kWgThreads / 32);
    }
    mbar_fence_init();
    tma_prefetch_map(&tm_q);  // the maps are kernel parameters, not the previous kernel's results
    tma_prefetch_map(&tm_k);
    tma_prefetch_map(&tm_v);
    tma_prefetch_map(&tm_o);
  }
  {
    // The ones rows of every Vᵀ stage (TMA never writes them), visible to the wgmma (async proxy).
    constexpr int kChunks = kSumRows * kBlockN / 16;  // 16-byte stores per stage
    for (int i = threadIdx.x; i < kStages * kChunks; i += C::kThreads) {
      const int stage = i / kChunks, chunk = i % kChunks;
      *reinterpret_cast<uint4*>(smem + L::kV + stage * L::kVBytes + L::kVLoadBytes + chunk * 16) =
          make_uint4(kE4m3One4, kE4m3One4, kE4m3One4, kE4m3One4);
    }
    fence_proxy_async_shared();
  }
  __syncthreads();
  // Up to here nothing touched global memory: the kernel before this one in the stream may still be
  // running (programmatic launch, see launch()). From here on its results are complete and visible.
  grid_dependency_wait();

  if (wg == 0) {
    // ---------------------------------------------------------------------------------- producer
    // Draws the CTA's tiles (its first is blockIdx.x, each later one from the launch's counter,
    // drawn once the tile before has all its blocks in the ring), hands each to the consumers through
    // a tile slot, loads each consumer warpgroup's 64 rows of Q once that warpgroup has released the
    // previous tile's, and streams the tile's K and Vᵀ blocks through the ring, which runs on from tile
    // to tile.
    setmaxnreg_dec<kProducerRegs>();
    // Warp 0 runs the loop, every lane alike (so the values stay warp-uniform, in uniform registers:
    // 32 registers a thread would not hold them); lane 0 alone arrives and issues the copies.
    if (threadIdx.x < 32) {
      const bool leader = threadIdx.x == 0;
      const auto draw = [&]() {  // the next tile from the launch's counter
        int drawn = 0;
        if (leader) drawn = atomicAdd(p.tile_counter, 1);
        return static_cast<int>(gridDim.x) + __shfl_sync(0xffffffffu, drawn, 0);
      };
      int tile = blockIdx.x;
      uint32_t q_loaded = 0, q_parity = 0;  // per consumer warpgroup: a Q tile loaded before; its parity
      int pos = 0;                          // ring position: stage pos % kStages, round pos / kStages
      for (int it = 0;; ++it) {
        const int slot = it % kTileSlots;
        if (it >= kTileSlots) mbar_wait(&bar.tile_empty[slot], ((it / kTileSlots) - 1) & 1);
        if (tile >= items) {
          if (leader) {
            bar.task[slot].work = -1;
            mbar_arrive(&bar.tile_full[slot]);
          }
          break;
        }
        // The slot holds the item's tile (causal_tile, light_last_tile), decoded for the consumers.
        const int work = drawn_tile<kCausal>(p, tile, blocks_m);
        const Work wk = Work::of<kCausal>(p, work);
        const Tile tl(wk.tile, blocks_m, p.heads_q);
        const int m0 = tl.m0(), hk = tl.h / (p.heads_q / p.heads_kv), keys = keys_of<kKeyLens>(p, tl.b);
        if (leader) {
          TileTask& task = bar.task[slot];
          task.work = work;
          task.m0 = m0;
          task.h = tl.h;
          task.b = tl.b;
          task.hk = hk;
          task.kb0 = wk.kb0;
          task.kb1 = wk.kb1;
          task.part = kKeyLens ? keys : wk.slot;
          mbar_arrive(&bar.tile_full[slot]);  // release: the consumers' wait orders the slot's reads after it
        }
        const float* ks_base = p.k_scale + tl.b * p.k_scale_strides.b + hk * p.k_scale_strides.h;
        // The consumer warpgroups that hold a row below Nq; the others skip the tile.
        const int active_wgs = min(kWgs, (p.nq - m0 + kWgRows - 1) / kWgRows);
        const int cta_end = min(wg_blocks<kCausal>(m0, active_wgs - 1, loop_keys<kKeyLens>(keys)), wk.kb1);
        int blk = wk.kb0;
        // Blocks blk .. upto - 1 of the tile into the ring.
        const auto fill = [&](int upto) {
          for (; blk < upto; ++blk, ++pos) {
            const int stage = pos % kStages;
            // Round r of a stage reuses it: wait until the consumers released round r - 1.
            if (pos >= kStages) mbar_wait(&bar.empty[stage], ((pos / kStages) - 1) & 1);
            if (leader) {
              // K's scale of the block goes with it: stored before the arrival (a release), read by
              // the consumers after their wait on the same phase.
              bar.k_scale[stage] = __ldg(ks_base + blk * p.k_scale_strides.n);
              mbar_arrive_expect_tx(&bar.k_full[stage], L::kKBytes);
              tma_load_4d(smem + L::kK + stage * L::kKBytes, &tm_k, &bar.k_full[stage], 0, blk * kBlockN, hk, tl.b);
              mbar_arrive_expect_tx(&bar.v_full[stage], L::kVLoadBytes);
              tma_load_4d(smem + L::kV + stage * L::kVBytes, &tm_v, &bar.v_full[stage], blk * kBlockN, 0, hk, tl.b);
            }
          }
        };
        // Each warpgroup's Q as soon as it has released the previous tile's (its last Q·Kᵀ there), in
        // the order they release them (which warpgroup runs ahead is not fixed). The first kStages
        // blocks go in after the first Q: they wait only for stages of earlier tiles, which the
        // consumers release without this tile's Q.
        uint32_t want = (1u << active_wgs) - 1;  // warpgroups whose Q is still to load
        bool first = true;
        while (want != 0) {
          for (int w = 0; w < kWgs; ++w) {
            if (!(want & (1u << w))) continue;
            if (q_loaded & (1u << w)) {
              const bool ready = mbar_try_wait(&bar.q_empty[w], ((q_parity >> w) & 1) ^ 1);
              if (!__shfl_sync(0xffffffffu, ready, 0)) continue;
            }
            want &= ~(1u << w);
            q_loaded |= 1u << w;
            q_parity ^= 1u << w;
            if (leader) {
              mbar_arrive_expect_tx(&bar.q_full[w], L::kQWgBytes);
              tma_load_4d(smem + L::kQ + w * L::kQWgBytes, &tm_q, &bar.q_full[w], 0, m0 + w * kWgRows, tl.h, tl.b);
            }
            if (first) fill(min(cta_end, wk.kb0 + kStages));
            first = false;
          }
        }
        fill(cta_end);
        // The next item, drawn once this one's blocks are all in the ring (about kStages blocks before
        // its end), and its Q into L2 while they run. Drawn a whole item ahead instead, an SM held an
        // item back from the SMs that ran out first: the SMs left the kernel about a tile apart (idle
        // tail 28 against 19 us per SM at b=4 h=32 n=4096; causal n=4096 3% slower, bench/NOTES.md).
        const int next = draw();
        if (leader && next < items) {
          const int next_tile = drawn_tile<kCausal>(p, next, blocks_m);
          const Tile nt(Work::of<kCausal>(p, next_tile).tile, blocks_m, p.heads_q);
          for (int w = 0; w < kWgs && nt.m0() + w * kWgRows < p.nq; ++w) {
            tma_prefetch_l2_4d(&tm_q, 0, nt.m0() + w * kWgRows, nt.h, nt.b);
          }
        }
        tile = next;
      }
    }
    return;
  }

  // ------------------------------------------------------------------------------------ consumers
  setmaxnreg_inc<C::kConsumerRegs>();
  const int cw = wg - 1;  // consumer warpgroup: rows m0 + 64 * cw .. of each tile
  const int t = threadIdx.x % kWgThreads;
  const int warp = t / 32, lane = t % 32;
  const int group = lane / 4, quad = lane % 4;
#ifdef SAGE_SM90_TRACE
  const long long trace_entry = clock64();
  bool trace_on = t == 0 && blockIdx.x < kTraceCtas;  // the CTA's first tile
  SAGE_TRACE_CTA(0, trace_entry);
  SAGE_TRACE_CTA(3, global_ns());
#endif

  const uint32_t smem_u32 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint64_t desc_q = wgmma_desc(smem_u32 + L::kQ + cw * L::kQWgBytes, L::kQKGroupBytes, L::kQKSwizzle);
  // A descriptor's low 14 bits are the address / 16, and shared addresses stay below 2^18 (228 KiB):
  // moving a descriptor to another stage is an add, with no carry out of the field.
  const uint64_t desc_k0 = wgmma_desc(smem_u32 + L::kK, L::kQKGroupBytes, L::kQKSwizzle);
  const uint64_t desc_v0 = wgmma_desc(smem_u32 + L::kV, L::kVGroupBytes, WgmmaSwizzle::k128B);
  const auto desc_k = [&](int stage) { return desc_k0 + static_cast<uint64_t>(stage * (L::kKBytes >> 4)); };
  const auto desc_v = [&](int stage) { return desc_v0 + static_cast<uint64_t>(stage * (L::kVBytes >> 4)); };
  uint8_t* out_tile = smem + L::kOut + cw * L::kOutWgBytes;

  int pos = 0;             // ring position, as the producer's
  uint32_t q_parity = 0;   // of this warpgroup's Q tiles
  for (int it = 0;; ++it) {
    const int slot = it % kTileSlots;
    mbar_wait(&bar.tile_full[slot], (it / kTileSlots) & 1);
    // The slot's fields, read where they are used before the key loop (volatile: none held in
    // registers through it) and broadcast from lane 0 like wg: ptxas then knows them, and all that
    // derives from them, to be warp-uniform, and keeps them in uniform registers, out of the key
    // loop's way. The warp arrives on tile_empty at the tile's end.
    const volatile TileTask& task = bar.task[slot];
    const auto field = [](const volatile int& f) { return __shfl_sync(0xffffffffu, f, 0); };
    const int tile = field(task.work);
    if (tile < 0) break;
    if (cw == 0 && t == 0) {
      SAGE_CTA_TIME(tile, 2, clock64());
      SAGE_CTA_TIME(tile, 0, sm_id());
      SAGE_CTA_TIME(tile, 1, global_ns());
    }
    pos = __shfl_sync(0xffffffffu, pos, 0);  // uniform again after the loop's divergent arrivals
    int n_blocks, cta_blocks;
    {
      const int m0 = field(task.m0), kb0 = field(task.kb0), kb1 = field(task.kb1);
      const int active_wgs = min(kWgs, (p.nq - m0 + kWgRows - 1) / kWgRows);
      const int nk = kKeyLens ? loop_keys<kKeyLens>(field(task.part)) : p.nk;
      cta_blocks = min(wg_blocks<kCausal>(m0, active_wgs - 1, nk), kb1) - kb0;
      n_blocks = cw < active_wgs ? min(wg_blocks<kCausal>(m0, cw, nk), kb1) - kb0 : 0;
    }
    if (n_blocks > 0) {
      float q_scale[2];
      {
        const int b = field(task.b), h = field(task.h);
        const int row0 = field(task.m0) + cw * kWgRows + warp * 16 + group;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int row = row0 + 8 * i;
          q_scale[i] = row < p.nq ? p.q_scale[b * p.q_scale_strides.b + h * p.q_scale_strides.h +
                                              static_cast<int64_t>(row) * p.q_scale_strides.n]
                                  : 0.0f;
        }
      }

      float o[D / 2];  // output accumulator, wgmma m64nD layout
#pragma unroll
      for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
      float m_run[2] = {neg_inf(), neg_inf()};
      float l_run[2] = {0.0f, 0.0f};  // 448 x the row sums of P as e4m3 (every lane of a quad holds them)

      // V's channel scales of the tile into shared memory (one 4-byte copy a thread, asynchronous: no
      // register holds them through the key loop), read by the epilogue. (Loaded into registers by the
      // epilogue, they cost it an L2 round trip and 32 loads a thread: causal n=1024 3% slower, n=4096 1%,
      // d=64 n=4096 1% faster, bench/NOTES.md.)
      float* const vsc_tile = reinterpret_cast<float*>(smem + L::kVsc) + cw * D;
      {
        const float* vs_base = p.v_scale + field(task.b) * p.v_scale_strides.b + field(task.hk) * p.v_scale_strides.h;
        if (t < D) cp_async_4(shared_addr(vsc_tile + t), vs_base + t, t < p.head_dim);
        cp_async_commit();
      }

      int32_t s[kSRegs];        // Q·Kᵀ accumulator
      float x[kSRegs];          // 448 P of the block
      float pv[kPvRegs];        // P·V accumulator of one block, row sums included
      uint32_t pa[kPSteps][4];  // P of the block, e4m3
      float alpha[2];           // the output's rescale before the block's P·V is added
      // One key block (blk of the tile, at ring position pos + blk): Q·Kᵀ (waits for K only, so it
      // starts before Vᵀ has landed), the softmax, P·V into a fresh accumulator, and the promotion O = O
      // * alpha + O_blk, l = l * alpha + the block's row sums (the pv columns past D, see issue_pv:
      // registers D/2 and D/2 + 2 hold column D + 2 quad of rows `group` and group + 8). Once the P·V
      // wgmma group has completed, this warp's last reads of the stage are done: it releases the stage
      // to the producer. Only the last block can hold masked keys (see wg_blocks): it takes the masked
      // softmax (correct for any block) unless it lies wholly below Nk, and the others skip its compares
      // and selects; the `last` block also releases the warpgroup's Q once its Q·Kᵀ has completed.
      // `masked` and `last` are constants at every call site, so the branches fold away.
      const auto step = [&](int r, bool masked, bool last, auto&& limit_of) {
        const int stage = r % kStages;
        const uint32_t parity = (r / kStages) & 1;
#ifdef SAGE_SM90_TRACE
        const int blk = r - pos;  // of the tile
#endif
        SAGE_TRACE(blk, 0);
        mbar_wait(&bar.k_full[stage], parity);
        SAGE_TRACE(blk, 1);
        const float k_scale = bar.k_scale[stage];  // the producer's, visible with the K tile
        wgmma_fence();
        issue_qk<D>(s, desc_q, desc_k(stage));
        wgmma_commit();
        int limit[2];  // the mask's limits, under the wgmma (with the last block's decoding at D = 128)
        limit_of(limit);
        wgmma_wait<0>();
        fence_operands(s);
        SAGE_TRACE(blk, 2);
        const float scale[2] = {q_scale[0] * k_scale, q_scale[1] * k_scale};  // the product first, as sage_ref
        if (last) {
          __syncwarp();
          if (lane == 0) mbar_arrive(&bar.q_empty[cw]);
        }
        if (masked) {
          softmax<true, kBiasCvt, kMaxChains>(s, scale, limit, m_run, alpha, x);
          pack_p(x, pa);
        } else {
          softmax<false, kBiasCvt, kMaxChains, kH2ExpTiles<D, kCausal>>(s, scale, limit, m_run, alpha, x);
          pack_p<kH2ExpTiles<D, kCausal>>(x, pa);
        }
        SAGE_TRACE(blk, 3);
        mbar_wait(&bar.v_full[stage], parity);
        SAGE_TRACE(blk, 4);
        wgmma_fence();
        issue_pv<D>(pv, pa, desc_v(stage));
        wgmma_commit();
        wgmma_wait<0>();
        fence_operands(pv);
        SAGE_TRACE(blk, 5);
        __syncwarp();
        if (lane == 0) mbar_arrive(&bar.empty[stage]);
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] = fmaf(o[i], alpha[(i / 2) % 2], pv[i]);
#pragma unroll
        for (int i = 0; i < 2; ++i) l_run[i] = fmaf(l_run[i], alpha[i], pv[D / 2 + 2 * i]);
        SAGE_TRACE(blk, 6);
      };
      mbar_wait(&bar.q_full[cw], q_parity);
      q_parity ^= 1;
      SAGE_TRACE_CTA(1, clock64());
      if (cw == 0 && t == 0) SAGE_CTA_TIME(tile, 3, clock64());
      // The last block peeled off the loop: the loop holds the unmasked softmax only (with both, the
      // consumers' registers would not hold the masked scores as well).
      {
        const auto unused = [](int (&limit)[2]) { limit[0] = limit[1] = 0; };
        const int r_last = pos + n_blocks - 1;
        for (int r = pos; r < r_last; ++r) step(r, false, false, unused);
      }
      // The tile decoded again, from its index hidden from the compiler: the loop then keeps none of
      // the first decoding's values. (Its fields read from the slot here instead, ptxas scheduled the
      // key loops differently and the kernels ran up to 2% slower than this, bench/NOTES.md.) It gives
      // the epilogue the tile's first row, heads and split part, and the last block its mask's limits.
      int m0, part, tb, th, row[2];
      const auto decode = [&](int (&limit)[2]) {
        int tile_again = tile;
        asm volatile("" : "+r"(tile_again));
        const Work wk = Work::of<kCausal>(p, tile_again);
        const Tile tl(wk.tile, blocks_m, p.heads_q);
        m0 = tl.m0(), part = wk.slot, tb = tl.b, th = tl.h;
        const int warp_row0 = m0 + cw * kWgRows + warp * 16;
        row[0] = warp_row0 + group;
        row[1] = warp_row0 + group + 8;
        const int n0 = (wk.kb0 + n_blocks - 1) * kBlockN, last_key = (kKeyLens ? field(task.part) : p.nk) - 1;
#pragma unroll
        for (int i = 0; i < 2; ++i) limit[i] = (kCausal ? min(last_key, row[i]) : last_key) - n0 - 2 * quad;
      };
      // At D = 128, a non-causal last block that lies wholly below Nk (every key block when Nk is a
      // multiple of 128, and every part of a split tile but the last) takes the unmasked softmax: about
      // 160 instructions a thread fewer (the compares and selects, the float row maximum). With the two
      // inlined last steps, one of them taken, ptxas also scheduled the non-causal key loop otherwise:
      // 1.5-4% faster non-causal, the same outputs (bench/NOTES.md, run m). At D = 64 the same change
      // put a spill store in the non-causal key loop; those kernels keep the masked last block.
      if constexpr (kDecodeUnderQk) {
        if (!kCausal && (field(task.kb0) + n_blocks) * kBlockN <= (kKeyLens ? field(task.part) : p.nk)) {
          step(pos + n_blocks - 1, false, true, decode);
        } else {
          step(pos + n_blocks - 1, true, true, decode);
        }
      } else {
        int limit[2];
        decode(limit);
        step(pos + n_blocks - 1, true, true, [&](int (&l)[2]) { l[0] = limit[0], l[1] = limit[1]; });
      }
      const bool row_ok[2] = {row[0] < p.nq, row[1] < p.nq};
      if (cw == 0 && t == 0) SAGE_CTA_TIME(tile, 4, clock64());
      // A part of a split tile: its rows go to the workspace, and the tile's last part merges the parts
      // and writes the output.
      cp_async_wait<0>();  // V's scales: this thread's copy has landed
      if (kCausal || part < 0 || merge_parts<D, kWgs>(p, part, cw, t, &bar.split_rank[cw], o, m_run, l_run)) {
        // Epilogue: divide by the row sum (448 x the reference's, which divides by sum * 448), multiply by
        // V's channel scale, and store: the warpgroup's 64 rows go through shared memory (by stmatrix, in
        // the 128-byte swizzle: the 8 rows of a matrix land on distinct banks; by 4-byte stores to generic
        // addresses, three times the instructions, the kernel took 1-3% longer, bench/NOTES.md) and out as
        // TMA stores, which skip the rows past Nq and the channels past head_dim (stored from registers, 4
        // bytes per thread and row, the kernel took 4-9% longer: 122.0 against 112.6 us at b=4 h=32 n=1024).
        // The previous tile's stores must have read the tile first. Then the LSE.
        using Pair = OutPair<OutT>;
        float inv[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) inv[i] = l_run[i] > 0.0f ? 1.0f / l_run[i] : 0.0f;
        if (t == 0) tma_store_wait_read();
        named_barrier_sync(kOutBarrier + cw, kWgThreads);  // shows every thread's copy of V's scales
        {
          // By stmatrix, four 8x8 matrices a warp at a time: matrix m of step c holds channels 8 (c + m / 2)
          // .. + 7 of the warp's rows 8 (m % 2) .. + 7, this thread's pair of them being its accumulator
          // values. Lane l addresses row l % 8 of matrix l / 8: box cc / 8, 16-byte chunk cc % 8 of the
          // row, swizzled by the row (cc = c + l / 16, whose box is c's: c is even).
          const int mat = lane / 8, mrow = lane % 8;
          const uint32_t row_addr = shared_addr(out_tile) + (warp * 16 + 8 * (mat % 2) + mrow) * kOutBoxBytes;
          const uint32_t vsc_addr = shared_addr(vsc_tile);
#pragma unroll
          for (int c = 0; c < kOTiles; c += 2) {
            uint32_t frag[4];
#pragma unroll
            for (int m = 0; m < 4; ++m) {
              const int cm = c + m / 2, i = m % 2;
              float2 vs;
              asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];"
                           : "=f"(vs.x), "=f"(vs.y)
                           : "r"(vsc_addr + (cm * 8 + quad * 2) * 4));
              const typename Pair::type v =
                  Pair::make(o[4 * cm + 2 * i] * inv[i] * vs.x, o[4 * cm + 2 * i + 1] * inv[i] * vs.y);
              frag[m] = reinterpret_cast<const uint32_t&>(v);
            }
            stmatrix_x4(row_addr + (c / 8) * (kOutBoxRows * kOutBoxBytes) + (((c % 8 + mat / 2) ^ mrow) * 16), frag);
          }
        }
        fence_proxy_async_shared();  // the tile, written by this thread, visible to the TMA unit
        named_barrier_sync(kOutBarrier + cw, kWgThreads);
        if (t == 0) {
#pragma unroll
          for (int box = 0; box < L::kOutBoxes; ++box) {
            tma_store_4d(&tm_o, out_tile + box * kOutBoxRows * kOutBoxBytes, box * kOutBoxBytes,
                         m0 + cw * kWgRows, th, tb);
          }
          tma_store_commit();
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          if (!row_ok[i]) continue;
          if (p.lse != nullptr && quad == 0) {
            const int64_t off =
                tb * p.lse_strides.b + th * p.lse_strides.h + static_cast<int64_t>(row[i]) * p.lse_strides.n;
            float lse = (m_run[i] + (log2f(l_run[i]) - kLog2Fp8Max)) * kLn2;
            if (p.corr != nullptr) {
              lse += p.corr[tb * p.corr_strides.b + th * p.corr_strides.h +
                            static_cast<int64_t>(row[i]) * p.corr_strides.n];
            }
            p.lse[off] = lse;
          }
        }
      }
      if (t == 0 && (cw == 0 || cw == kWgs - 1)) SAGE_CTA_TIME(tile, cw == 0 ? 5 : 6, clock64());
      if (cw == 0 && t == 0) SAGE_CTA_TIME(tile, 7, global_ns());
#ifdef SAGE_SM90_TRACE
      trace_on = false;
#endif
    }
    // The blocks of the tile this warpgroup does not read (causal: past its rows' keys; all of them
    // when its rows lie past Nq): it waits for each to land and releases it, as a reader would. (Were
    // the producer to release them for it, nothing would hold the producer to this warpgroup's pace,
    // and a barrier could run two phases ahead of the parity the warpgroup waits for.)
    for (int blk = n_blocks; blk < cta_blocks; ++blk) {
      mbar_wait(&bar.k_full[(pos + blk) % kStages], ((pos + blk) / kStages) & 1);
      __syncwarp();
      if (lane == 0) mbar_arrive(&bar.empty[(pos + blk) % kStages]);
    }
    pos += cta_blocks;
    __syncwarp();
    if (lane == 0) mbar_arrive(&bar.tile_empty[slot]);
  }
  if (t == 0) tma_store_wait_read();  // the output tile stays until its last stores have read it
  SAGE_TRACE_CTA(2, clock64());
  SAGE_TRACE_CTA(4, global_ns());
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// Tensor maps: Q and K as [B, H, N, d_pad] boxes of D bytes x 64 (Q: one consumer warpgroup's rows)
// or 128 (K) rows, Vᵀ as [B, Hkv, d_pad, n_pad] boxes of (128 keys x D channels). 4-d maps keep
// every tile inside its own (batch, head): rows past N (or keys past n_pad) come back as zeros
// instead of the next head's data.
template <int D>
cudaError_t make_maps(const AttnSm90Args& a, CUtensorMap* tm_q, CUtensorMap* tm_k, CUtensorMap* tm_v,
                      CUtensorMap* tm_o) {
  const CUtensorMapSwizzle qk_swizzle = D == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
  const auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
  const uint32_t q_box[4] = {static_cast<uint32_t>(D), static_cast<uint32_t>(kWgRows), 1, 1};
  const uint32_t k_box[4] = {static_cast<uint32_t>(D), static_cast<uint32_t>(kBlockN), 1, 1};
  {
    const uint64_t dims[4] = {u(a.d_pad), u(a.nq), u(a.heads_q), u(a.batch)};
    const uint64_t strides[3] = {u(a.q_strides.n), u(a.q_strides.h), u(a.q_strides.b)};
    const cudaError_t err = make_tensor_map_4d(tm_q, a.q, dims, strides, q_box, qk_swizzle);
    if (err != cudaSuccess) return err;
  }
  {
    const uint64_t dims[4] = {u(a.d_pad), u(a.nk), u(a.heads_kv), u(a.batch)};
    const uint64_t strides[3] = {u(a.k_strides.n), u(a.k_strides.h), u(a.k_strides.b)};
    const cudaError_t err = make_tensor_map_4d(tm_k, a.k, dims, strides, k_box, qk_swizzle);
    if (err != cudaSuccess) return err;
  }
  {
    const uint64_t dims[4] = {u(a.n_pad), u(a.d_pad), u(a.heads_kv), u(a.batch)};
    const uint64_t strides[3] = {u(a.vt_strides.n), u(a.vt_strides.h), u(a.vt_strides.b)};
    const uint32_t box[4] = {static_cast<uint32_t>(kBlockN), static_cast<uint32_t>(D), 1, 1};
    const cudaError_t err = make_tensor_map_4d(tm_v, a.vt, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
    if (err != cudaSuccess) return err;
  }
  // The output, as bytes (2 per element, OutPair's types): [B, Hq, Nq, head_dim * 2], boxes of 64 rows
  // x 128 bytes.
  constexpr int64_t kOutBytes = 2;
  const uint64_t dims[4] = {u(a.head_dim * kOutBytes), u(a.nq), u(a.heads_q), u(a.batch)};
  const uint64_t strides[3] = {u(a.out_strides.n * kOutBytes), u(a.out_strides.h * kOutBytes),
                               u(a.out_strides.b * kOutBytes)};
  const uint32_t box[4] = {static_cast<uint32_t>(kOutBoxBytes), static_cast<uint32_t>(kOutBoxRows), 1, 1};
  return make_tensor_map_4d(tm_o, a.out, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

// The light last row blocks drawn last (light_last_tile) in launches that split no tile (the split
// evens out the others' last wave), end on a partial wave that the light row blocks can fill at least
// half of, and whose K and Vᵀ take at most this many bytes, so that most of them are still in L2 when
// those tiles read them again. Measured on an H200, kernel alone (bench/NOTES.md, run j): b=4 h=32
// n=1024 (34 MB) 5.3% faster, b=2 h=40 n=1000 2%; b=4 h=32 n=2048 (67 MB) 0.8% faster and n=4096 no
// faster, drawn so at any size; where they fill little of the last wave (b=2 h=10 n=2048) or there is
// none (b=1 h=24 n=4096: four whole waves), 0-1.5% slower; with split tiles, b=2 h=10 n=4096 0.4%.
constexpr int64_t kLightLastKvBytes = int64_t{40} << 20;

// The order in which a launch of `grid` CTAs draws its work items (causal_tile, light_last_tile): sets
// args' causal_tail_first and causal_tail_heads (causal) or light_heads (non-causal), its tiles of
// `rows` query rows and its split (split_first, split_parts) already set.
void plan_tile_order(AttnSm90Args& args, int rows, bool causal, int64_t grid) {
  const int64_t heads = int64_t{args.batch} * args.heads_q, blocks_m = (args.nq + rows - 1) / rows;
  args.causal_tail_first = args.causal_tail_heads = args.light_heads = 0;
  if (heads < 1 || blocks_m < 1) return;
  if (causal) {  // the last heads' tiles row block by row block
    const int64_t tail = std::min(heads, (kCausalTailWaves * grid + blocks_m - 1) / blocks_m);
    args.causal_tail_heads = static_cast<int>(tail);
    args.causal_tail_first = static_cast<int>((heads - tail) * blocks_m);
    return;
  }
  // The light row blocks drawn last where they can take half of the last, partial wave's tiles at least.
  const int64_t kv_bytes = int64_t{args.batch} * args.heads_kv * args.nk * args.d_pad * 2;  // INT8 K, FP8 Vᵀ
  const int64_t last = heads * blocks_m % grid;
  if (args.split_parts <= 1 && args.nq % rows != 0 && blocks_m > 1 && kv_bytes <= kLightLastKvBytes && last > 0 &&
      2 * heads >= last) {
    args.light_heads = static_cast<int>(heads);
  }
}

template <int D, bool kCausal, typename OutT, bool kKeyLens>
cudaError_t launch(const AttnSm90Args& in, cudaStream_t stream) {
  CUtensorMap tm_q, tm_k, tm_v, tm_o;
  constexpr int kWgs = consumer_wgs(D);
  using C = Cta<kWgs>;
  // The work items: the tiles, with the last ones split (split_first, split_parts; see Work).
  const int64_t tiles = int64_t{(in.nq + C::kBlockM - 1) / C::kBlockM} * in.heads_q * in.batch;
  if (tiles >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  AttnSm90Args args = in;
  if (args.split_parts <= 1) {
    args.split_first = static_cast<int>(tiles);
    args.split_parts = 1;
  } else {
    const int blocks = (args.nk + kBlockN - 1) / kBlockN;
    const bool split_ok = !kCausal && args.kv_len == nullptr && args.split_first >= 0 && args.split_first < tiles &&
                          args.split_parts <= kSm90MaxSplitParts && args.split_parts <= blocks &&
                          args.split_partials != nullptr &&
                          (tiles - args.split_first) * kWgs <= kSm90SplitCounters;
    if (!split_ok) return cudaErrorInvalidValue;
  }
  const int64_t items = sm90_work_items(tiles, args.split_first, args.split_parts);
  if (items >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  cudaError_t err = make_maps<D>(args, &tm_q, &tm_k, &tm_v, &tm_o);
  if (err != cudaSuccess) return err;
  static_assert(sizeof(OutT) == 2, "make_maps describes the output as 2-byte elements");
  auto* kernel = attn_int8_fp8_sm90_kernel<D, kCausal, OutT, kKeyLens>;
  constexpr int kSmem = Smem<D, kWgs>::kAlloc;  // above the 48 KiB default: opt in
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  // One CTA per SM (at most one per work item), each drawing items until none are left (see the kernel).
  int device = 0, sms = 0;
  err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  const int64_t grid = items < sms ? items : sms;
  plan_tile_order(args, C::kBlockM, kCausal, grid);
  // Programmatic stream serialization: the CTAs may start (barriers, the ones rows) while the kernel
  // before them in the stream (the quantization) finishes; grid_dependency_wait() in the kernel holds
  // every global-memory access until that kernel has completed and its writes are visible.
  return launch_kernel(kernel, dim3(static_cast<unsigned>(grid)), dim3(C::kThreads), kSmem, stream, true, tm_q, tm_k,
                       tm_v, tm_o, args);
}

template <int D, bool kCausal, bool kKeyLens>
cudaError_t launch_out(const AttnSm90Args& args, cudaStream_t stream) {
  return args.out_type == HalfType::kFloat16 ? launch<D, kCausal, __half, kKeyLens>(args, stream)
                                             : launch<D, kCausal, __nv_bfloat16, kKeyLens>(args, stream);
}

// Key lengths (kv_len) come without causal masking (the kept keys are moved to the front, so their
// positions are not the keys'): non-causal kernels only.
template <int D>
cudaError_t launch_causal(const AttnSm90Args& args, cudaStream_t stream) {
  if (args.kv_len != nullptr) return args.causal ? cudaErrorInvalidValue : launch_out<D, false, true>(args, stream);
  return args.causal ? launch_out<D, true, false>(args, stream) : launch_out<D, false, false>(args, stream);
}

}  // namespace

// The split model (AttnSm90Split): a part costs its share of the tile's key blocks plus about
// kSplitOverheadBlocks blocks (its Q's wait, the partials' stores, a share of the merge); the last wave
// then takes ceil(last x parts / SMs) rounds of parts. Parts hold kMinPartBlocks blocks at least, and
// there are at most kSm90MaxSplitParts of them. Measured on an H100, kernel alone (bench/NOTES.md):
// overheads of 2, 3 and 4 blocks split the same shapes alike except n=2048 (b=4 h=32: 2 splits it, 2.5% slower);
// 8 parts at most was no faster than 4; and parts of 2 blocks (b=1 h=24 n=1024: 6 tiles a head of 8
// blocks each, 12 in the last wave) made the kernel 12% slower.
constexpr int kMinPartBlocks = 8;
constexpr double kSplitOverheadBlocks = 4.0;
AttnSm90Split attn_sm90_split_plan(int batch, int heads_q, int nq, int nk, int d_pad, bool causal, int sms) {
  const int wgs = consumer_wgs(d_pad), rows = wgs * kWgRows;
  const int64_t tiles = (int64_t{nq} + rows - 1) / rows * heads_q * batch;
  const int blocks = (nk + kBlockN - 1) / kBlockN;
  AttnSm90Split plan{static_cast<int>(tiles), 1, 0, rows};
  if (causal || sms < 1 || tiles < 1 || tiles >= (int64_t{1} << 30)) return plan;
  const int64_t last = tiles % sms;  // the tiles of the last, partial wave (all of them when tiles < sms)
  if (last == 0 || last * wgs > kSm90SplitCounters) return plan;
  double best = 1.0;  // whole tiles: one round of one tile
  for (int parts = 2; parts <= kSm90MaxSplitParts && parts * kMinPartBlocks <= blocks; ++parts) {
    const int64_t rounds = (last * parts + sms - 1) / sms;
    const double cost = static_cast<double>(rounds) * (1.0 / parts + kSplitOverheadBlocks / blocks);
    if (cost < best) {
      best = cost;
      plan.parts = parts;
    }
  }
  if (plan.parts > 1) {
    plan.first = static_cast<int>(tiles - last);
    plan.partials_floats = last * plan.parts * wgs * kWgThreads * split_values(d_pad);
  }
  return plan;
}

cudaError_t launch_qk_int8_sv_f8_attn_sm90(const AttnSm90Args& args, cudaStream_t stream) {
  if (args.head_dim <= 0 || args.head_dim % 8 != 0 || args.head_dim > args.d_pad) return cudaErrorInvalidValue;
  if (args.heads_kv < 1 || args.heads_q % args.heads_kv != 0) return cudaErrorInvalidValue;
  if (args.n_pad < args.nk || args.n_pad % kSm90KeyPermuteGroup != 0) return cudaErrorInvalidValue;
  if (args.nq == 0 || args.batch == 0 || args.heads_q == 0) return cudaSuccess;  // nothing to compute
  if (args.nk <= 0 || args.tile_counter == nullptr) return cudaErrorInvalidValue;
  // The kernel body exists only in sm_90a code; on any other GPU this module has no kernel to run.
  int device = 0, major = 0, minor = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) return err;
  if (major != 9 || minor != 0) return cudaErrorNoKernelImageForDevice;
  switch (args.d_pad) {
    case 64:
      return launch_causal<64>(args, stream);
    case 128:
      return launch_causal<128>(args, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace sage
