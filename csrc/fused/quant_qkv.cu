// Q, K and V of one sm_90a attention call quantized in one kernel launch, two for long sequences
// (quant.h, QuantQkvArgs).
// The workspace holds the statistics' K chunk partials, float32 [B, Hkv, chunks, d_pad] (every slot
// written once in the launch), then V's channel maxima, float32 [B, Hkv, d_pad], the counters (a
// 64-bit done counter per (b, hkv), then the attention's spare ints) and the clear marks (kClearCtas
// 64-bit words). The maxima and the counters start each call at zero, cleared one of two ways:
// - by the quantization itself (QuantQkvArgs::clear_nonce != 0; the op's eager calls: one launch
//   fewer, up to 1.4 us off a call at short lengths on an H200, bench/NOTES.md): the grid's first
//   clear_slices CTAs take no item; each zeroes a share and then writes the launch's nonce into its
//   mark. A stats item, before it touches V's maxima or its done counter, waits until every mark holds
//   the nonce (wait_cleared). The other items only poll their done counter, whose counts make up a
//   value of this launch's own (done_target), which neither stale data nor an earlier launch's counts
//   give. The launch is a programmatic dependent of the kernel before it and waits for it
//   (griddepcontrol.wait) before any memory access. Nothing resets the marks: a nonce differs from
//   whatever an earlier launch left there (quant_qkv_clear_nonce), which a CUDA graph's replays,
//   repeating their arguments, could not guarantee;
// - by clear_kernel (clear_nonce == 0: launches captured into graphs), itself a programmatic dependent
//   of the kernel before the call (its CTAs set up before that one ends, then wait for it: 1.2-2 us off
//   a call in a stream of calls, bench/NOTES.md); the quantization launched behind it starts as it
//   does and waits for it (griddepcontrol.wait) only where it first touches them, after its loads are
//   on their way.
// Each other CTA of quant_qkv_kernel does one work item, the item of its blockIdx.x - clear_slices:
//
// - stats item (chunk, b, hkv): reads `chunk` tokens of K and V, writes per channel the float32 sum
//   of K (smooth-K only) over its chunk into the partials and raises the (b, hkv)'s max |V| to its
//   chunk's (atomicMax on the bits: a max needs no order to give the same bits), then counts itself on
//   its (b, hkv)'s done counter;
// - V tile: FP8 Vᵀ with its keys permuted, 16384 / d_pad tokens, transposed through shared memory
//   into 16-byte row stores; K block: 128 keys; Q tile: 128 tokens. An item that reads the statistics
//   (V tiles; K blocks with smooth-K; Q tiles with the smooth-K correction) first waits until its
//   (b, hkv)'s done counter holds all its chunks; K's partials are then summed in one fixed order
//   (k_mean = sum / Nk), so all CTAs of a (b, hkv) hold the same bits; the first K block of a (b, hkv)
//   writes k_mean, its first V tile v_scale. The other Q tiles wait for nothing.
//
// The stats items and clearing CTAs a CTA waits for hold lower indices than its own. The GPU starts a
// grid's CTAs in increasing blockIdx.x (CUB's single-pass scan waits on its predecessors on the same
// ground), so those belong to CTAs that have started and, but for the clearing CTAs' marks, wait for
// nothing themselves: no deadlock, however many CTAs fit on the GPU at once. (An atomic ticket per
// CTA made the same order explicit, but its round trip, before any load could start, held 14% of the
// warps' time at b=4 h=32 n=4096; bench/NOTES.md.) Items walk the (b, hkv) heads in groups whose K and V take at most kGroupBytes
// (one head at least): the stats items of group s, then the quantizing items of group s - kLookahead
// (head by head: its V tiles, its K blocks, the Q tiles of its query heads). A group's stats items
// thus run while the group before it is quantized, and its quantizing items re-read K and V while
// they are still in L2 (step_start, item_of). The groups take the heads from the last to the first,
// so the first heads, whose tiles the attention kernel draws first, are quantized last and their
// outputs are still in L2 when it starts. Where a stats item reads more than
// kOverlapStatsBytes (long chunks: many heads, long sequences), all heads form one group, and the
// stats items and the quantizing items go in two launches of the kernel (nothing to wait for: the
// first launch has counted everything when the second starts). Thread 0 decodes the CTA's item
// (item_of) and hands it to the others through shared memory (decoded by every thread, it was 8% of
// the kernel's instructions, bench/NOTES.md). Once it holds its item, a CTA lets a kernel launched
// behind it with programmatic stream serialization start (griddepcontrol, sm_90).
//
// A thread holds 8 consecutive channels of a token, one 16-byte load (eight 2-byte loads where the
// view's base or strides are not 16-byte aligned): d_pad / 8 threads per token. INT8 rows go out as
// 8-byte stores, Vᵀ rows as 16-byte stores. The arithmetic is quant.cu's, through the helpers of
// quant_common.cuh; where a result depends on the order of operations (corr's dot product), that
// order is reproduced as well, so every output is bit for bit what quant.cu's kernels give.

#include <algorithm>
#include <atomic>
#include <random>
#include <type_traits>

#include "quant.h"
#include "quant_common.cuh"
#include "sage_copy.cuh"
#include "sage_pdl.cuh"

namespace sage {
namespace {

using namespace quant;

constexpr int kQTokens = 128;       // tokens per Q CTA
constexpr int kVTileBytes = 16384;  // Vᵀ tile of a V CTA: d_pad rows of kVTileBytes / d_pad tokens
constexpr int kMaxChunks = 64;      // stats chunks per (b, hkv), at most
constexpr int kSpreadChunks = 32;   // stats chunks per (b, hkv), at most, when spreading them (kStatsCtas)
constexpr int kMinChunk = 128;      // tokens per stats chunk, at least
constexpr int kStatsCtas = 512;     // stats items aimed at (about 4 per SM) when B * Hkv is small
constexpr int64_t kStatsItemBytes = 128 << 10;  // K and V bytes a stats item reads, at most, where chunks allow
constexpr int kStatsUnroll = 4;     // tokens of K and of V in flight per thread in the stats loop
constexpr float kInvFp8Max = static_cast<float>(1.0 / kFp8E4M3Max);  // Python's 1.0 / 448, as float32
constexpr int64_t kMaxTokens = (int64_t{1} << 31) - 1024;            // token indices stay within int

// Item order and counters (see the top of the file).
constexpr int64_t kGroupBytes = int64_t{8} << 20;  // K and V bytes of an item group's heads, at most
constexpr int kLookahead = 1;                      // groups whose stats items precede a group's quantization
constexpr int64_t kOverlapStatsBytes = 256 << 10;  // bytes a stats item reads, at most, for several groups
constexpr int kClearCtas = 16;                     // CTAs of clear_kernel, at most

constexpr int cmax(int x, int y) { return x > y ? x : y; }

// Eight consecutive halves: one 16-byte load (kAligned), or eight 2-byte loads.
template <bool kAligned>
__device__ __forceinline__ uint4 load8(const void* p) {
  if constexpr (kAligned) {
    return __ldg(static_cast<const uint4*>(p));
  } else {
    const unsigned short* s = static_cast<const unsigned short*>(p);
    uint4 r;
    r.x = s[0] | static_cast<uint32_t>(s[1]) << 16;
    r.y = s[2] | static_cast<uint32_t>(s[3]) << 16;
    r.z = s[4] | static_cast<uint32_t>(s[5]) << 16;
    r.w = s[6] | static_cast<uint32_t>(s[7]) << 16;
    return r;
  }
}

// A thread's share of a tile: tokens t0, t0 + kRows, ... (one per pass), eight halves each from
// `base` (a token's first channel for this thread), zeros past `limit` or for an inactive thread.
template <bool kAligned, int kRows, typename T, int kPasses>
__device__ __forceinline__ void load_tile(const T* base, int64_t stride, int t0, int limit, bool active,
                                          uint4 (&raw)[kPasses], const int* order = nullptr) {
  if (order != nullptr) {  // token t is input row order[t] (kOrder: a key-padding mask's kept keys first)
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int t = t0 + p * kRows;
      raw[p] = active && t < limit ? load8<kAligned>(base + int64_t{__ldg(order + t)} * stride)
                                   : make_uint4(0, 0, 0, 0);
    }
    return;
  }
  const T* ptr = base + int64_t{t0} * stride;
  const int64_t step = int64_t{kRows} * stride;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int t = t0 + p * kRows;
    raw[p] = active && t < limit ? load8<kAligned>(ptr) : make_uint4(0, 0, 0, 0);
    ptr += step;
  }
}

