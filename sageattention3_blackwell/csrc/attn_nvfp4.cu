// NVFP4 attention: the arithmetic of sageattn3/reference.py::sage3_ref on the quantized operands.
//
// One CTA: 64 query rows of one (batch, head), 4 warps of 16 rows each. Key tiles of 128 (the block of
// K's and V's float32 scales and of P's per-row scale), double-buffered in shared memory with cp.async.
// Per tile and warp:
//   S = Q K^T (raw dot of the group values, float32) -> s = (S * (gq * gk) + corr) * qk_scale (+ mask)
//   online softmax in the log2 domain: m, alpha = exp2(m_old - m), p = exp2(s - m), l += sum(p)
//   P in two levels: gp = max(p_row) / 2688, then NVFP4 per 16 keys (E4M3 scale, E2M1 codes)
//   O = O * alpha + (P4 V4^T) * (gp * gv)
// Every float32 step is written with explicit _rn intrinsics so that nvcc does not fuse it into an
// FMA that the reference does not do.
//
// The two MMA paths (chosen at compile time per target, same fragments of S and O):
//   Fp4Mma (sm_120a): mma.sync m16n8k64 kind::mxf4nvf4 block_scale scale_vec::4X: the E2M1 codes and
//     E4M3 scales go to the tensor cores as stored. P's codes, made in the accumulator layout, are
//     moved to the A-operand layout with a byte transpose inside each quad.
//   F16Mma (sm_100a, sm_90a): each code byte is decoded to half2 value * scale (exact) and multiplied
//     with mma.sync m16n8k16 fp16 -> fp32. sm_100a has no block-scaled mma.sync (only tcgen05.mma), so
//     this is its path; the same code built for sm_90a is what runs, and is tested, on Hopper.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "nvfp4.cuh"
#include "sage3_kernels.h"

namespace sage3 {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBlockM = 16 * kWarps;  // query rows per CTA: one 16-row MMA tile per warp
constexpr int kBlockN = 128;          // keys per tile: the block of K's, V's and P's float32 scales
constexpr int kQBlock = 128;          // query rows per block of Q's scale and mean
constexpr int kTilesN = kBlockN / 8;  // 8-key MMA n-tiles per key tile
constexpr int kGroupsN = kBlockN / kGroup;  // P groups per row and tile
constexpr float kLog2e = 1.4426950408889634f;
// Bytes added to each shared-memory row of codes: rows of 80 (D = 128, and V^T) or 48 (D = 64) bytes put
// the 8 rows a warp's 32-bit fragment loads touch (lanes 4g + t) on 32 distinct banks; 64 or 32 bytes
// would give 4-way conflicts.
constexpr int kRowPad = 16;

static_assert(kQBlock % kBlockM == 0, "a CTA's rows must lie in one block of Q's scale and mean");

template <int D>
struct Tile {
  static constexpr int kRowK = D / 2 + kRowPad;        // one key's codes
  static constexpr int kRowV = kBlockN / 2 + kRowPad;  // one channel's codes (V^T)
  static constexpr int kScalesK = D / kGroup;          // E4M3 scales per key
  static constexpr int kScalesV = kBlockN / kGroup;    // E4M3 scales per channel (V^T)
  alignas(16) uint8_t k_codes[kBlockN * kRowK];
  alignas(16) uint8_t k_scales[kBlockN * kScalesK];
  alignas(16) uint8_t v_codes[D * kRowV];
  alignas(16) uint8_t v_scales[D * kScalesV];
};

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// P of one warp's 16 rows and one key tile, in the accumulator layout of lane (g, t):
// lo[w] byte i = codes of keys 2t, 2t+1 of 8-key tile 4w + i in row g (hi: row g + 8);
// sf_lo[w] byte i = E4M3 scale of 16-key group 4w + i of row g (sf_hi: row g + 8).
struct PFrag {
  uint32_t lo[kTilesN / 4], hi[kTilesN / 4];
  uint32_t sf_lo[kGroupsN / 4], sf_hi[kGroupsN / 4];
};

// Both MMA paths: qk accumulates S[j] (8-key tile j) of this warp's 16 rows; pv accumulates O[i]
// (8-channel tile i). Pointers: `q_lo`/`q_hi` are the code rows of query rows g and g + 8,
// `qs_lo`/`qs_hi` their scale rows; tiles in shared memory as in Tile<D>.
#ifdef SAGE3_HAS_MMA_BLOCK_SCALE
__device__ __forceinline__ uint32_t ld32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

template <int D>
struct Fp4Mma {
  using T = Tile<D>;
  static constexpr int kChunks = D / 64;  // k64 steps over the head dim
  struct QFrag {
    uint32_t a[kChunks][4];
    uint32_t sf[kChunks];
  };

