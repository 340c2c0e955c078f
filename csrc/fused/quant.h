// Fused quantization launchers (csrc/fused/quant.cu, quant_qkv.cu). Arithmetic matches
// sageattention.reference: x_int8 = rint(x * (127 / amax)) with round-half-even and IEEE division,
// scale = amax / 127.
#pragma once

#include <cuda_runtime.h>

#include "sage_types.h"
#include "sm90/attn.h"

namespace sage {

// INT8 Q with one scale per token. q: [B, H, N, D] view; q_int8: [B, H, N, d_pad] contiguous;
// q_scale: [B, H, N] contiguous, amax * scale_mul (scale_mul = sm_scale * log2(e) / 127).
// When corr is non-null, also corr[b, h, n] = sm_scale * q . k_mean[b, h / kv_group, :]
// (k_mean: [B, Hkv, D] contiguous float32): the LSE correction of smooth-K.
cudaError_t launch_quant_q_per_token(const void* q, HalfType type, Strides3 qs, int batch, int heads, int n,
                                     int head_dim, int d_pad, float scale_mul, int8_t* q_int8, float* q_scale,
                                     const float* k_mean, int kv_group, float sm_scale, float* corr,
                                     cudaStream_t stream);

// INT8 K with one scale per block of `block` tokens, after subtracting k_mean (when non-null).
// k_int8: [B, H, N, d_pad] contiguous; k_scale: [B, H, ceil(N / block)] contiguous.
//
// Two-level K when k_residual ([B, H, N, d_pad] contiguous) is non-null: k1 = rint(x * (127 / amax))
// into k_int8 as above, then the rounding residual as one fused multiply-add, fma(x, 127 / amax, -k1),
// times 254 and rounded: k2 into k_residual; k_scale = amax * kKResidualScale (sage_types.h). Bit for
// bit the Triton kernel's and quantize_per_block_ref(residual=True)'s digits and scale.
cudaError_t launch_quant_k_per_block(const void* k, HalfType type, Strides3 ks, int batch, int heads, int n,
                                     int head_dim, int d_pad, int block, const float* k_mean, int8_t* k_int8,
                                     int8_t* k_residual, float* k_scale, cudaStream_t stream);

// FP8 e4m3 V per channel, transposed: vt[b, h, d, token] = fp8(v * 448 / v_amax[b, h, d]).
// vt: [B, H, d_pad, n_pad] contiguous (n_pad >= N); v_amax: [B, H, D] contiguous float32. Every
// slot is written: channels past D and tokens past N (up to n_pad) hold zeros.
//
// permute_keys (n_pad a multiple of 16): within each group of 16 tokens, slot 4q + r (q = 0..3,
// r = 0..3) holds token 8 * (r / 2) + 2q + (r % 2) of the group:
//     slot  0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15
//     token 0  1  8  9  2  3 10 11  4  5 12 13  6  7 14 15
// This is the Vᵀ the FP8 P·V kernels multiply with (csrc/sm90 with wgmma, csrc/sm89 with mma.sync
// m16n8k32, whose register fragments are laid out alike): their P fragment takes a thread's FP32
// accumulator values, which cover tokens {2q, 2q+1, 8+2q, 9+2q} of each 16, in their natural order
// into the 8-bit A slots k = {4q..4q+3}; permuting V's tokens the same way makes every product pair
// the right P and V. sageattention.reference.permute_keys_sm90 is the same map.
cudaError_t launch_quant_v_fp8_transposed(const void* v, HalfType type, Strides3 vs, int batch, int heads,
                                          int n, int head_dim, int d_pad, int n_pad, const float* v_amax,
                                          uint8_t* vt, bool permute_keys, cudaStream_t stream);

// Keys per block of K's INT8 scale and the Vᵀ key padding: the sm_90a kernel's (csrc/sm90/attn.h),
// which launch_quant_qkv_sm90 quantizes for.
constexpr int kQkvKeyBlock = kSm90KeyBlock;
constexpr int kQkvKeyGroup = kSm90KeyPermuteGroup;

// Q, K and V of one sm_90a attention call in one kernel launch (two for long sequences) that clears the
// counters it keeps in the workspace itself (clear_nonce), or after a small kernel that does
// (csrc/fused/quant_qkv.cu), each output bit for bit what the launchers above give:
//   k_mean [B, Hkv, D] (smooth_k; else null): the mean of K over its tokens (a float32 sum in an
//     order of its own, then divided by Nk);
//   q_int8 [B, Hq, Nq, d_pad], q_scale [B, Hq, Nq], corr [B, Hq, Nq] (null: no correction; set only
//     with smooth_k): launch_quant_q_per_token with that k_mean and kv_group = Hq / Hkv;
//   k_int8 [B, Hkv, Nk, d_pad], k_scale [B, Hkv, ceil(Nk / 128)]: launch_quant_k_per_block with block
//     128 and that k_mean (none without smooth_k);
//   vt [B, Hkv, d_pad, n_pad]: launch_quant_v_fp8_transposed with permute_keys and v_amax = max |V|
//     per channel (amax2: NaN kept); n_pad a multiple of 16, at least Nk;
//   v_scale [B, Hkv, D]: v_amax * float(1 / 448), one float32 multiply.
// All outputs contiguous. workspace: quant_qkv_workspace_floats(...) 4-byte words (K's float32
// partials, then V's channel maxima and int counters, which the launcher clears), no initial contents;
// it must not be shared with a launch that may run at once.
// Inputs: [B, H, N, D] views with a unit last stride, D a multiple of 8 and at most d_pad (64 or
// 128); 16-byte loads where the base and strides allow, 2-byte loads otherwise.
struct QuantQkvArgs {
  const void* q;
  const void* k;
  const void* v;
  HalfType type;
  Strides3 q_strides, k_strides, v_strides;
  int batch, heads_q, heads_kv, nq, nk, head_dim, d_pad, n_pad;
  bool smooth_k;
  float sm_scale, scale_mul;
  int8_t* q_int8;
  float* q_scale;
  float* corr;
  int8_t* k_int8;
  float* k_scale;
  uint8_t* vt;
  float* v_scale;
  float* k_mean;
  // [B, Nk] int32 or null: token t of batch entry b's K and V is their input row key_order[b * nk + t]
  // (a key-padding mask's kept keys first; the statistics, a mean and a maximum over all rows, do not
  // depend on it). Only in the sm90 module.
  int* key_order;
  // A key-padding mask or null: key_mask[b * key_mask_sb + t * key_mask_sn] nonzero keeps key t of batch
  // entry b (uint8, any strides). With it the launch first writes key_order itself, each batch entry's
  // kept keys first, then the others, each in input order, and kv_len [B] int32, the kept counts
  // (launch_key_order).
  const uint8_t* key_mask;
  int64_t key_mask_sb, key_mask_sn;
  int* kv_len;
  float* workspace;
  // Nonzero: the launch's first CTAs clear V's maxima and the counters, and each marks its share done
  // with this value in the workspace (the items that use them wait for the marks, or for counts made
  // of this value); it must differ from every value an earlier launch may have left there:
  // quant_qkv_clear_nonce gives one. 0: a kernel launched before clears them (one launch more, as a
  // launch that will be replayed with the same arguments, in a CUDA graph, needs).
  uint64_t clear_nonce;
};

// A clear_nonce for a launch into `stream`: a value of a process-wide sequence that starts at a random
// point and never gives 0, or 0 while the stream is being captured into a CUDA graph (whose replays
// repeat their arguments).
uint64_t quant_qkv_clear_nonce(cudaStream_t stream);

int64_t quant_qkv_workspace_floats(int batch, int heads_kv, int nk, int d_pad);
// Ints of the workspace that launch_quant_qkv_sm90 sets to zero (with its counters) and does not use:
// the attention launched after it keeps its tile counter and its split tiles' counters there
// (AttnSm90Args::tile_counter), with no launch of its own to clear them.
constexpr int kQkvSpareInts = 1 + kSm90SplitCounters;
// Offset, in 4-byte words, of the first of them.
int64_t quant_qkv_spare_int_offset(int batch, int heads_kv, int nk, int d_pad);

cudaError_t launch_quant_qkv_sm90(const QuantQkvArgs& args, cudaStream_t stream);

#ifdef SAGE_QUANT_TIMES
// Built with -DSAGE_QUANT_TIMES (bench/call_sm90.cu only): every CTA of the fused quantization, the
// first kQuantTimesMax of a launch's items, records these fields (globaltimer ns; stats_done only
// for items that wait for their statistics).
enum QuantTimeField { kQtSm, kQtKind, kQtStart, kQtStatsDone, kQtEnd, kQuantTimeFields };
constexpr int kQuantTimesMax = 1 << 16;
// Copies the first `ctas` CTAs' records to `host` ([ctas][kQuantTimeFields]), then zeroes them all.
cudaError_t quant_qkv_times(long long* host, int ctas);
#endif

}  // namespace sage