// Hides raw's value from the compiler: what it computed from raw before is not reused after, but
// computed again. Keeps converted copies of a register-held tile from living across a block-wide
// reduction (registers that would otherwise spill).
__device__ __forceinline__ void opaque(uint4& raw) {
  asm volatile("" : "+r"(raw.x), "+r"(raw.y), "+r"(raw.z), "+r"(raw.w));
}

// Tokens per stats chunk: chunks enough for about kStatsCtas stats items, at most kSpreadChunks of them;
// shorter ones where a stats item would read more than kStatsItemBytes of K and V (2-byte elements)
// and at most kMaxChunks of them cover Nk. Short stats items let one launch take every item in
// groups, whose quantizing items re-read K and V from L2 (at b=4 h=32 n=4096, 310 -> 261 us against
// 1024-token chunks in two launches; n=16384, 1170 -> 1139; H100, bench/NOTES.md). The chunks set the
// order of k_mean's float32 sums, hence its bits.
int stats_chunk(int64_t batch, int64_t heads_kv, int64_t nk, int d_pad) {
  const int64_t heads = batch * heads_kv > 0 ? batch * heads_kv : 1;
  int64_t wanted = (kStatsCtas + heads - 1) / heads;
  wanted = wanted < 1 ? 1 : (wanted > kSpreadChunks ? kSpreadChunks : wanted);
  int64_t chunk = (nk + wanted - 1) / wanted;  // >= nk / wanted: at most `wanted` chunks
  chunk = (chunk + 63) / 64 * 64;
  chunk = chunk < kMinChunk ? kMinChunk : chunk;
  int64_t short_chunk = kStatsItemBytes / (int64_t{4} * d_pad) / 64 * 64;
  short_chunk = short_chunk < kMinChunk ? kMinChunk : short_chunk;
  if (chunk > short_chunk && (nk + short_chunk - 1) / short_chunk <= kMaxChunks) chunk = short_chunk;
  return static_cast<int>(chunk);
}

// Work items of the grid (see the top of the file) and what locates them.
struct QkvGrid {
  int chunk;        // tokens per stats chunk
  int chunks;       // stats chunks per (b, hkv)
  int v_tiles;      // V tiles per (b, hkv)
  int k_blocks;     // K blocks per (b, hkv)
  int q_tiles;      // Q tiles per (b, hq)
  int kv_group;     // query heads per KV head
  int kv_heads;     // B * Hkv
  int group_heads;  // (b, hkv) heads per item group (the last group may hold fewer)
  int groups;       // item groups: ceil(kv_heads / group_heads)
  int head_items;   // quantizing items per (b, hkv): v_tiles + k_blocks + kv_group * q_tiles
  int item_base;    // item of the launch's first CTA (see launch)
  int clear_slices;  // CTAs of this launch that clear the maxima and the counters first (0: none)
  bool waits;       // one launch of every item, whose items wait for their statistics (else one of two)
};

// Where V's channel maxima start in the workspace, in floats: after K's chunk partials; the int
// counters follow them. clear_kernel zeroes both.
__host__ __device__ __forceinline__ int64_t v_max_offset(int64_t kv_heads, int chunks, int d_pad) {
  return kv_heads * chunks * d_pad;
}
__host__ __device__ __forceinline__ int64_t counters_offset(int64_t kv_heads, int chunks, int d_pad) {
  return v_max_offset(kv_heads, chunks, d_pad) + kv_heads * d_pad;
}

// The grid's counters in the workspace: (b, hkv)'s done counter, 64 bits, at [bh] (count_done); then,
// from spare_ints(kv_heads) on, kQkvSpareInts ints cleared with them and left to the attention kernel
// that follows (quant.h).
template <int D_PAD>
__device__ __forceinline__ uint64_t* qkv_counters(const QuantQkvArgs& a, const QkvGrid& g) {
  return reinterpret_cast<uint64_t*>(a.workspace + counters_offset(g.kv_heads, g.chunks, D_PAD));
}

// Where the spare ints start among the counters (in ints): the 128-byte line after the done counters'.
__host__ __device__ __forceinline__ int64_t spare_ints(int64_t kv_heads) { return (2 * kv_heads + 31) / 32 * 32; }
// The ints cleared with V's maxima: the done counters and the spare ints.
__host__ __device__ __forceinline__ int64_t counter_ints(int64_t kv_heads) {
  return spare_ints(kv_heads) + kQkvSpareInts;
}
// 4-byte words cleared at each call: V's maxima, then the counters (from v_max_offset on).
__host__ __device__ __forceinline__ int64_t cleared_words(int64_t kv_heads, int chunks, int d_pad) {
  return counters_offset(kv_heads, chunks, d_pad) - v_max_offset(kv_heads, chunks, d_pad) + counter_ints(kv_heads);
}
// Where the clear marks start, in floats (8-byte aligned): after the counters.
__host__ __device__ __forceinline__ int64_t marks_offset(int64_t kv_heads, int chunks, int d_pad) {
  return (counters_offset(kv_heads, chunks, d_pad) + counter_ints(kv_heads) + 1) / 2 * 2;
}

// (b, hkv) = bh's K chunk partials in the workspace, [chunks, D_PAD]: its stats items' K sums.
template <int D_PAD>
__device__ __forceinline__ float* chunk_partials(const QuantQkvArgs& a, const QkvGrid& g, int bh) {
  return a.workspace + int64_t{bh} * g.chunks * D_PAD;
}

// (b, hkv) = bh's max |V| per channel in the workspace, [D_PAD], as float bits: zero at the launch,
// raised by its stats items.
template <int D_PAD>
__device__ __forceinline__ unsigned* v_max(const QuantQkvArgs& a, const QkvGrid& g, int bh) {
  return reinterpret_cast<unsigned*>(a.workspace + v_max_offset(g.kv_heads, g.chunks, D_PAD)) + int64_t{bh} * D_PAD;
}

// Slice `slice` of `slices` of the `words` 4-byte words from `p` (16-byte aligned; V's channel maxima and
// the counters) set to zero by the CTA: 16-byte stores, the last slice also the words past the last
// whole 16 bytes. Both ways of clearing (see the top of the file) split the words so.
__device__ __forceinline__ void zero_share(uint32_t* p, int64_t words, int slice, int slices) {
  const int64_t quads = words / 4, end = (slice + 1) * quads / slices;
  for (int64_t i = slice * quads / slices + threadIdx.x; i < end; i += kThreads) {
    reinterpret_cast<uint4*>(p)[i] = make_uint4(0, 0, 0, 0);
  }
  if (slice == slices - 1 && threadIdx.x < words - quads * 4) p[quads * 4 + threadIdx.x] = 0;
}

