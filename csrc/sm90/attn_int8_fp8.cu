// Hopper (sm_90a) attention: INT8 Q·Kᵀ (wgmma m64n128k32 s32.s8.s8), FP8 e4m3 P·V (wgmma
// m64nDk32 f32.e4m3.e4m3, P from registers), FP32 online softmax with exp2. Reproduces
// sageattention.reference.sage_ref(pv=FP8, block_m=1, block_n=128): scores = int32 dot *
// (q_scale * k_scale) already in the log2 domain; P = exp2(s - running max) is scaled by 448 and
// rounded to e4m3; each 128-key block's P·V goes into a fresh FP32 accumulator that is then added
// to the running output (promotion: Hopper's FP8 MMA accumulates with about 22 mantissa bits);
// the row sum uses the unrounded FP32 P; the end divides by sum * 448 and multiplies by V's
// per-channel scale.
//
// Warp specialization. One CTA = 3 warpgroups (384 threads):
//   warpgroup 0, the producer: one thread issues every TMA copy (Q once, then K and Vᵀ tiles into a
//     ring of kStages stages); its registers are given back with setmaxnreg.dec (24 per thread).
//   warpgroups 1 and 2, the consumers: 64 query rows each (the wgmma M), so a CTA covers 128 rows
//     and every K/Vᵀ tile it loads serves 128 rows. setmaxnreg.inc raises them to 240 registers:
//     at D = 128 a consumer thread holds the output accumulator (64 f32), the block's P·V
//     accumulator (64 f32) and P (16 x 4 FP8), or the scores (64 s32) while the softmax runs.
//   Budget: (24 + 2 x 240) x 128 = 64512 of the SM's 65536 registers, hence one CTA per SM
//   (__launch_bounds__(384, 1), which launches at 168 per thread: 65536 / 384 rounded down to 8);
//   shared memory is sized for that. ptxas fits this sequential version in the 168 (no spills);
//   the 240 are the room that overlapping two blocks' accumulators will need.
//
// Pipeline. Per stage: a full barrier for K, one for Vᵀ (so Q·Kᵀ starts before Vᵀ has landed),
// and an empty barrier that the 8 consumer warps arrive on once both of their wgmma groups reading
// the stage have completed. The producer refills a stage only after its empty barrier completes.
// Each consumer step is sequential for now (Q·Kᵀ, wait, softmax, P·V, wait): no ping-pong between
// the two consumer warpgroups and no overlap of one block's softmax with the next block's Q·Kᵀ.
// Those are the next steps; the stage ring, barriers and per-block structure are laid out for them.
//
// Shared memory (bytes), all tiles K-major and written by TMA with the swizzle the wgmma
// descriptors name, each tile aligned to its 1024-byte swizzle atom:
//   Q  128 rows x D                    16384 (D = 128) /  8192 (D = 64)
//   K  kStages x 128 keys x D          65536           / 32768
//   Vᵀ kStages x D channels x 128 keys 65536           / 32768
//   barriers 13 x 8, alignment slack 1024: total 148584 / 74856, below the 227 KiB limit.
// Rows are D bytes: D = 128 uses the 128-byte swizzle, D = 64 the 64-byte one (a TMA box row may
// not exceed the swizzle span). Vᵀ rows are 128 keys = 128 bytes: 128-byte swizzle for both D.
//
// Masking. Rows and keys past the tensors' extents arrive zero-filled (TMA), and Vᵀ's keys from Nk
// to n_pad are zeros written by quant_v_fp8, so every tile is finite (0 * NaN would be NaN in
// P·V). Keys past Nk and, for causal attention, keys after the query are set to -inf before the
// softmax, only in blocks that straddle the end or the diagonal. Causal CTAs skip key blocks
// entirely above the diagonal, and blockIdx.x runs each head's heaviest (last) row blocks first.
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

#include <cstdint>

#include "sage_mbarrier.cuh"
#include "sage_tma.cuh"
#include "sage_wgmma.cuh"
#include "sm90/attn.h"