  __device__ static void load_q(QFrag& q, const uint8_t* q_lo, const uint8_t* q_hi, const uint8_t* qs_lo,
                                const uint8_t* qs_hi, int t) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      q.a[c][0] = ld32(q_lo + 32 * c + 4 * t);
      q.a[c][1] = ld32(q_hi + 32 * c + 4 * t);
      q.a[c][2] = ld32(q_lo + 32 * c + 16 + 4 * t);
      q.a[c][3] = ld32(q_hi + 32 * c + 16 + 4 * t);
      q.sf[c] = ld32((t & 1 ? qs_hi : qs_lo) + 4 * c);  // lanes t = 0, 2: row g; t = 1, 3: row g + 8
    }
  }

  __device__ static void qk(float (&s)[kTilesN][4], const QFrag& q, const T& tile, int g, int t) {
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) {
      const uint8_t* key = tile.k_codes + (8 * j + g) * T::kRowK;
      const uint8_t* key_sf = tile.k_scales + (8 * j + g) * T::kScalesK;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const uint32_t b[2] = {ld32(key + 32 * c + 4 * t), ld32(key + 32 * c + 16 + 4 * t)};
        mma_nvfp4_16x8x64(s[j], q.a[c], b, q.sf[c], ld32(key_sf + 4 * c));
      }
    }
  }

  __device__ static void pv(float (&o)[D / 8][4], const PFrag& p, const T& tile, int g, int t) {
#pragma unroll
    for (int c = 0; c < kBlockN / 64; ++c) {  // keys 64c .. 64c + 63: tiles 8c .. 8c + 7, groups 4c .. 4c + 3
      const uint32_t a[4] = {quad_transpose_bytes(p.lo[2 * c]), quad_transpose_bytes(p.hi[2 * c]),
                             quad_transpose_bytes(p.lo[2 * c + 1]), quad_transpose_bytes(p.hi[2 * c + 1])};
      const uint32_t sfa = t & 1 ? p.sf_hi[c] : p.sf_lo[c];
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
        const uint8_t* chan = tile.v_codes + (8 * i + g) * T::kRowV;
        const uint32_t b[2] = {ld32(chan + 32 * c + 4 * t), ld32(chan + 32 * c + 16 + 4 * t)};
        mma_nvfp4_16x8x64(o[i], a, b, sfa, ld32(tile.v_scales + (8 * i + g) * T::kScalesV + 4 * c));
      }
    }
  }
};
#endif

template <int D>
struct F16Mma {
  using T = Tile<D>;
  static constexpr int kSteps = D / 16;  // k16 steps over the head dim = groups of 16 channels
  struct QFrag {
    uint32_t a[kSteps][4];
  };