// Zeroes `words` 4-byte words from `p`, a slice per CTA (zero_share). Launched as a programmatic
// dependent of whatever kernel precedes the call (its CTAs set up before that one ends), it waits for
// it first; then it lets the quantization behind it start.
__global__ void __launch_bounds__(kThreads) clear_kernel(uint32_t* p, int64_t words) {
  grid_dependency_wait();  // the kernel before: its writes (the inputs, an earlier call's use of p)
  allow_dependent_grid();
  zero_share(p, words, static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x));
}

#ifdef SAGE_QUANT_TIMES
// Per CTA (blockIdx.x + item_base, the first kQuantTimesMax): the QuantTimeField records (quant.h).
__device__ long long g_quant_times[kQuantTimesMax][kQuantTimeFields];
__device__ __forceinline__ long long quant_now() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define SAGE_QUANT_TIME(field, value)                                                     \
  do {                                                                                    \
    const int cta_ = static_cast<int>(blockIdx.x) - g.clear_slices + g.item_base;                      \
    if (threadIdx.x == 0 && cta_ >= 0 && cta_ < kQuantTimesMax) g_quant_times[cta_][field] = (value); \
  } while (0)
#else
#define SAGE_QUANT_TIME(field, value) \
  do {                                \
  } while (0)
#endif

__device__ __forceinline__ uint64_t load_acquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Polls `p` with acquire loads, backing off (32 to 512 ns), until it holds `value`.
__device__ __forceinline__ void poll_until(const uint64_t* p, uint64_t value) {
  unsigned ns = 32;
  while (load_acquire(p) != value) {
    __nanosleep(ns);
    ns = ns < 512 ? 2 * ns : ns;
  }
}

// The clear marks of the launch (see the top of the file).
template <int D_PAD>
__device__ __forceinline__ uint64_t* clear_marks(const QuantQkvArgs& a, const QkvGrid& g) {
  return reinterpret_cast<uint64_t*>(a.workspace + marks_offset(g.kv_heads, g.chunks, D_PAD));
}

// Clearing CTA `slice` of `slices`: zeroes its share of the `words` cleared words from `p` (zero_share),
// then marks it done with the nonce: the barrier and thread 0's fence order every thread's stores before
// the mark.
__device__ __forceinline__ void clear_share(uint32_t* p, int64_t words, int slice, int slices, uint64_t* mark,
                                         uint64_t nonce) {
  zero_share(p, words, slice, slices);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    *reinterpret_cast<volatile uint64_t*>(mark) = nonce;
  }
}

// Before a stats item's first access to V's maxima or its done counter: they are zero. With
// clear_kernel, once the kernel before this launch (that one) has completed; with clearing CTAs, once
// every one has marked its share (thread s polls mark s, backing off; the barrier orders the block's
// later accesses). (Polled by the other items too, the kernel spilled; they wait on their counter,
// done_target, and touch nothing else cleared.)
template <int D_PAD>
__device__ __forceinline__ void wait_cleared(const QuantQkvArgs& a, const QkvGrid& g) {
  grid_dependency_wait();
  if (g.clear_slices > 0) {
    if (threadIdx.x < g.clear_slices) {
      poll_until(clear_marks<D_PAD>(a, g) + threadIdx.x, a.clear_nonce);
    }
    __syncthreads();
  }
}

// A stats item's count on its (b, hkv)'s done counter: clear_nonce * 2 + 1, so that the chunks' counts
// from zero end on a value (done_target) that neither an earlier launch's counts (another nonce) nor,
// but by a 2^-64 chance, stale data give. So an item may poll its counter before the clearing CTAs
// have zeroed it (only the stats items, which write the counters, wait for their marks).
__device__ __forceinline__ uint64_t done_step(const QuantQkvArgs& a) { return a.clear_nonce * 2 + 1; }
__device__ __forceinline__ uint64_t done_target(const QuantQkvArgs& a, const QkvGrid& g) {
  return done_step(a) * static_cast<uint64_t>(g.chunks);
}

// Called once a (b, hkv)'s stats item has written its K partials and raised V's maxima: the block's
// stores and atomics, ordered by the barrier and the fence before thread 0's count, are visible to
// whoever observes the count.
__device__ __forceinline__ void count_done(uint64_t* done, uint64_t step) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(reinterpret_cast<unsigned long long*>(done), static_cast<unsigned long long>(step));
  }
}

// Waits until all stats items of a (b, hkv) have counted themselves on `done` (done_target): thread 0
// polls with acquire loads, backing off, and the barrier orders the block's later reads after it.
__device__ __forceinline__ void wait_done(const uint64_t* done, uint64_t target) {
  if (threadIdx.x == 0) poll_until(done, target);
  __syncthreads();
}

// Stats item `chunk_idx` of (b, hkv) = bh: per channel, the sum of K over the chunk's tokens (smooth_k)
// and their max |V|. Thread (row, c) takes channels [8c, 8c + 8) of the chunk's tokens row,
// row + kRows, ...; the rows then meet in shared memory (`smem`), summed in row order.
template <typename T, int D_PAD, bool kAligned>
__device__ __forceinline__ void qkv_stats(const QuantQkvArgs& a, const QkvGrid& g, int chunk_idx, int bh,
                                          uint8_t* smem) {
  constexpr int kVecs = D_PAD / kVec, kRows = kThreads / kVecs;
  float(*rows)[kRows][D_PAD] = reinterpret_cast<float(*)[kRows][D_PAD]>(smem);  // [2][kRows][D_PAD]
  const int c = threadIdx.x % kVecs, row = threadIdx.x / kVecs;
  const int b = bh / a.heads_kv, h = bh % a.heads_kv;
  const int first = chunk_idx * g.chunk;
  const int last = static_cast<int>(min(static_cast<int64_t>(first) + g.chunk, static_cast<int64_t>(a.nk)));
  const bool active = c * kVec < a.head_dim;
  const bool smooth_k = a.smooth_k;
  const T* kb = static_cast<const T*>(a.k) + b * a.k_strides.b + h * a.k_strides.h + c * kVec;
  const T* vb = static_cast<const T*>(a.v) + b * a.v_strides.b + h * a.v_strides.h + c * kVec;
  float sum[kVec];
  uint32_t vmag[kVec / 2] = {0u, 0u, 0u, 0u};  // max |V| per channel as packed 16-bit magnitudes (amax8)
#pragma unroll
  for (int j = 0; j < kVec; ++j) sum[j] = 0.f;
  for (int t0 = first + row; t0 < last; t0 += kRows * kStatsUnroll) {
    uint4 kr[kStatsUnroll], vr[kStatsUnroll];
#pragma unroll
    for (int u = 0; u < kStatsUnroll; ++u) {
      const int t = t0 + u * kRows;
      const bool ok = active && t < last;
      kr[u] = ok && smooth_k ? load8<kAligned>(kb + t * a.k_strides.n) : make_uint4(0, 0, 0, 0);
      vr[u] = ok ? load8<kAligned>(vb + t * a.v_strides.n) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kStatsUnroll; ++u) {
      float x[kVec];
      if (smooth_k) {
        unpack8<T>(kr[u], x);
#pragma unroll
        for (int j = 0; j < kVec; ++j) sum[j] += x[j];
      }
      vmag[0] = __vmaxu2(vmag[0], vr[u].x & kHalfMagnitudes);
      vmag[1] = __vmaxu2(vmag[1], vr[u].y & kHalfMagnitudes);
      vmag[2] = __vmaxu2(vmag[2], vr[u].z & kHalfMagnitudes);
      vmag[3] = __vmaxu2(vmag[3], vr[u].w & kHalfMagnitudes);
    }
  }
  float amax[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) amax[j] = half_bits_to_float<T>(j % 2 ? vmag[j / 2] >> 16 : vmag[j / 2] & 0xffffu);
  float4* ksum_row = reinterpret_cast<float4*>(&rows[0][row][c * kVec]);
  float4* vmax_row = reinterpret_cast<float4*>(&rows[1][row][c * kVec]);
  ksum_row[0] = make_float4(sum[0], sum[1], sum[2], sum[3]);
  ksum_row[1] = make_float4(sum[4], sum[5], sum[6], sum[7]);
  vmax_row[0] = make_float4(amax[0], amax[1], amax[2], amax[3]);
  vmax_row[1] = make_float4(amax[4], amax[5], amax[6], amax[7]);
  wait_cleared<D_PAD>(a, g);  // V's maxima and the done counter
  __syncthreads();
  const int out = chunk_idx * D_PAD;  // this chunk's row of the (b, hkv)'s partials
  const int d = threadIdx.x % D_PAD;
  if (threadIdx.x < D_PAD) {
    if (smooth_k) {
      float s = 0.f;
#pragma unroll
      for (int r = 0; r < kRows; ++r) s += rows[0][r][d];
      chunk_partials<D_PAD>(a, g, bh)[out + d] = s;
    }
  } else if (threadIdx.x < 2 * D_PAD) {
    float m = 0.f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) m = amax2(m, rows[1][r][d]);
    // amax2 orders magnitudes (NaN above Inf) as their bits: the bits' max is amax2 over the chunks.
    atomicMax(v_max<D_PAD>(a, g, bh) + d, __float_as_uint(m));
  }
}