namespace sage {
namespace {

constexpr int kWgThreads = 128;                            // threads per warpgroup
constexpr int kConsumerWgs = 2;
constexpr int kThreads = (1 + kConsumerWgs) * kWgThreads;  // 384
constexpr int kWgRows = 64;                                // wgmma M: query rows per consumer
constexpr int kBlockM = kConsumerWgs * kWgRows;            // 128 query rows per CTA
constexpr int kBlockN = kSm90KeyBlock;                     // 128 keys per step
constexpr int kStages = 4;                                 // K/Vᵀ ring depth (smem budget above)
constexpr int kProducerRegs = 24;                          // setmaxnreg targets, see the budget above
constexpr int kConsumerRegs = 240;
constexpr int kConsumerWarps = kConsumerWgs * kWgThreads / 32;  // arrivals per empty-barrier phase
constexpr int kWgmmaK = 32;                                // bytes of K per 8-bit wgmma
constexpr float kLn2 = 0.6931471805599453f;

// Shared-memory layout for head dim (d_pad) D; offsets in bytes from a 1024-aligned base.
template <int D>
struct Smem {
  static constexpr int kAtom = 1024;  // 128-byte swizzle repeats every 8 rows x 128 bytes
  static constexpr int kQBytes = kBlockM * D;
  static constexpr int kKBytes = kBlockN * D;
  static constexpr int kVBytes = D * kBlockN;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;
  static constexpr int kV = kK + kStages * kKBytes;
  static constexpr int kBar = kV + kStages * kVBytes;
  static constexpr int kBytes = kBar + (1 + 3 * kStages) * 8;
  static constexpr int kAlloc = kBytes + kAtom;  // the dynamic base is only 16-byte aligned
  static_assert(kQBytes % kAtom == 0 && kKBytes % kAtom == 0 && kVBytes % kAtom == 0, "tiles keep atom alignment");
  static_assert(kAlloc <= 227 * 1024, "above the sm_90 shared-memory limit per CTA");
  // Q and K rows are D bytes: the swizzle spans one row. Vᵀ rows are 128 keys = 128 bytes.
  static constexpr WgmmaSwizzle kQKSwizzle = D == 128 ? WgmmaSwizzle::k128B : WgmmaSwizzle::k64B;
  static constexpr uint32_t kQKGroupBytes = 8 * D;  // stride between 8-row groups (SBO)
  static constexpr uint32_t kVGroupBytes = 8 * kBlockN;
};

struct Barriers {
  uint64_t q_full;
  uint64_t k_full[kStages];
  uint64_t v_full[kStages];
  uint64_t empty[kStages];
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

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <int D, bool kCausal, typename OutT>
__global__ void __launch_bounds__(kThreads, 1)
    attn_int8_fp8_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                              const __grid_constant__ CUtensorMap tm_v, const AttnSm90Args p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Smem<D>;
  constexpr int kSTiles = kBlockN / 8;   // 16 n8 column tiles of the score accumulator
  constexpr int kOTiles = D / 8;         // n8 column tiles of the output accumulator
  constexpr int kPSteps = kBlockN / kWgmmaK;  // 4 P·V wgmmas per block
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + L::kAtom - 1) &
                                             ~static_cast<uintptr_t>(L::kAtom - 1));
  Barriers& bar = *reinterpret_cast<Barriers*>(smem + L::kBar);

  // Causal: the last row blocks see the most keys; launching them first balances the tail.
  const int block_m = kCausal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, hk = h / (p.heads_q / p.heads_kv);
  const int m0 = block_m * kBlockM;
  // Causal (top-left): rows m0..m0+127 see keys < m0 + 128 at most. Every block up to there holds
  // a visible key for every row (block starts <= m0), so no block is fully masked for a warpgroup.
  const int kv_end = kCausal ? min(p.nk, m0 + kBlockM) : p.nk;
  const int n_blocks = (kv_end + kBlockN - 1) / kBlockN;
  const int wg = threadIdx.x / kWgThreads;