  // Channels 16s + 2t, +1 are byte 8s + t of a code row; 16s + 8 + 2t, +1 are byte 8s + 4 + t.
  __device__ static void load_q(QFrag& q, const uint8_t* q_lo, const uint8_t* q_hi, const uint8_t* qs_lo,
                                const uint8_t* qs_hi, int t) {
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const uint32_t sf_lo = e4m3_to_half2(qs_lo[s]), sf_hi = e4m3_to_half2(qs_hi[s]);
      q.a[s][0] = group_values_half2(q_lo[8 * s + t], sf_lo);
      q.a[s][1] = group_values_half2(q_hi[8 * s + t], sf_hi);
      q.a[s][2] = group_values_half2(q_lo[8 * s + 4 + t], sf_lo);
      q.a[s][3] = group_values_half2(q_hi[8 * s + 4 + t], sf_hi);
    }
  }

  __device__ static void qk(float (&s)[kTilesN][4], const QFrag& q, const T& tile, int g, int t) {
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) {
      const uint8_t* key = tile.k_codes + (8 * j + g) * T::kRowK;
      const uint8_t* key_sf = tile.k_scales + (8 * j + g) * T::kScalesK;
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        const uint32_t sf = e4m3_to_half2(key_sf[st]);
        const uint32_t b[2] = {group_values_half2(key[8 * st + t], sf), group_values_half2(key[8 * st + 4 + t], sf)};
        mma_f16_16x8x16(s[j], q.a[st], b);
      }
    }
  }

  // k16 step st covers keys 16st .. 16st + 15 = 8-key tiles 2st, 2st + 1 = P group st: the A operand
  // is exactly the accumulator layout of those two tiles.
  __device__ static void pv(float (&o)[D / 8][4], const PFrag& p, const T& tile, int g, int t) {
#pragma unroll
    for (int st = 0; st < kGroupsN; ++st) {
      const uint32_t sf_lo = e4m3_to_half2(byte_of(p.sf_lo[st / 4], st % 4));
      const uint32_t sf_hi = e4m3_to_half2(byte_of(p.sf_hi[st / 4], st % 4));
      const int j0 = 2 * st, j1 = 2 * st + 1;
      const uint32_t a[4] = {group_values_half2(byte_of(p.lo[j0 / 4], j0 % 4), sf_lo),
                             group_values_half2(byte_of(p.hi[j0 / 4], j0 % 4), sf_hi),
                             group_values_half2(byte_of(p.lo[j1 / 4], j1 % 4), sf_lo),
                             group_values_half2(byte_of(p.hi[j1 / 4], j1 % 4), sf_hi)};
#pragma unroll
      for (int i = 0; i < D / 8; ++i) {
        const uint8_t* chan = tile.v_codes + (8 * i + g) * T::kRowV;
        const uint32_t sf = e4m3_to_half2(tile.v_scales[(8 * i + g) * T::kScalesV + st]);
        const uint32_t b[2] = {group_values_half2(chan[8 * st + t], sf), group_values_half2(chan[8 * st + 4 + t], sf)};
        mma_f16_16x8x16(o[i], a, b);
      }
    }
  }
};

#ifdef SAGE3_HAS_MMA_BLOCK_SCALE
template <int D>
using Mma = Fp4Mma<D>;
#else
template <int D>
using Mma = F16Mma<D>;
#endif

// cp.async of key tile `n0` (keys n0 .. n0 + 127 of the padded K and V^T) into `tile`; all threads.
template <int D>
__device__ __forceinline__ void load_tile(Tile<D>& tile, const AttnArgs& a, int64_t bh_kv, int n0) {
  using T = Tile<D>;
  constexpr int kChunksK = D / 32;           // 16-byte chunks per key row
  constexpr int kChunksV = kBlockN / 32;     // 16-byte chunks per V^T row (64 bytes)
  const uint8_t* k_codes = a.k_codes + (bh_kv * a.nk_pad + n0) * (D / 2);
  for (int i = threadIdx.x; i < kBlockN * kChunksK; i += kThreads)
    cp_async16(tile.k_codes + (i / kChunksK) * T::kRowK + (i % kChunksK) * 16, k_codes + i * 16);
  const uint8_t* k_scales = a.k_scales + (bh_kv * a.nk_pad + n0) * T::kScalesK;  // contiguous for the tile
  for (int i = threadIdx.x; i < kBlockN * T::kScalesK / 16; i += kThreads)
    cp_async16(tile.k_scales + i * 16, k_scales + i * 16);
  for (int i = threadIdx.x; i < D * kChunksV; i += kThreads) {
    const int64_t chan = bh_kv * D + i / kChunksV;
    cp_async16(tile.v_codes + (i / kChunksV) * T::kRowV + (i % kChunksV) * 16,
               a.v_codes + chan * (a.nk_pad / 2) + n0 / 2 + (i % kChunksV) * 16);
  }
  for (int i = threadIdx.x; i < D; i += kThreads)
    cp_async8(tile.v_scales + i * T::kScalesV, a.v_scales + (bh_kv * D + i) * (a.nk_pad / kGroup) + n0 / kGroup);
}