// Waits for (b, hkv) = bh's statistics: in a launch of every item (g.waits) on its done counter; in
// the second of two launches the first has counted everything.
template <int D_PAD>
__device__ __forceinline__ void wait_stats(const QuantQkvArgs& a, const QkvGrid& g, int bh) {
  grid_dependency_wait();  // the kernel before (clear_kernel: the done counter zeroed)
  if (g.waits) wait_done(qkv_counters<D_PAD>(a, g) + bh, done_target(a, g));
  SAGE_QUANT_TIME(kQtStatsDone, quant_now());
}

// (b, hkv) = bh's K mean from its stats items' chunk partials (chunk_partials), chunk 0 first, into
// stat[D_PAD]: the sum over chunks divided by Nk (IEEE), once they are all in (wait_stats). Stages the
// partials through `stage` (chunks * D_PAD floats) by asynchronous copies from L2 (other CTAs wrote
// them), all of a thread's in flight at once: no registers hold them, so the K block's tile stays in
// registers beside them. (Loaded into registers one at a time, each a round trip to L2, the copies
// held the K blocks 8 round trips at n=16384, bench/NOTES.md.) Ends with __syncthreads.
template <int D_PAD>
__device__ __forceinline__ void k_mean_of(const QuantQkvArgs& a, const QkvGrid& g, int bh, float* stage, float* stat) {
  const int chunks = g.chunks;
  wait_stats<D_PAD>(a, g, bh);
  const float4* src = reinterpret_cast<const float4*>(chunk_partials<D_PAD>(a, g, bh));
  const uint32_t dst = smem_addr(stage);
#pragma unroll 1
  for (int i = threadIdx.x; i < chunks * (D_PAD / 4); i += kThreads) cp_async_16(dst + 16 * i, src + i, true);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  if (threadIdx.x < D_PAD) {
    float acc = 0.f;
    for (int c = 0; c < chunks; ++c) acc += stage[c * D_PAD + threadIdx.x];
    stat[threadIdx.x] = __fdiv_rn(acc, static_cast<float>(a.nk));
  }
  __syncthreads();
}

// V tile `tile` of (b, hkv) = bh: tokens [tile * kTokens, +kTokens) into Vᵀ[bh, :, same range]. Unit
// (g, quad, c) quantizes channels [8c, 8c + 8) of the tokens that permuted slots 4 quad .. 4 quad + 3
// of group g hold (permuted_token), and writes each channel's 4 FP8 bytes as one word of the tile:
// [d][token slot], the 16-byte chunk of group g of row d at position g ^ (c & 7), so that the words a
// warp writes spread over the banks. Then each thread copies 16-byte chunks to Vᵀ's rows.
template <typename T, int D_PAD, bool kAligned, bool kOrder>
__device__ __forceinline__ void quant_v_tile(const QuantQkvArgs& a, const QkvGrid& g, int tile, int bh,
                                             uint8_t* smem, float* stat) {
  constexpr int kVecs = D_PAD / kVec;
  constexpr int kTokens = kVTileBytes / D_PAD;  // 128 or 256
  constexpr int kGroups = kTokens / 16;
  constexpr int kUnits = kGroups * 4 * kVecs / kThreads;  // units per thread
  constexpr int kChunks = D_PAD * kGroups / kThreads;     // 16-byte output chunks per thread
  static_assert(kGroups >= 8 && kUnits * kThreads == kGroups * 4 * kVecs && kChunks * kThreads == D_PAD * kGroups,
                "tile shape");
  const int b = bh / a.heads_kv, h = bh % a.heads_kv;
  const int first = tile * kTokens;
  const T* base = static_cast<const T*>(a.v) + b * a.v_strides.b + h * a.v_strides.h;
  uint4 raw[kUnits][4];
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    const int u = threadIdx.x + i * kThreads;
    const int c = u % kVecs, quad = (u / kVecs) % 4, grp = u / (4 * kVecs);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int t = first + permuted_token(16 * grp + 4 * quad + r);
      const bool in = t < a.nk && c * kVec < a.head_dim;
      const int64_t row = kOrder && in ? __ldg(a.key_order + static_cast<int64_t>(b) * a.nk + t) : t;
      raw[i][r] = in ? load8<kAligned>(base + row * a.v_strides.n + c * kVec) : make_uint4(0, 0, 0, 0);
    }
  }
  wait_stats<D_PAD>(a, g, bh);
  // stat[d]: channel d's 448 / amax, computed once for the CTA from the (b, hkv)'s maxima (read from L2:
  // other CTAs raised them).
  if (threadIdx.x < D_PAD) {
    const float amax = __uint_as_float(__ldcg(v_max<D_PAD>(a, g, bh) + threadIdx.x));
    if (tile == 0 && threadIdx.x < a.head_dim) {
      a.v_scale[static_cast<int64_t>(bh) * a.head_dim + threadIdx.x] = __fmul_rn(amax, kInvFp8Max);
    }
    stat[threadIdx.x] = inv_scale(kFp8E4M3Max, amax);
  }
  __syncthreads();
  uint32_t* words = reinterpret_cast<uint32_t*>(smem);
  // Tokens past Nk (the last tile only) give zeros, as quant.cu writes them; the other tiles skip the
  // test. Word of channel d = c * kVec + j: its row's chunk grp ^ (c & 7), plus j rows.
  const auto quantize = [&](auto full) {
#pragma unroll
    for (int i = 0; i < kUnits; ++i) {
      const int u = threadIdx.x + i * kThreads;
      const int c = u % kVecs, quad = (u / kVecs) % 4, grp = u / (4 * kVecs);
      bool valid[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) valid[r] = full || first + permuted_token(16 * grp + 4 * quad + r) < a.nk;
      uint32_t* word = words + (c * kVec * kTokens + 16 * (grp ^ (c & 7))) / 4 + quad;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float inv = stat[c * kVec + j];
        float y[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) y[r] = valid[r] ? __fmul_rn(element<T>(raw[i][r], j), inv) : 0.f;
        word[j * kTokens / 4] = to_fp8x2(y[0], y[1]) | static_cast<uint32_t>(to_fp8x2(y[2], y[3])) << 16;
      }
    }
  };
  if (first + kTokens <= a.nk) {
    quantize(std::true_type{});
  } else {
    quantize(std::false_type{});
  }
  __syncthreads();
  uint8_t* out = a.vt + static_cast<int64_t>(bh) * D_PAD * a.n_pad;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int u = threadIdx.x + i * kThreads;
    const int grp = u % kGroups, d = u / kGroups;
    const int t = first + 16 * grp;
    if (t < a.n_pad) {
      const uint4 val = *reinterpret_cast<const uint4*>(smem + d * kTokens + 16 * (grp ^ ((d / kVec) & 7)));
      *reinterpret_cast<uint4*>(out + static_cast<int64_t>(d) * a.n_pad + t) = val;
    }
  }
}