  if (threadIdx.x == 0) {
    mbar_init(&bar.q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&bar.k_full[s], 1);
      mbar_init(&bar.v_full[s], 1);
      mbar_init(&bar.empty[s], kConsumerWarps);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ---------------------------------------------------------------------------------- producer
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) {
      tma_prefetch_map(&tm_q);
      tma_prefetch_map(&tm_k);
      tma_prefetch_map(&tm_v);
      mbar_arrive_expect_tx(&bar.q_full, L::kQBytes);
      tma_load_4d(smem + L::kQ, &tm_q, &bar.q_full, 0, m0, h, b);
      for (int blk = 0; blk < n_blocks; ++blk) {
        const int stage = blk % kStages;
        // Round r of a stage reuses it: wait until the consumers released round r - 1.
        if (blk >= kStages) mbar_wait(&bar.empty[stage], ((blk / kStages) - 1) & 1);
        mbar_arrive_expect_tx(&bar.k_full[stage], L::kKBytes);
        tma_load_4d(smem + L::kK + stage * L::kKBytes, &tm_k, &bar.k_full[stage], 0, blk * kBlockN, hk, b);
        mbar_arrive_expect_tx(&bar.v_full[stage], L::kVBytes);
        tma_load_4d(smem + L::kV + stage * L::kVBytes, &tm_v, &bar.v_full[stage], blk * kBlockN, 0, hk, b);
      }
    }
    return;
  }

  // ------------------------------------------------------------------------------------ consumers
  setmaxnreg_inc<kConsumerRegs>();
  const int cw = wg - 1;  // consumer warpgroup: rows m0 + 64 * cw ..
  const int t = threadIdx.x % kWgThreads;
  const int warp = t / 32, lane = t % 32;
  const int group = lane / 4, quad = lane % 4;
  const int warp_row0 = m0 + cw * kWgRows + warp * 16;
  const int row[2] = {warp_row0 + group, warp_row0 + group + 8};
  const bool row_ok[2] = {row[0] < p.nq, row[1] < p.nq};
  float q_scale[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    q_scale[i] = row_ok[i] ? p.q_scale[b * p.q_scale_strides.b + h * p.q_scale_strides.h +
                                       static_cast<int64_t>(row[i]) * p.q_scale_strides.n]
                           : 0.0f;
  }
  const float* ks_base = p.k_scale + b * p.k_scale_strides.b + hk * p.k_scale_strides.h;

  const uint32_t smem_u32 = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint64_t desc_q = wgmma_desc(smem_u32 + L::kQ + cw * kWgRows * D, L::kQKGroupBytes, L::kQKSwizzle);

  float o[D / 2];  // output accumulator, wgmma m64nD layout
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  float m_run[2] = {neg_inf(), neg_inf()};
  float l_part[2] = {0.0f, 0.0f};  // this thread's share of the row sum; reduced over the quad at the end

  mbar_wait(&bar.q_full, 0);
  for (int blk = 0; blk < n_blocks; ++blk) {
    const int stage = blk % kStages;
    const uint32_t parity = (blk / kStages) & 1;
    const int n0 = blk * kBlockN;

    // S = Q Kᵀ in INT32: D / 32 wgmmas, K advancing 32 bytes along the (swizzled) rows.
    mbar_wait(&bar.k_full[stage], parity);
    const uint64_t desc_k =
        wgmma_desc(smem_u32 + L::kK + stage * L::kKBytes, L::kQKGroupBytes, L::kQKSwizzle);
    int32_t s_int[kSTiles * 4];
    wgmma_fence();
    wgmma_m64n128k32_s32_s8<false>(s_int, desc_q, desc_k);
#pragma unroll
    for (int kk = 1; kk < D / kWgmmaK; ++kk) {
      wgmma_m64n128k32_s32_s8<true>(s_int, desc_q + 2 * kk, desc_k + 2 * kk);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(s_int);

    // Scale into the log2 domain (the product q_scale * k_scale first, as sage_ref), mask, softmax.
    const float k_scale = __ldg(ks_base + blk * p.k_scale_strides.n);
    const float qk_scale[2] = {q_scale[0] * k_scale, q_scale[1] * k_scale};
    const bool edge = n0 + kBlockN > p.nk || (kCausal && n0 + kBlockN - 1 > warp_row0);
    float s[kSTiles * 4];
#pragma unroll
    for (int c = 0; c < kSTiles; ++c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = static_cast<float>(s_int[4 * c + e]) * qk_scale[e / 2];
        if (edge) {
          const int key = n0 + c * 8 + quad * 2 + (e & 1);
          const bool visible = key < p.nk && (!kCausal || key <= row[e / 2]);
          x = visible ? x : neg_inf();
        }
        s[4 * c + e] = x;
      }
    }
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = m_run[i];
#pragma unroll
      for (int c = 0; c < kSTiles; ++c) mx = fmaxf(mx, fmaxf(s[4 * c + 2 * i], s[4 * c + 2 * i + 1]));
      const float m_new = quad_max(mx);
      const float m_safe = m_new == neg_inf() ? 0.0f : m_new;  // a row that has seen no key yet
      alpha[i] = exp2f(m_run[i] - m_safe);
      m_run[i] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < kSTiles; ++c) {
        s[4 * c + 2 * i] = exp2f(s[4 * c + 2 * i] - m_safe);
        s[4 * c + 2 * i + 1] = exp2f(s[4 * c + 2 * i + 1] - m_safe);
        sum += s[4 * c + 2 * i] + s[4 * c + 2 * i + 1];
      }
      l_part[i] = l_part[i] * alpha[i] + sum;
    }

    // P * 448 in e4m3, packed in the accumulator's order (Vᵀ's keys are permuted to match): for
    // k step kk (keys 32kk..32kk+31) a[0]/a[2] take row `group`'s values of column tiles
    // 4kk, 4kk+1 / 4kk+2, 4kk+3, a[1]/a[3] those of row group + 8.
    uint32_t pa[kPSteps][4];
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      const float* x = s + 16 * kk;
      constexpr float k8 = kFp8E4M3Max;
      pa[kk][0] = pack_e4m3x4(x[0] * k8, x[1] * k8, x[4] * k8, x[5] * k8);
      pa[kk][1] = pack_e4m3x4(x[2] * k8, x[3] * k8, x[6] * k8, x[7] * k8);
      pa[kk][2] = pack_e4m3x4(x[8] * k8, x[9] * k8, x[12] * k8, x[13] * k8);
      pa[kk][3] = pack_e4m3x4(x[10] * k8, x[11] * k8, x[14] * k8, x[15] * k8);
    }

    // O_blk = P Vᵀᵀ into a fresh FP32 accumulator (the promotion step), then O = O * alpha + O_blk.
    mbar_wait(&bar.v_full[stage], parity);
    const uint64_t desc_v = wgmma_desc(smem_u32 + L::kV + stage * L::kVBytes, L::kVGroupBytes, WgmmaSwizzle::k128B);
    float pv[D / 2];
    wgmma_fence();
    wgmma_m64nNk32_f32_e4m3<D, false>(pv, pa[0], desc_v);
