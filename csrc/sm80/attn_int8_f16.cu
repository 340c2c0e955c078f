// sm80-family attention: INT8 Q·Kᵀ (mma.sync m16n8k32 s8), FP16 P·V (mma.sync m16n8k16), FP32
// online softmax with exp2. Reproduces sageattention.reference.sage_ref(pv=FP16, block_m=1,
// block_n=64): scores = int32 dot * (q_scale * k_scale) already in the log2 domain; P is rounded to
// FP16 at the running maximum of its block; the row sum uses the unrounded FP32 P.
//
// Tiling. One CTA = 128 query rows = 8 warps x 16 rows (one m16 MMA row tile per warp). 16 rows per
// warp rather than 32 keeps the FP32 output accumulator at 64 registers per thread for d = 128
// (16 x 128 / 32), so the kernel fits without spills; K/V tiles are still shared by 128 rows, which
// is what sets the global traffic. Keys advance 64 at a time: K is quantized per block of 64 keys,
// so each step needs exactly one k_scale.
//
// Shared memory. K and V tiles are double buffered with cp.async (the copy of block j+1 overlaps
// the MMAs of block j). Rows are padded by 16 bytes: K rows of 64 or 128 bytes become 80 or 144, V
// rows of 128 or 256 bytes become 144 or 272. Each ldmatrix phase reads 8 rows of 16 bytes; with a
// row pitch of 80/144/272 bytes (20/36/68 words) those 8 rows start in 8 distinct groups of 4 banks,
// so no bank conflicts. Total: 28 KiB (d = 64) or 52 KiB (d = 128, above the 48 KiB static limit,
// hence dynamic shared memory with the opt-in attribute).
//
// Q stays in registers for the whole CTA (d_pad / 32 x 4 words per thread), loaded straight from
// global memory in the MMA A-fragment layout: each row is read once, so staging it through shared
// memory would only add a copy.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "sage_copy.cuh"
#include "sage_mma.cuh"
#include "sm80/attn.h"