// K block `blk` of (b, hkv) = bh: 128 keys minus k_mean, one scale (quant.cu's quant_k_kernel). The
// whole block stays in registers (as loaded: 8 halves in 4 words) between its amax and its
// quantization, which converts it again.
template <typename T, int D_PAD, bool kAligned, bool kOrder>
__device__ __forceinline__ void quant_k_block(const QuantQkvArgs& a, const QkvGrid& g, int blk, int bh,
                                              uint8_t* smem, float* stat, float* warp_max) {
  constexpr int kVecs = D_PAD / kVec, kRows = kThreads / kVecs, kPasses = kQkvKeyBlock / kRows;
  const int c = threadIdx.x % kVecs, row = threadIdx.x / kVecs;
  const int b = bh / a.heads_kv, h = bh % a.heads_kv;
  const int first = blk * kQkvKeyBlock;
  const bool active = c * kVec < a.head_dim;
  const T* base = static_cast<const T*>(a.k) + b * a.k_strides.b + h * a.k_strides.h + c * kVec;
  uint4 raw[kPasses];
  load_tile<kAligned, kRows>(base, a.k_strides.n, first + row, a.nk, active, raw,
                             kOrder ? a.key_order + static_cast<int64_t>(b) * a.nk : nullptr);
  if (a.smooth_k) {
    k_mean_of<D_PAD>(a, g, bh, reinterpret_cast<float*>(smem), stat);
    if (blk == 0 && threadIdx.x < a.head_dim) {
      a.k_mean[static_cast<int64_t>(bh) * a.head_dim + threadIdx.x] = stat[threadIdx.x];
    }
  } else {
    if (threadIdx.x < D_PAD) stat[threadIdx.x] = 0.f;
    __syncthreads();
  }
  const float* km = stat + c * kVec;  // this thread's channels of k_mean (zeros without smooth-K)
  // max |x - k_mean| over the thread's tokens below Nk, per channel from their max and min (max2_nan):
  // the same bits as over every x - k_mean, NaN included, in a quarter of the instructions.
  float amax = 0.f;
  if (first + row < a.nk) {  // the passes below Nk come first
    uint32_t hi[kVec / 2] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w};
    uint32_t lo[kVec / 2] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w};
#pragma unroll
    for (int p = 1; p < kPasses; ++p) {
      if (first + row + p * kRows < a.nk) {
        const uint32_t w[kVec / 2] = {raw[p].x, raw[p].y, raw[p].z, raw[p].w};
#pragma unroll
        for (int i = 0; i < kVec / 2; ++i) {
          hi[i] = max2_nan<T>(hi[i], w[i]);
          lo[i] = min2_nan<T>(lo[i], w[i]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const uint32_t sh = j % 2 ? 16 : 0;
      const float x_hi = half_bits_to_float<T>((hi[j / 2] >> sh) & 0xffffu);
      const float x_lo = half_bits_to_float<T>((lo[j / 2] >> sh) & 0xffffu);
      amax = amax2(amax, amax2(fabsf(__fsub_rn(x_hi, km[j])), fabsf(__fsub_rn(x_lo, km[j]))));
    }
  }
  amax = warp_amax(amax);
  if (threadIdx.x % kWarp == 0) warp_max[threadIdx.x / kWarp] = amax;
  __syncthreads();
  amax = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) amax = amax2(amax, warp_max[w]);
  const float inv = inv_scale(kInt8Max, amax);
  int8_t* out = a.k_int8 + static_cast<int64_t>(bh) * a.nk * D_PAD + c * kVec;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int t = first + row + p * kRows;
    opaque(raw[p]);
    if (t < a.nk) {
      float x[kVec];
      unpack8<T>(raw[p], x);
#pragma unroll
      for (int j = 0; j < kVec; ++j) x[j] = __fsub_rn(x[j], km[j]);
      *reinterpret_cast<uint2*>(out + static_cast<int64_t>(t) * D_PAD) = int8x8(x, inv);
    }
  }
  if (threadIdx.x == 0) {
    a.k_scale[static_cast<int64_t>(bh) * g.k_blocks + blk] = __fmul_rn(amax, 1.0f / kInt8Max);
  }
}

// Q tile `tile` of (b, hq) = bh: 128 tokens, one scale per token (quant.cu's quant_q_kernel), plus
// corr = sm_scale * q . k_mean when a.corr is set. A token's channels lie in kQThreads = D_PAD / 32
// consecutive threads, kQChunks = 4 chunks of 8 channels each, interleaved: thread c holds chunks c,
// c + kQThreads, ..., so each load and store of a warp covers whole 64- or 32-byte runs of its tokens.
// (Eight channels a thread and 16 threads a token, a token's max took four shuffles and each thread an
// IEEE division for 8 elements: 11 instructions an element against 6 here, bench/NOTES.md.)
// quant_q_kernel gives lane l of a warp the channels [l * E, l * E + E) (E = D_PAD / 32), sums each
// lane's products in channel order and then the lanes with __shfl_xor offsets 16, 8, .., 1. Lane
// 8 j + kLanes c + l (kLanes = 8 / E) is part l of chunk c + kQThreads j here: offsets 16 and 8 pair
// a thread's own chunks, offsets kLanes .. 4 cross threads (offset / kLanes), the smaller ones the
// parts of a chunk; reproduced in that order, corr has the same bits.
template <typename T, int D_PAD, bool kAligned>
__device__ __forceinline__ void quant_q_tile(const QuantQkvArgs& a, const QkvGrid& g, int tile, int bh,
                                             uint8_t* smem, float* stat) {
  constexpr int kQChunks = 4, kQThreads = D_PAD / (kVec * kQChunks), kRows = kThreads / kQThreads;
  constexpr int kPasses = kQTokens / kRows;
  constexpr int kE = D_PAD / kWarp, kLanes = kVec / kE;
  static_assert(kQThreads * kLanes == 8 && kPasses * kRows == kQTokens, "Q tile shape");
  const int c = threadIdx.x % kQThreads, row = threadIdx.x / kQThreads;
  const int b = bh / a.heads_q, h = bh % a.heads_q;
  const int first = tile * kQTokens;
  const T* base = static_cast<const T*>(a.q) + b * a.q_strides.b + h * a.q_strides.h + (first + row) * a.q_strides.n;
  const int64_t step = int64_t{kRows} * a.q_strides.n;
  uint4 raw[kPasses][kQChunks];
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const bool in = first + row + p * kRows < a.nq;
#pragma unroll
    for (int j = 0; j < kQChunks; ++j) {
      const int ch = (c + j * kQThreads) * kVec;
      raw[p][j] = in && ch < a.head_dim ? load8<kAligned>(base + p * step + ch) : make_uint4(0, 0, 0, 0);
    }
  }
  const bool with_corr = a.corr != nullptr;
  if (with_corr) {
    const int bkv = bh / g.kv_group;  // b * Hkv + h / kv_group
    k_mean_of<D_PAD>(a, g, bkv, reinterpret_cast<float*>(smem), stat);
  }
  const int64_t row0 = static_cast<int64_t>(bh) * a.nq + first + row;
  int8_t* out = a.q_int8 + row0 * D_PAD + c * kVec;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const bool in = first + row + p * kRows < a.nq;
    float amax = amax8<T>(raw[p][0]);