template <int D>
__global__ void __launch_bounds__(kThreads) attn_kernel(const AttnArgs a) {
  __shared__ Tile<D> tiles[2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int m0 = blockIdx.x * kBlockM, h = blockIdx.y, b = blockIdx.z;
  const int64_t bh = static_cast<int64_t>(b) * a.hq + h;
  const int64_t bh_kv = static_cast<int64_t>(b) * a.hkv + h / (a.hq / a.hkv);
  const int row0 = m0 + 16 * warp;
  const int rows[2] = {row0 + g, row0 + g + 8};
  const int q_blk = row0 / kQBlock;
  const float gq = a.q_gs[bh * (a.nq_pad / kQBlock) + q_blk];
  const float* corr = a.corr ? a.corr + (bh * (a.nq_pad / kQBlock) + q_blk) * a.nk : nullptr;

  typename Mma<D>::QFrag qf;
  {
    const uint8_t* q_lo = a.q_codes + (bh * a.nq_pad + rows[0]) * (D / 2);
    const uint8_t* qs_lo = a.q_scales + (bh * a.nq_pad + rows[0]) * (D / kGroup);
    Mma<D>::load_q(qf, q_lo, q_lo + 8 * (D / 2), qs_lo, qs_lo + 8 * (D / kGroup), t);
  }

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};

  // SDPA's is_causal keeps key j for query i iff j <= i (top-left), so this CTA needs keys < m0 + 64.
  const int n_end = a.causal ? min(a.nk, m0 + kBlockM) : a.nk;
  const int n_tiles = (n_end + kBlockN - 1) / kBlockN;
  const int nk_blocks = a.nk_pad / kBlockN;

  load_tile<D>(tiles[0], a, bh_kv, 0);
  cp_async_commit();
  for (int it = 0; it < n_tiles; ++it) {
    if (it + 1 < n_tiles) load_tile<D>(tiles[(it + 1) & 1], a, bh_kv, (it + 1) * kBlockN);
    cp_async_commit();  // possibly empty: keeps "all but the newest group" meaning tile `it`
    cp_async_wait<1>();
    __syncthreads();
    const Tile<D>& tile = tiles[it & 1];
    const int n0 = it * kBlockN;

    // ---- scores (log2 domain) -------------------------------------------------------------------
    float s[kTilesN][4];
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
    Mma<D>::qk(s, qf, tile, g, t);
    const float gqk = __fmul_rn(gq, a.k_gs[bh_kv * nk_blocks + it]);
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = rows[e / 2], col = n0 + 8 * j + 2 * t + (e & 1);
        bool visible = row < a.nq && col < a.nk;
        float x = __fmul_rn(s[j][e], gqk);
        if (corr != nullptr && visible) x = __fadd_rn(x, corr[col]);
        x = __fmul_rn(x, a.qk_scale);
        if (a.mask_kind != MaskKind::kNone && visible) {
          const int64_t off = b * a.mask_stride_b + h * a.mask_stride_h + row * a.mask_stride_m +
                              col * a.mask_stride_n;
          if (a.mask_kind == MaskKind::kBool) {
            visible = static_cast<const uint8_t*>(a.mask)[off] != 0;
          } else {
            x = __fadd_rn(x, __fmul_rn(static_cast<const float*>(a.mask)[off], kLog2e));
          }
        }
        if (a.causal) visible = visible && col <= row;
        s[j][e] = visible ? x : neg_inf();
      }
    }

    // ---- online softmax -------------------------------------------------------------------------
    float m_safe[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = neg_inf();
#pragma unroll
      for (int j = 0; j < kTilesN; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
      const float m_new = fmaxf(m[r], quad_max(mx));
      m_safe[r] = m_new == neg_inf() ? 0.f : m_new;
      alpha[r] = exp2f(__fsub_rn(m[r], m_safe[r]));  // 0 while the row has seen no visible key
      m[r] = m_new;
    }
    float row_sum[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = exp2f(__fsub_rn(s[j][e], m_safe[e / 2]));
        row_sum[e / 2] = __fadd_rn(row_sum[e / 2], s[j][e]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = __fadd_rn(__fmul_rn(l[r], alpha[r]), quad_sum(row_sum[r]));

    // ---- P in two levels: gp = max(p_row) / 2688, then E4M3 per 16 keys and E2M1 codes ------------
    PFrag p;
    float gp[2];
    {
      float gmax[2][kGroupsN];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float row_max = 0.f;
#pragma unroll
        for (int q = 0; q < kGroupsN; ++q) {
          const float v = fmaxf(fmaxf(s[2 * q][2 * r], s[2 * q][2 * r + 1]),
                                fmaxf(s[2 * q + 1][2 * r], s[2 * q + 1][2 * r + 1]));
          gmax[r][q] = quad_max(v);
          row_max = fmaxf(row_max, gmax[r][q]);
        }
        gp[r] = __fdiv_rn(row_max, kFp4E4m3Range);
      }
      float inv[2][kGroupsN];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int w = 0; w < kGroupsN / 4; ++w) {
          uint32_t word = 0;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int q = 4 * w + i;
            const uint32_t sf = e4m3(div_or_zero(gmax[r][q], __fmul_rn(gp[r], kE2m1Max)));
            inv[r][q] = div_or_zero(1.f, __fmul_rn(e4m3_to_float(sf), gp[r]));
            word |= sf << (8 * i);
          }
          if (r == 0) {
            p.sf_lo[w] = word;
          } else {
            p.sf_hi[w] = word;
          }
        }
      }