namespace sage {
namespace {

constexpr int kWarps = 8;
constexpr int kRowsPerWarp = 16;  // one m16 tile
constexpr int kBlockM = kWarps * kRowsPerWarp;  // 128 query rows per CTA
constexpr int kBlockN = kSm80KeyBlock;          // 64 keys per step
constexpr int kThreads = kWarps * 32;
constexpr int kSmemRowPad = 16;  // bytes; see the bank-conflict note above
constexpr int kChunk = 16;       // bytes per cp.async / ldmatrix row
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

template <int D>
struct Smem {
  static constexpr int kKPitch = D + kSmemRowPad;          // int8 K row
  static constexpr int kVPitch = D * 2 + kSmemRowPad;      // fp16 V row
  static constexpr int kKBytes = kBlockN * kKPitch;
  static constexpr int kVBytes = kBlockN * kVPitch;
  static constexpr int kStage = kKBytes + kVBytes;
  static constexpr int kStages = 2;
  static constexpr int kBytes = kStages * kStage;
};

template <typename T>
struct OutPair;
template <>
struct OutPair<__half> {
  using type = __half2;
  static __device__ __forceinline__ type make(float a, float b) { return __floats2half2_rn(a, b); }
};
template <>
struct OutPair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ type make(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

__device__ __forceinline__ uint32_t load_u32_or_zero(const int8_t* p, bool valid) {
  return valid ? __ldg(reinterpret_cast<const uint32_t*>(p)) : 0u;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Issue the cp.async copies of key block `blk` into one stage (all threads take part).
template <int D>
__device__ __forceinline__ void load_kv_block(uint8_t* stage, const int8_t* k_base, int64_t k_stride_n,
                                              const __half* v_base, int64_t v_stride_n, int n0, int nk,
                                              int head_dim) {
  constexpr int kKChunks = D / kChunk;      // 16-byte chunks per K row
  constexpr int kVChunks = D * 2 / kChunk;  // per V row
  const uint32_t k_smem = smem_addr(stage);
  const uint32_t v_smem = k_smem + Smem<D>::kKBytes;
#pragma unroll
  for (int c = threadIdx.x; c < kBlockN * kKChunks; c += kThreads) {
    const int row = c / kKChunks, ch = c % kKChunks;
    const int key = n0 + row;
    const bool ok = key < nk;
    const int8_t* src = ok ? k_base + static_cast<int64_t>(key) * k_stride_n + ch * kChunk : k_base;
    cp_async_16(k_smem + row * Smem<D>::kKPitch + ch * kChunk, src, ok);
  }
#pragma unroll
  for (int c = threadIdx.x; c < kBlockN * kVChunks; c += kThreads) {
    const int row = c / kVChunks, ch = c % kVChunks;
    const int key = n0 + row;
    // Channels past head_dim (a head dim of 72 in a 128 tile, say) are zero-filled: they meet zero
    // output columns that are never stored, but must not be NaN.
    const bool ok = key < nk && ch * (kChunk / 2) < head_dim;
    const __half* src = ok ? v_base + static_cast<int64_t>(key) * v_stride_n + ch * (kChunk / 2) : v_base;
    cp_async_16(v_smem + row * Smem<D>::kVPitch + ch * kChunk, src, ok);
  }
}

template <int D, bool kCausal, PvAccum kAccum, typename OutT>
__global__ void __launch_bounds__(kThreads) attn_int8_f16_kernel(const AttnSm80Args p) {
  constexpr int kQSteps = D / 32;           // m16n8k32 steps over the head dim
  constexpr int kSTiles = kBlockN / 8;      // n8 score tiles per key block
  constexpr int kPSteps = kBlockN / 16;     // m16n8k16 steps over the keys
  constexpr int kOTiles = D / 8;            // n8 output tiles
  extern __shared__ __align__(128) uint8_t smem[];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;
  // Causal: the last row blocks see the most keys; launching them first balances the tail.
  const int block_m = kCausal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, hk = h / p.kv_group;
  const int m0 = block_m * kBlockM;
  const int warp_row0 = m0 + warp * kRowsPerWarp;
  const int row[2] = {warp_row0 + group, warp_row0 + group + 8};
  const bool row_ok[2] = {row[0] < p.nq, row[1] < p.nq};

  // Q fragments, held for the whole CTA.
  uint32_t qf[kQSteps][4];
  {
    const int8_t* q_base = p.q + b * p.q_strides.b + h * p.q_strides.h;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int8_t* r = q_base + static_cast<int64_t>(row_ok[i] ? row[i] : 0) * p.q_strides.n + quad * 4;
#pragma unroll
      for (int kk = 0; kk < kQSteps; ++kk) {
        qf[kk][i] = load_u32_or_zero(r + kk * 32, row_ok[i]);
        qf[kk][i + 2] = load_u32_or_zero(r + kk * 32 + 16, row_ok[i]);
      }
    }
  }
  float q_scale[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    q_scale[i] = row_ok[i] ? p.q_scale[b * p.q_scale_strides.b + h * p.q_scale_strides.h +
                                       static_cast<int64_t>(row[i]) * p.q_scale_strides.n]
                           : 0.0f;
  }

  const int8_t* k_base = p.k + b * p.k_strides.b + hk * p.k_strides.h;
  const __half* v_base = static_cast<const __half*>(p.v) + b * p.v_strides.b + hk * p.v_strides.h;
  const float* ks_base = p.k_scale + b * p.k_scale_strides.b + hk * p.k_scale_strides.h;
  const int kv_end = kCausal ? min(p.nk, m0 + kBlockM) : p.nk;
  const int n_blocks = (kv_end + kBlockN - 1) / kBlockN;

  float acc[kOTiles][4];
#pragma unroll
  for (int t = 0; t < kOTiles; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
  float m_run[2] = {neg_inf(), neg_inf()};
  float l_part[2] = {0.0f, 0.0f};  // this thread's share of the row sum; reduced over the quad at the end

  // ldmatrix lane roles: matrix lane / 8, row lane % 8.
  const int ld_mat = lane / 8, ld_row = lane % 8;

  if (n_blocks > 0) {
    load_kv_block<D>(smem, k_base, p.k_strides.n, v_base, p.v_strides.n, 0, p.nk, p.head_dim);
  }
  cp_async_commit();

  for (int blk = 0; blk < n_blocks; ++blk) {
    if (blk + 1 < n_blocks) {
      load_kv_block<D>(smem + ((blk + 1) & 1) * Smem<D>::kStage, k_base, p.k_strides.n, v_base, p.v_strides.n,
                       (blk + 1) * kBlockN, p.nk, p.head_dim);
    }
    cp_async_commit();  // possibly empty: keeps the group count uniform for the wait below
    cp_async_wait<1>();
    __syncthreads();

    const int n0 = blk * kBlockN;
    // Causal: a warp whose 16 rows all precede this block sees none of its keys; it skips the MMAs
    // (its state is unchanged: every score would be -inf). Warp-uniform, so no divergence.
    const bool warp_active = !kCausal || n0 <= warp_row0 + kRowsPerWarp - 1;
    if (warp_active) {
      const uint8_t* stage = smem + (blk & 1) * Smem<D>::kStage;
      const uint32_t k_smem = smem_addr(stage);
      const uint32_t v_smem = k_smem + Smem<D>::kKBytes;

      // S = Q Kᵀ in INT32.
      int32_t s_int[kSTiles][4];
#pragma unroll
      for (int t = 0; t < kSTiles; ++t) s_int[t][0] = s_int[t][1] = s_int[t][2] = s_int[t][3] = 0;
#pragma unroll
      for (int kk = 0; kk < kQSteps; ++kk) {
#pragma unroll
        for (int tp = 0; tp < kSTiles / 2; ++tp) {
          // Matrices: (keys +0..7, bytes +0..15), (keys +0..7, bytes +16..31), (keys +8..15, ...), ...
          const int key = tp * 16 + (ld_mat >> 1) * 8 + ld_row;
          const int byte = kk * 32 + (ld_mat & 1) * 16;
          uint32_t r[4];
          ldmatrix_x4(r, k_smem + key * Smem<D>::kKPitch + byte);
          const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
          mma_m16n8k32_s8(s_int[2 * tp], qf[kk], b0);
          mma_m16n8k32_s8(s_int[2 * tp + 1], qf[kk], b1);
        }
      }

      // Scale into the log2 domain (the product q_scale * k_scale first, as sage_ref), mask, softmax.
      const float k_scale = __ldg(ks_base + blk);
      const float qk_scale[2] = {q_scale[0] * k_scale, q_scale[1] * k_scale};
      const bool edge = n0 + kBlockN > p.nk || (kCausal && n0 + kBlockN - 1 > warp_row0);
      float s[kSTiles][4];
#pragma unroll
      for (int t = 0; t < kSTiles; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = static_cast<float>(s_int[t][e]) * qk_scale[e / 2];
          if (edge) {
            const int key = n0 + t * 8 + quad * 2 + (e & 1);
            const bool visible = key < p.nk && (!kCausal || key <= row[e / 2]);
            x = visible ? x : neg_inf();
          }
          s[t][e] = x;
        }
      }
      float alpha[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mx = m_run[i];
#pragma unroll
        for (int t = 0; t < kSTiles; ++t) mx = fmaxf(mx, fmaxf(s[t][2 * i], s[t][2 * i + 1]));
        const float m_new = quad_max(mx);
        const float m_safe = m_new == neg_inf() ? 0.0f : m_new;  // a row that has seen no key yet
        alpha[i] = exp2f(m_run[i] - m_safe);
        m_run[i] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int t = 0; t < kSTiles; ++t) {
          s[t][2 * i] = exp2f(s[t][2 * i] - m_safe);
          s[t][2 * i + 1] = exp2f(s[t][2 * i + 1] - m_safe);
          sum += s[t][2 * i] + s[t][2 * i + 1];
        }
        l_part[i] = l_part[i] * alpha[i] + sum;
      }
#pragma unroll
      for (int t = 0; t < kOTiles; ++t) {
        acc[t][0] *= alpha[0];
        acc[t][1] *= alpha[0];
        acc[t][2] *= alpha[1];
        acc[t][3] *= alpha[1];
      }

      // P in FP16, straight from the accumulator layout into m16n8k16 A fragments.
      uint32_t pf[kPSteps][4];
#pragma unroll
      for (int kk = 0; kk < kPSteps; ++kk) {
        pf[kk][0] = pack_half2(s[2 * kk][0], s[2 * kk][1]);
        pf[kk][1] = pack_half2(s[2 * kk][2], s[2 * kk][3]);
        pf[kk][2] = pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pf[kk][3] = pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      }

      // O += P V. V tiles are key-major in shared memory; ldmatrix.trans gives the B fragments.
      if constexpr (kAccum == PvAccum::kFp32) {
#pragma unroll
        for (int kk = 0; kk < kPSteps; ++kk) {
#pragma unroll
          for (int tp = 0; tp < kOTiles / 2; ++tp) {
            // Matrices: (keys +0..7, ch +0..7), (keys +8..15, ch +0..7), (keys +0..7, ch +8..15), ...
            const int key = kk * 16 + (ld_mat & 1) * 8 + ld_row;
            const int ch = tp * 16 + (ld_mat >> 1) * 8;
            uint32_t r[4];
            ldmatrix_x4_trans(r, v_smem + key * Smem<D>::kVPitch + ch * 2);
            const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
            mma_m16n8k16_f16_f32(acc[2 * tp], pf[kk], b0);
            mma_m16n8k16_f16_f32(acc[2 * tp + 1], pf[kk], b1);
          }
        }
      } else {
        // One 64-key block in FP16 accumulators (P <= 1, so a block sum is at most 64 * max|V|),
        // then added into the FP32 output.
        uint32_t acc16[kOTiles][2];
#pragma unroll
        for (int t = 0; t < kOTiles; ++t) acc16[t][0] = acc16[t][1] = 0u;
#pragma unroll
        for (int kk = 0; kk < kPSteps; ++kk) {
#pragma unroll
          for (int tp = 0; tp < kOTiles / 2; ++tp) {
            const int key = kk * 16 + (ld_mat & 1) * 8 + ld_row;
            const int ch = tp * 16 + (ld_mat >> 1) * 8;
            uint32_t r[4];
            ldmatrix_x4_trans(r, v_smem + key * Smem<D>::kVPitch + ch * 2);
            const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
            mma_m16n8k16_f16_f16(acc16[2 * tp], pf[kk], b0);
            mma_m16n8k16_f16_f16(acc16[2 * tp + 1], pf[kk], b1);
          }
        }
#pragma unroll
        for (int t = 0; t < kOTiles; ++t) {
          const float2 top = unpack_half2(acc16[t][0]), bottom = unpack_half2(acc16[t][1]);
          acc[t][0] += top.x;
          acc[t][1] += top.y;
          acc[t][2] += bottom.x;
          acc[t][3] += bottom.y;
        }
      }
    }
    __syncthreads();  // the next iteration's copies overwrite the stage just read
  }
  cp_async_wait<0>();

  // Epilogue: divide by the row sum, store the valid rows and channels, then the LSE.
  using Pair = OutPair<OutT>;
  OutT* out_base = static_cast<OutT*>(p.out) + b * p.out_strides.b + h * p.out_strides.h;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float l = quad_sum(l_part[i]);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    if (!row_ok[i]) continue;
    OutT* o = out_base + static_cast<int64_t>(row[i]) * p.out_strides.n;
#pragma unroll
    for (int t = 0; t < kOTiles; ++t) {
      const int ch = t * 8 + quad * 2;
      if (ch < p.head_dim) {  // head_dim is a multiple of 8, so ch + 1 is valid too
        *reinterpret_cast<typename Pair::type*>(o + ch) = Pair::make(acc[t][2 * i] * inv, acc[t][2 * i + 1] * inv);
      }
    }
    if (p.lse != nullptr && quad == 0) {
      const int64_t off = b * p.lse_strides.b + h * p.lse_strides.h + static_cast<int64_t>(row[i]) * p.lse_strides.n;
      float lse = (m_run[i] + log2f(l)) * kLn2;
      if (p.corr != nullptr) {
        lse += p.corr[b * p.corr_strides.b + h * p.corr_strides.h + static_cast<int64_t>(row[i]) * p.corr_strides.n];
      }
      p.lse[off] = lse;
    }
  }
}

template <int D, bool kCausal, PvAccum kAccum, typename OutT>
cudaError_t launch(const AttnSm80Args& args, cudaStream_t stream) {
  auto* kernel = attn_int8_f16_kernel<D, kCausal, kAccum, OutT>;
  constexpr int kSmem = Smem<D>::kBytes;
  if constexpr (kSmem > 48 * 1024) {  // above the default dynamic limit: opt in (sm80 allows 163 KiB)
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) return err;
  }
  const dim3 grid((args.nq + kBlockM - 1) / kBlockM, args.heads_q, args.batch);
  kernel<<<grid, kThreads, kSmem, stream>>>(args);
  return cudaGetLastError();
}