#pragma unroll
    for (int j = 1; j < kQChunks; ++j) amax = amax2(amax, amax8<T>(raw[p][j]));
#pragma unroll
    for (int o = kQThreads / 2; o > 0; o >>= 1) amax = amax2(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float inv = inv_scale(kInt8Max, amax);
    if (in) {
#pragma unroll
      for (int j = 0; j < kQChunks; ++j) {
        float x[kVec];
        unpack8<T>(raw[p][j], x);
        *reinterpret_cast<uint2*>(out + (int64_t{p} * kRows * D_PAD + j * kQThreads * kVec)) = int8x8(x, inv);
      }
      if (c == 0) a.q_scale[row0 + p * kRows] = amax * a.scale_mul;
    }
    if (with_corr) {
      // This thread's channels of k_mean, read from shared memory at each use (volatile) rather than
      // held in registers through all passes.
      const volatile float* km = stat + c * kVec;
      float dot[kQChunks][kLanes];
#pragma unroll
      for (int j = 0; j < kQChunks; ++j) {
        float x[kVec];
        unpack8<T>(raw[p][j], x);
#pragma unroll
        for (int l = 0; l < kLanes; ++l) {
          dot[j][l] = 0.f;
#pragma unroll
          for (int e = 0; e < kE; ++e) {
            dot[j][l] = dot_step(dot[j][l], x[l * kE + e], km[j * kQThreads * kVec + l * kE + e]);
          }
        }
      }
      float s[kLanes];  // offsets 16 and 8: chunks j and j ^ 2, then j ^ 1 (all lanes agree after each)
#pragma unroll
      for (int l = 0; l < kLanes; ++l) s[l] = (dot[0][l] + dot[2][l]) + (dot[1][l] + dot[3][l]);
#pragma unroll
      for (int o = kQThreads / 2; o > 0; o >>= 1) {
#pragma unroll
        for (int l = 0; l < kLanes; ++l) s[l] += __shfl_xor_sync(0xffffffffu, s[l], o);
      }
#pragma unroll
      for (int o = kLanes / 2; o > 0; o >>= 1) {
#pragma unroll
        for (int l = 0; l < o; ++l) s[l] += s[l + o];
      }
      if (in && c == 0) a.corr[row0 + p * kRows] = s[0] * a.sm_scale;
    }
  }
}

enum class ItemKind { kStats, kV, kK, kQ };

struct Item {
  ItemKind kind;
  int index;  // chunk, V tile, K block or Q tile
  int head;   // bh: b * Hkv + hkv, or b * Hq + hq for a Q tile
};

// Items run in steps s = 0, 1, ..., groups + kLookahead - 1: step s holds the stats items of group s
// (s < groups), head by head, then the quantizing items of group s - kLookahead (when that is a group),
// head by head: its V tiles, K blocks and the Q tiles of its kv_group query heads. step_start(s) is
// the first item of step s; step_start(groups + kLookahead) the number of items.
__host__ __device__ __forceinline__ int step_start(const QkvGrid& g, int s) {
  auto heads_before = [&](int groups) { return min(groups * g.group_heads, g.kv_heads); };
  return heads_before(min(s, g.groups)) * g.chunks +
         heads_before(max(0, min(s - kLookahead, g.groups))) * g.head_items;
}

// Item t. Every step holds items, so the step of t is the last s with step_start(s) <= t. The steps walk
// the (b, hkv) heads from the last to the first (head kv_heads - 1 - i at position i): the attention
// kernel behind the quantization draws its tiles from the first heads on, and their INT8 and FP8
// rows, quantized last, are then still in L2 when it starts.
__host__ __device__ __forceinline__ Item item_of(const QkvGrid& g, int t) {
  int lo = 0, hi = g.groups + kLookahead;  // step_start(lo) <= t < step_start(hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (step_start(g, mid) <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  int r = t - step_start(g, lo);
  if (lo < g.groups) {
    const int head0 = lo * g.group_heads, heads = min(g.group_heads, g.kv_heads - head0);
    if (r < heads * g.chunks) return {ItemKind::kStats, r % g.chunks, g.kv_heads - 1 - (head0 + r / g.chunks)};
    r -= heads * g.chunks;
  }
  const int bh = g.kv_heads - 1 - ((lo - kLookahead) * g.group_heads + r / g.head_items);
  r %= g.head_items;
  if (r < g.v_tiles) return {ItemKind::kV, r, bh};
  r -= g.v_tiles;
  if (r < g.k_blocks) return {ItemKind::kK, r, bh};
  r -= g.k_blocks;
  return {ItemKind::kQ, r % g.q_tiles, bh * g.kv_group + r / g.q_tiles};
}

// CTAs per SM: the quantization is bound by the bytes its CTAs keep in flight (bench/NOTES.md), so 4 on
// sm_90, the one GPU it runs on: 64 registers, an 8-byte stack frame around the IEEE division's slow
// path and, in the aligned d_pad 64 kernels, 8 bytes of spills, and still 3-8% faster than 3 CTAs.
// The other archs the module is built for (where nothing launches it) keep 3, without spills.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
constexpr int kCtasPerSm = 4;
#else
constexpr int kCtasPerSm = 3;
#endif