#pragma unroll
      for (int w = 0; w < kTilesN / 4; ++w) {
        uint32_t lo = 0, hi = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = 4 * w + i;
          const float inv_lo = inv[0][j / 2], inv_hi = inv[1][j / 2];
          lo |= e2m1x2(__fmul_rn(s[j][0], inv_lo), __fmul_rn(s[j][1], inv_lo)) << (8 * i);
          hi |= e2m1x2(__fmul_rn(s[j][2], inv_hi), __fmul_rn(s[j][3], inv_hi)) << (8 * i);
        }
        p.lo[w] = lo;
        p.hi[w] = hi;
      }
    }

    // ---- O = O * alpha + (P V^T) * (gp * gv) ------------------------------------------------------
    float pv[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) pv[i][0] = pv[i][1] = pv[i][2] = pv[i][3] = 0.f;
    Mma<D>::pv(pv, p, tile, g, t);
    const float gv = a.v_gs[bh_kv * nk_blocks + it];
    const float gpv[2] = {__fmul_rn(gp[0], gv), __fmul_rn(gp[1], gv)};
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[i][e] = __fadd_rn(__fmul_rn(o[i][e], alpha[e / 2]), __fmul_rn(pv[i][e], gpv[e / 2]));
    }
    __syncthreads();  // the tile is read by all warps before the next iteration loads into its buffer
  }
  cp_async_wait<0>();

  // ---- epilogue: O / l in the output dtype; LSE ----------------------------------------------------
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = rows[r];
    if (row >= a.nq) continue;
    const int64_t base = b * a.out_stride_b + h * a.out_stride_h + row * a.out_stride_n;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const float v0 = l[r] > 0.f ? __fdiv_rn(o[i][2 * r], l[r]) : 0.f;
      const float v1 = l[r] > 0.f ? __fdiv_rn(o[i][2 * r + 1], l[r]) : 0.f;
      const int64_t off = base + 8 * i + 2 * t;
      if (a.out_type == InputType::kFloat16) {
        *reinterpret_cast<__half2*>(static_cast<__half*>(a.out) + off) = __floats2half2_rn(v0, v1);
      } else {
        *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(a.out) + off) = __floats2bfloat162_rn(v0, v1);
      }
    }
    if (a.lse != nullptr && t == 0)
      a.lse[bh * a.nq + row] = l[r] > 0.f ? __fdiv_rn(__fadd_rn(m[r], log2f(l[r])), kLog2e) : neg_inf();
  }
}

}  // namespace

#ifndef SAGE3_HOST_EMULATION
cudaError_t launch_attention(const AttnArgs& a, cudaStream_t stream) {
  if ((a.d != 64 && a.d != 128) || a.b <= 0 || a.hq <= 0 || a.hkv <= 0 || a.hq % a.hkv || a.nq <= 0 || a.nk <= 0 ||
      a.nq_pad % kQBlock || a.nk_pad % kBlockN || a.nq_pad < a.nq || a.nk_pad < a.nk || a.hq > 65535 || a.b > 65535)
    return cudaErrorInvalidValue;
  if (!device_family()) return cudaErrorNotSupported;
  const dim3 grid((a.nq + kBlockM - 1) / kBlockM, a.hq, a.b);
  if (a.d == 64) {
    attn_kernel<64><<<grid, kThreads, 0, stream>>>(a);
  } else {
    attn_kernel<128><<<grid, kThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}
#endif

}  // namespace sage3