template <int D, bool kCausal, PvAccum kAccum>
cudaError_t launch_out(const AttnSm80Args& args, cudaStream_t stream) {
  return args.out_type == HalfType::kFloat16 ? launch<D, kCausal, kAccum, __half>(args, stream)
                                             : launch<D, kCausal, kAccum, __nv_bfloat16>(args, stream);
}

template <int D, bool kCausal>
cudaError_t launch_accum(const AttnSm80Args& args, cudaStream_t stream) {
  return args.accum == PvAccum::kFp32 ? launch_out<D, kCausal, PvAccum::kFp32>(args, stream)
                                      : launch_out<D, kCausal, PvAccum::kFp16ThenFp32>(args, stream);
}

template <int D>
cudaError_t launch_causal(const AttnSm80Args& args, cudaStream_t stream) {
  return args.causal ? launch_accum<D, true>(args, stream) : launch_accum<D, false>(args, stream);
}

}  // namespace

cudaError_t launch_qk_int8_sv_f16_attn_sm80(const AttnSm80Args& args, cudaStream_t stream) {
  if (args.head_dim <= 0 || args.head_dim % 8 != 0 || args.head_dim > args.d_pad) return cudaErrorInvalidValue;
  if (args.kv_group < 1 || args.heads_q % args.kv_group != 0) return cudaErrorInvalidValue;
  if (args.nq == 0 || args.batch == 0 || args.heads_q == 0) return cudaSuccess;  // nothing to compute
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