template <typename T, int D_PAD, bool kAligned, bool kOrder>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) quant_qkv_kernel(const QuantQkvArgs a, const QkvGrid g) {
  // The stats rows ([2][kRows][D_PAD] floats, 16 KiB), the staged K chunk partials (at most
  // kMaxChunks x D_PAD floats; K blocks, Q tiles with the correction), or a V CTA's Vᵀ tile.
  constexpr int kStage = kMaxChunks * D_PAD * 4, kStatsRows = 2 * kThreads * kVec * 4;
  __shared__ __align__(16) uint8_t smem[cmax(kVTileBytes, cmax(kStage, kStatsRows))];
  __shared__ float stat[D_PAD];
  __shared__ float warp_max[kWarps];
  __shared__ Item item;
  uint64_t* counters = qkv_counters<D_PAD>(a, g);
#ifdef SAGE_QUANT_TIMES
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  SAGE_QUANT_TIME(kQtSm, sm);
  SAGE_QUANT_TIME(kQtStart, quant_now());
#endif
  if (blockIdx.x < g.clear_slices) {  // a clearing CTA (see the top of the file): no item
    grid_dependency_wait();              // the kernel before may still use this memory
    allow_dependent_grid();
    const int slice = static_cast<int>(blockIdx.x);
    clear_share(reinterpret_cast<uint32_t*>(a.workspace + v_max_offset(g.kv_heads, g.chunks, D_PAD)),
                cleared_words(g.kv_heads, g.chunks, D_PAD), slice, g.clear_slices, clear_marks<D_PAD>(a, g) + slice,
                a.clear_nonce);
    return;
  }
  if (threadIdx.x == 0) {
    item = item_of(g, static_cast<int>(blockIdx.x) - g.clear_slices + g.item_base);
  }
  __syncthreads();
  allow_dependent_grid();  // the attention kernel behind it may take SMs as this launch's last CTAs start
  const Item it = item;
  // Clearing CTAs in this launch (no clearing kernel before it): the kernel before may still run, and
  // may have written the inputs.
  if (g.clear_slices > 0) grid_dependency_wait();
  SAGE_QUANT_TIME(kQtKind, static_cast<int>(it.kind));
  switch (it.kind) {
    case ItemKind::kStats:
      qkv_stats<T, D_PAD, kAligned>(a, g, it.index, it.head, smem);
      count_done(counters + it.head, done_step(a));
      break;
    case ItemKind::kV:
      quant_v_tile<T, D_PAD, kAligned, kOrder>(a, g, it.index, it.head, smem, stat);
      break;
    case ItemKind::kK:
      quant_k_block<T, D_PAD, kAligned, kOrder>(a, g, it.index, it.head, smem, stat, warp_max);
      break;
    case ItemKind::kQ:
      quant_q_tile<T, D_PAD, kAligned>(a, g, it.index, it.head, smem, stat);
      break;
  }
  // Every CTA, also one that touched nothing cleared (with clear_kernel): the attention kernel behind
  // this launch waits for its completion, and reads a spare int (its tile counter) cleared with them.
  grid_dependency_wait();
  SAGE_QUANT_TIME(kQtEnd, quant_now());
}

// Launches quant_qkv_kernel for `ctas` items from g.item_base, after its g.clear_slices clearing CTAs;
// with `after_clear`, as the dependent of the kernel just before it in the stream (clear_kernel's, or
// whatever precedes the call when the launch clears; programmatic stream serialization).
template <typename T, int D_PAD, bool kAligned, bool kOrder>
cudaError_t launch_items(const QuantQkvArgs& a, const QkvGrid& g, int64_t ctas, bool after_clear, cudaStream_t stream) {
  return launch_kernel(quant_qkv_kernel<T, D_PAD, kAligned, kOrder>, dim3(static_cast<unsigned>(g.clear_slices + ctas)),
                       dim3(kThreads), 0, stream, after_clear, a, g);
}

// A view whose 8-element runs can be read as 16-byte words: a 16-byte aligned base, and strides that
// are multiples of 8 elements (those of dimensions of size 1 never move the pointer).
bool vec_aligned(const void* p, Strides3 s, int batch, int heads, int n) {
  auto ok = [](int64_t stride, int size) { return size == 1 || stride % kVec == 0; };
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && ok(s.b, batch) && ok(s.h, heads) && ok(s.n, n);
}

// The call's grid (see the top of the file): its items, their groups, and whether one launch takes
// them all (g.waits). `elem_bytes`: bytes of an input element. False where the items do not fit an int.
template <int D_PAD>
bool plan_grid(const QuantQkvArgs& a, int64_t elem_bytes, QkvGrid* out) {
  QkvGrid g{};
  g.chunk = stats_chunk(a.batch, a.heads_kv, a.nk, D_PAD);
  g.chunks = (a.nk + g.chunk - 1) / g.chunk;
  g.v_tiles = (a.n_pad + kVTileBytes / D_PAD - 1) / (kVTileBytes / D_PAD);
  g.k_blocks = (a.nk + kQkvKeyBlock - 1) / kQkvKeyBlock;
  g.q_tiles = (a.nq + kQTokens - 1) / kQTokens;
  g.kv_group = a.heads_q / a.heads_kv;
  const int64_t kv_heads = static_cast<int64_t>(a.batch) * a.heads_kv;
  const int64_t head_items = int64_t{g.v_tiles} + g.k_blocks + int64_t{g.kv_group} * g.q_tiles;
  if (kv_heads * (g.chunks + head_items) >= (int64_t{1} << 31)) return false;
  // Groups of heads whose K and V take at most kGroupBytes, one head at least; one group of all heads
  // when a stats item reads more than kOverlapStatsBytes (then its time outlasts what the lookahead
  // leaves it), whose stats items then go in a launch of their own (see launch).
  const int64_t head_bytes = int64_t{2} * a.nk * a.head_dim * elem_bytes;
  const int64_t stats_item_bytes = int64_t{2} * g.chunk * a.head_dim * elem_bytes;
  g.waits = stats_item_bytes <= kOverlapStatsBytes;
  int64_t group_heads = g.waits ? kGroupBytes / head_bytes : kv_heads;
  group_heads = group_heads < 1 ? 1 : (group_heads > kv_heads ? kv_heads : group_heads);
  g.kv_heads = static_cast<int>(kv_heads);
  g.group_heads = static_cast<int>(group_heads);
  g.groups = static_cast<int>((kv_heads + group_heads - 1) / group_heads);
  g.head_items = static_cast<int>(head_items);
  *out = g;
  return true;
}

// Items of the grid, and its stats items (the first ones).
int64_t grid_items(const QkvGrid& g) { return int64_t{g.kv_heads} * (g.chunks + g.head_items); }
int64_t grid_stats_items(const QkvGrid& g) { return int64_t{g.kv_heads} * g.chunks; }

template <typename T, int D_PAD, bool kAligned, bool kOrder>
cudaError_t launch(const QuantQkvArgs& a, cudaStream_t stream) {
  QkvGrid g;
  if (!plan_grid<D_PAD>(a, sizeof(T), &g)) return cudaErrorInvalidValue;
  const int64_t kv_heads = g.kv_heads, items = grid_items(g);
  // V's maxima and the counters, cleared together (4-byte words each; the maxima start 16-byte
  // aligned: a multiple of 64 floats into the workspace), by the first launch's first CTAs (clear_nonce)
  // or by clear_kernel before it: one 16-byte store per thread and pass (the last few words one by
  // one), at least one CTA, at most kClearCtas.
  const int64_t words = cleared_words(kv_heads, g.chunks, D_PAD);
  const int64_t clear_ctas = std::clamp<int64_t>((words / 4 + kThreads - 1) / kThreads, 1, kClearCtas);
  cudaError_t err = cudaSuccess;
  if (a.clear_nonce != 0) {
    g.clear_slices = static_cast<int>(clear_ctas);
  } else {
    float* cleared = a.workspace + v_max_offset(kv_heads, g.chunks, D_PAD);
    err = launch_kernel(clear_kernel, dim3(static_cast<unsigned>(clear_ctas)), dim3(kThreads), 0, stream, true,
                        reinterpret_cast<uint32_t*>(cleared), words);
    if (err != cudaSuccess) return err;
  }
  if (g.waits) return launch_items<T, D_PAD, kAligned, kOrder>(a, g, items, true, stream);
  // Long stats items: their one group in one launch left the quantizing CTAs waiting (10-13% slower
  // than two launches at b=1, n >= 16384), so the stats items go first in a launch of their own and
  // the quantizing items, which then find every count complete, in a second one.
  const int64_t stats_items = grid_stats_items(g);
  err = launch_items<T, D_PAD, kAligned, kOrder>(a, g, stats_items, true, stream);
  if (err != cudaSuccess) return err;
  g.item_base = static_cast<int>(stats_items);
  g.clear_slices = 0;  // the first launch has cleared and counted everything
  return launch_items<T, D_PAD, kAligned, kOrder>(a, g, items - stats_items, false, stream);
}

