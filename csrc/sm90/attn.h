// Launcher of the Hopper attention kernel (csrc/sm90/attn_int8_fp8.cu): INT8 Q·Kᵀ with
// wgmma m64n128k32 s8, FP8 e4m3 P·V with wgmma m64nDk32, TMA loads, warp specialization.
// sm_90a only (wgmma, setmaxnreg); plain C++ interface, no torch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "sage_types.h"

namespace sage {

// Keys per inner step. It must equal K's quantization block, so one k_scale covers one step, and
// the P·V product of one step is promoted into the FP32 output once (Hopper's FP8 MMA adds into an
// accumulator of about 22 mantissa bits; a fresh accumulator per 128 keys keeps that error small).
constexpr int kSm90KeyBlock = 128;
// Vᵀ keys are permuted within groups of this many keys (see quant_v_fp8's permute_keys); n_pad
// of Vᵀ must be a multiple of it (TMA also needs 16-byte row strides).
constexpr int kSm90KeyPermuteGroup = 16;

// Query/key tensors are [B, H, N, d_pad] with a unit last stride; strides are in elements (= bytes
// for the 8-bit tensors). TMA needs the base and the three outer strides in bytes to be multiples
// of 16, which bindings.cpp checks; the output is written by TMA too (its base and strides in bytes
// multiples of 16: the op allocates it so), else the launch returns cudaErrorInvalidValue.
struct AttnSm90Args {
  const int8_t* q;           // [B, Hq, Nq, d_pad] INT8, one scale per token
  Strides3 q_strides;
  const int8_t* k;           // [B, Hkv, Nk, d_pad] INT8 of K minus its mean, one scale per 128 keys
  Strides3 k_strides;
  const uint8_t* vt;         // [B, Hkv, d_pad, n_pad] FP8 e4m3 of Vᵀ, keys permuted (quant_v_fp8)
  Strides3 vt_strides;       // (b, h, channel); keys are contiguous
  int n_pad;                 // Vᵀ's key extent: >= Nk, a multiple of 16, zeros past Nk
  const float* q_scale;      // [B, Hq, Nq]: amax / 127 * sm_scale * log2(e)
  Strides3 q_scale_strides;  // (b, h, n)
  const float* k_scale;      // [B, Hkv, ceil(Nk / 128)]
  Strides3 k_scale_strides;  // (b, h, block)
  const float* v_scale;      // [B, Hkv, head_dim]: v_amax / 448 per channel, unit channel stride
  Strides3 v_scale_strides;  // (b, h, channel)
  const float* corr;         // [B, Hq, Nq] LSE correction of smooth-K, added to lse; may be null
  Strides3 corr_strides;
  void* out;                 // [B, Hq, Nq, head_dim] of out_type, unit last stride, 16-byte aligned
  Strides3 out_strides;
  HalfType out_type;
  float* lse;                // [B, Hq, Nq] natural-log LSE; null when not wanted
  Strides3 lse_strides;
  int batch, heads_q, heads_kv, nq, nk, head_dim, d_pad;
  // [B] int32: batch entry b attends to its keys 0 .. kv_len[b] - 1 only (0 <= kv_len[b] <= nk; 0:
  // its rows give 0 and an LSE of -inf); null: every batch entry to all nk keys. A key-padding mask
  // becomes this once the kept keys are moved to the front (sageattention/cuda_sm90.py). Not with a
  // split (split_parts > 1).
  const int* kv_len;
  bool causal;               // top-left aligned: query i sees keys j <= i
  // 1 + kSm90SplitCounters ints, zero at launch, for this launch alone: [0] the counter the kernel's
  // CTAs draw their tiles from, then the split tiles' counters (AttnSm90Split).
  int* tile_counter;
  // The split of the last wave's tiles (attn_sm90_split_plan's first and parts; parts <= 1: none) and
  // its partials_floats floats of workspace, no initial contents (null when nothing is split).
  int split_first, split_parts;
  float* split_partials;
  // Causal: the tiles from causal_tail_first on, those of the last causal_tail_heads (b, h) heads, are
  // numbered row block by row block (TileOf). Set by the launcher.
  int causal_tail_first, causal_tail_heads;
  // Non-causal: the light last row blocks (fewer rows than a tile holds) of the first light_heads
  // (b, h) heads (all of them, or none) are drawn after every other whole tile (light_last_tile); 0:
  // in TileOf's order. Set by the launcher.
  int light_heads;
};

// Splitting the last wave's tiles along the keys (non-causal): with T tiles on S SMs, the last T mod S
// tiles (all of them when T < S) would keep that many SMs busy while the others idle. Each of them
// runs instead as `parts` parts over consecutive ranges of its key blocks, drawn like tiles; a part
// writes its rows' unnormalized output, running max and row sum (float32) to the workspace, and the
// tile's last part to finish (a counter per tile and consumer warpgroup) merges them in part order and
// writes the output. Tiles before `first` run whole, as they do when nothing is split.
struct AttnSm90Split {
  int first;                // tiles before it run whole
  int parts;                // parts per tile from `first` on; 1: no tile is split
  int64_t partials_floats;  // float32 workspace the parts need
  int rows;                 // query rows per tile; tiles are numbered (b * Hq + h) * ceil(Nq / rows) + row block
};
// Split-tile counters a launch may need, at most (tile_counter's ints after the first).
constexpr int kSm90SplitCounters = 1023;
// Parts per split tile, at most.
constexpr int kSm90MaxSplitParts = 4;
// The work items a launch's CTAs draw: its tiles, the `parts` parts of each of those from `first` on
// counted instead of the tile (AttnSm90Args::split_first, split_parts; the kernel's Work).
__host__ __device__ inline int64_t sm90_work_items(int64_t tiles, int first, int parts) {
  return first + (tiles - first) * parts;
}
// The split for a launch of these sizes on `sms` SMs: the part count that minimizes the last wave's
// time in a model where each part costs its key blocks plus a fixed overhead; none for causal
// attention (its tiles are unequal, and the heaviest go first).
AttnSm90Split attn_sm90_split_plan(int batch, int heads_q, int nq, int nk, int d_pad, bool causal, int sms);

// Checks nothing the caller already checked (bindings.cpp). Returns cudaErrorInvalidValue for a
// d_pad other than 64 or 128, a head_dim that is not a multiple of 8 or exceeds d_pad, no
// tile_counter, 2^31 tiles (64 x consumer warpgroups query rows of one head each) or more, a split
// (split_parts > 1) of causal attention or with kv_len, with more than kSm90MaxSplitParts parts or parts of no key
// block, more counters than kSm90SplitCounters or no workspace, or tensors the TMA unit cannot describe;
// cudaErrorNoKernelImageForDevice on a GPU other than sm_90; cudaErrorNotSupported when the driver has
// no cuTensorMapEncodeTiled.
cudaError_t launch_qk_int8_sv_f8_attn_sm90(const AttnSm90Args& args, cudaStream_t stream);

}  // namespace sage