#pragma unroll
    for (int kk = 1; kk < kPSteps; ++kk) wgmma_m64nNk32_f32_e4m3<D, true>(pv, pa[kk], desc_v + 2 * kk);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(pv);
    // Both wgmma groups that read this stage have completed for this warp: release it.
    __syncwarp();
    if (lane == 0) mbar_arrive(&bar.empty[stage]);
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = fmaf(o[i], alpha[(i / 2) % 2], pv[i]);
  }

  // Epilogue: divide by the row sum * 448, multiply by V's channel scale, store the valid rows and
  // channels, then the LSE.
  using Pair = OutPair<OutT>;
  OutT* out_base = static_cast<OutT*>(p.out) + b * p.out_strides.b + h * p.out_strides.h;
  const float* vs_base = p.v_scale + b * p.v_scale_strides.b + hk * p.v_scale_strides.h;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float l = quad_sum(l_part[i]);
    const float inv = l > 0.0f ? 1.0f / (l * kFp8E4M3Max) : 0.0f;
    if (!row_ok[i]) continue;
    OutT* out_row = out_base + static_cast<int64_t>(row[i]) * p.out_strides.n;
#pragma unroll
    for (int c = 0; c < kOTiles; ++c) {
      const int ch = c * 8 + quad * 2;
      if (ch < p.head_dim) {  // head_dim is a multiple of 8, so ch + 1 is valid too
        const float v0 = __ldg(vs_base + ch), v1 = __ldg(vs_base + ch + 1);
        *reinterpret_cast<typename Pair::type*>(out_row + ch) =
            Pair::make(o[4 * c + 2 * i] * inv * v0, o[4 * c + 2 * i + 1] * inv * v1);
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
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}

// Tensor maps: Q/K as [B, H, N, d_pad] boxes of (D bytes x 128 rows), Vᵀ as [B, Hkv, d_pad, n_pad]
// boxes of (128 keys x D channels). 4-d maps keep every tile inside its own (batch, head): rows
// past N (or keys past n_pad) come back as zeros instead of the next head's data.
template <int D>
cudaError_t make_maps(const AttnSm90Args& a, CUtensorMap* tm_q, CUtensorMap* tm_k, CUtensorMap* tm_v) {
  const CUtensorMapSwizzle qk_swizzle = D == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
  const auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
  const uint32_t qk_box[4] = {static_cast<uint32_t>(D), static_cast<uint32_t>(kBlockN), 1, 1};
  {
    const uint64_t dims[4] = {u(a.d_pad), u(a.nq), u(a.heads_q), u(a.batch)};
    const uint64_t strides[3] = {u(a.q_strides.n), u(a.q_strides.h), u(a.q_strides.b)};
    const cudaError_t err = make_tensor_map_4d(tm_q, a.q, dims, strides, qk_box, qk_swizzle);
    if (err != cudaSuccess) return err;
  }
  {
    const uint64_t dims[4] = {u(a.d_pad), u(a.nk), u(a.heads_kv), u(a.batch)};
    const uint64_t strides[3] = {u(a.k_strides.n), u(a.k_strides.h), u(a.k_strides.b)};
    const cudaError_t err = make_tensor_map_4d(tm_k, a.k, dims, strides, qk_box, qk_swizzle);
    if (err != cudaSuccess) return err;
  }
  const uint64_t dims[4] = {u(a.n_pad), u(a.d_pad), u(a.heads_kv), u(a.batch)};
  const uint64_t strides[3] = {u(a.vt_strides.n), u(a.vt_strides.h), u(a.vt_strides.b)};
  const uint32_t box[4] = {static_cast<uint32_t>(kBlockN), static_cast<uint32_t>(D), 1, 1};
  return make_tensor_map_4d(tm_v, a.vt, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

template <int D, bool kCausal, typename OutT>
cudaError_t launch(const AttnSm90Args& args, cudaStream_t stream) {
  CUtensorMap tm_q, tm_k, tm_v;
  cudaError_t err = make_maps<D>(args, &tm_q, &tm_k, &tm_v);
  if (err != cudaSuccess) return err;
  auto* kernel = attn_int8_fp8_sm90_kernel<D, kCausal, OutT>;
  constexpr int kSmem = Smem<D>::kAlloc;  // above the 48 KiB default: opt in
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  const dim3 grid((args.nq + kBlockM - 1) / kBlockM, args.heads_q, args.batch);
  kernel<<<grid, kThreads, kSmem, stream>>>(tm_q, tm_k, tm_v, args);
  return cudaGetLastError();
}

template <int D, bool kCausal>
cudaError_t launch_out(const AttnSm90Args& args, cudaStream_t stream) {
  return args.out_type == HalfType::kFloat16 ? launch<D, kCausal, __half>(args, stream)
                                             : launch<D, kCausal, __nv_bfloat16>(args, stream);
}

template <int D>
cudaError_t launch_causal(const AttnSm90Args& args, cudaStream_t stream) {
  return args.causal ? launch_out<D, true>(args, stream) : launch_out<D, false>(args, stream);
}

}  // namespace

cudaError_t launch_qk_int8_sv_f8_attn_sm90(const AttnSm90Args& args, cudaStream_t stream) {
  if (args.head_dim <= 0 || args.head_dim % 8 != 0 || args.head_dim > args.d_pad) return cudaErrorInvalidValue;
  if (args.heads_kv < 1 || args.heads_q % args.heads_kv != 0) return cudaErrorInvalidValue;
  if (args.n_pad < args.nk || args.n_pad % kSm90KeyPermuteGroup != 0) return cudaErrorInvalidValue;
  if (args.nq == 0 || args.batch == 0 || args.heads_q == 0) return cudaSuccess;  // nothing to compute
  if (args.nk <= 0) return cudaErrorInvalidValue;
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