#ifdef SAGEATTN_FAMILY_SM90
constexpr int kKeyOrderThreads = 1024;

// Batch entry blockIdx.x's key order under a key-padding mask (QuantQkvArgs::key_mask): key_order[b, i]
// the input row of its i-th key, the kept keys first, then the others, each in input order (a stable
// partition), and kv_len[b] the kept count. Two passes over the mask in chunks of kKeyOrderThreads keys,
// one key a thread: the count, then each key's place, its warp's kept keys before it (a ballot) plus
// the warps' before it (their counts scanned in shared memory). Launched as a programmatic dependent of
// the kernel before it (which may have written the mask), and waits for it first.
__global__ void __launch_bounds__(kKeyOrderThreads)
    key_order_kernel(const uint8_t* mask, int64_t sb, int64_t sn, int nk, int* order, int* kv_len) {
  __shared__ int warp_before[kKeyOrderThreads / 32];
  grid_dependency_wait();
  const int b = static_cast<int>(blockIdx.x), lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint8_t* row = mask + b * sb;
  int* out = order + static_cast<int64_t>(b) * nk;
  int kept = 0;
  for (int c = 0; c < nk; c += kKeyOrderThreads) {
    const int t = c + static_cast<int>(threadIdx.x);
    kept += __syncthreads_count(t < nk && row[t * sn] != 0);
  }
  int before = 0;  // kept keys before this chunk
  for (int c = 0; c < nk; c += kKeyOrderThreads) {
    const int t = c + static_cast<int>(threadIdx.x);
    const bool keep = t < nk && row[t * sn] != 0;
    const unsigned ballot = __ballot_sync(0xffffffffu, keep);
    if (lane == 0) warp_before[warp] = __popc(ballot);
    __syncthreads();
    if (warp == 0) {  // exclusive scan of the warps' counts
      const int n = warp_before[lane];
      int incl = n;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int x = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += x;
      }
      warp_before[lane] = incl - n;
    }
    __syncthreads();
    const int kept_before = before + warp_before[warp] + __popc(ballot & ((1u << lane) - 1u));
    if (t < nk) out[keep ? kept_before : kept + (t - kept_before)] = t;
    before += __syncthreads_count(keep);
  }
  if (threadIdx.x == 0) kv_len[b] = kept;
}
#endif

template <typename T, int D_PAD>
cudaError_t launch_aligned(const QuantQkvArgs& a, cudaStream_t stream) {
  const bool aligned = vec_aligned(a.q, a.q_strides, a.batch, a.heads_q, a.nq) &&
                       vec_aligned(a.k, a.k_strides, a.batch, a.heads_kv, a.nk) &&
                       vec_aligned(a.v, a.v_strides, a.batch, a.heads_kv, a.nk);
  if (a.key_order != nullptr) {
#ifdef SAGEATTN_FAMILY_SM90  // attn_sm90 alone passes a key order: the kernels that read it are its module's
    if (a.key_mask != nullptr) {
      if (a.kv_len == nullptr) return cudaErrorInvalidValue;
      const cudaError_t err = launch_kernel(key_order_kernel, dim3(static_cast<unsigned>(a.batch)),
                                            dim3(kKeyOrderThreads), 0, stream, true, a.key_mask, a.key_mask_sb,
                                            a.key_mask_sn, a.nk, a.key_order, a.kv_len);
      if (err != cudaSuccess) return err;
    }
    return aligned ? launch<T, D_PAD, true, true>(a, stream) : launch<T, D_PAD, false, true>(a, stream);
#else
    return cudaErrorInvalidValue;
#endif
  }
  return aligned ? launch<T, D_PAD, true, false>(a, stream) : launch<T, D_PAD, false, false>(a, stream);
}

template <typename T>
cudaError_t launch_typed(const QuantQkvArgs& a, cudaStream_t stream) {
  switch (a.d_pad) {
    case 64:
      return launch_aligned<T, 64>(a, stream);
    case 128:
      return launch_aligned<T, 128>(a, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

namespace {
// Stats chunks per (b, hkv) of a call of these sizes (plan_grid's g.chunks).
int call_chunks(int batch, int heads_kv, int nk, int d_pad) {
  const int chunk = stats_chunk(batch, heads_kv, nk, d_pad);
  return (nk + chunk - 1) / chunk;
}
// Where the int counters start in the workspace of a call of these sizes, in floats.
int64_t counters_start(int batch, int heads_kv, int nk, int d_pad) {
  return counters_offset(static_cast<int64_t>(batch) * heads_kv, call_chunks(batch, heads_kv, nk, d_pad), d_pad);
}
}  // namespace

int64_t quant_qkv_workspace_floats(int batch, int heads_kv, int nk, int d_pad) {
  const int64_t kv_heads = static_cast<int64_t>(batch) * heads_kv;
  return marks_offset(kv_heads, call_chunks(batch, heads_kv, nk, d_pad), d_pad) + 2 * kClearCtas;
}

uint64_t quant_qkv_clear_nonce(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();  // e.g. the legacy stream while another captures: clear by kernel
    return 0;
  }
  if (status != cudaStreamCaptureStatusNone) return 0;
  static std::atomic<uint64_t> next{(static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()};
  uint64_t nonce = 0;
  while (nonce == 0) nonce = next.fetch_add(1, std::memory_order_relaxed);
  return nonce;
}

int64_t quant_qkv_spare_int_offset(int batch, int heads_kv, int nk, int d_pad) {
  return counters_start(batch, heads_kv, nk, d_pad) + spare_ints(static_cast<int64_t>(batch) * heads_kv);
}

#ifdef SAGE_QUANT_TIMES
// bench/call_sm90.cu's copy of the records (quant.h).
cudaError_t quant_qkv_times(long long* host, int ctas) {
  const int n = ctas < kQuantTimesMax ? ctas : kQuantTimesMax;
  cudaError_t err = cudaMemcpyFromSymbol(host, g_quant_times, sizeof(long long) * kQuantTimeFields * n);
  void* p = nullptr;
  if (err == cudaSuccess) err = cudaGetSymbolAddress(&p, g_quant_times);
  return err == cudaSuccess ? cudaMemset(p, 0, sizeof(g_quant_times)) : err;
}
#endif

cudaError_t launch_quant_qkv_sm90(const QuantQkvArgs& args, cudaStream_t stream) {
  const bool shapes_ok = args.batch >= 1 && args.heads_kv >= 1 && args.heads_q % args.heads_kv == 0 &&
                         args.nk >= 1 && args.nq >= 0 && args.nq < kMaxTokens && args.n_pad < kMaxTokens &&
                         args.head_dim % kVec == 0 && args.head_dim >= kVec && args.head_dim <= args.d_pad &&
                         args.n_pad >= args.nk && args.n_pad % kQkvKeyGroup == 0;
  if (!shapes_ok || (args.corr != nullptr && !args.smooth_k) || (args.smooth_k && args.k_mean == nullptr)) {
    return cudaErrorInvalidValue;
  }
  return args.type == HalfType::kFloat16 ? launch_typed<__half>(args, stream)
                                          : launch_typed<__nv_bfloat16>(args, stream);
}

}  // namespace sage
