// The sageattn3 kernels built for the CPU (with cuda_emulation.h force-included): C entry points that
// tests/unit/test_emulation.py calls through ctypes with CPU tensors. Build one library per MMA path:
// -DSAGE3_HAS_MMA_BLOCK_SCALE=1 -DSAGE3_HAS_FP4_CVT=1 gives the sm_120a kernel, no define the
// sm_90a one (sm_100a compiles the same code as sm_90a, with the cvt instruction for E2M1).
#include "attn_nvfp4.cu"
#include "quant_nvfp4.cu"

extern "C" {

// 1 when this library holds the block-scaled FP4 MMA path, 0 for the fp16 one.
int sage3_emu_fp4_mma() {
#ifdef SAGE3_HAS_MMA_BLOCK_SCALE
  return 1;
#else
  return 0;
#endif
}

int sage3_emu_quant_rows(const void* x, int type, const int64_t* strides, int b, int h, int n, int n_pad, int d,
                         int block, int smoothing, float* mean, uint8_t* codes, uint8_t* scales, float* block_scales) {
  const sage3::RowsQuantArgs args{x, static_cast<sage3::InputType>(type), strides[0], strides[1], strides[2], b, h, n,
                                  n_pad, d, block, static_cast<sage3::Smoothing>(smoothing), mean, codes, scales,
                                  block_scales};
  const dim3 grid(n_pad / block, b * h);
  emu::launch(grid, 128, [&] {
    if (type == 0) {
      sage3::quant_rows_kernel<__half>(args);
    } else {
      sage3::quant_rows_kernel<__nv_bfloat16>(args);
    }
  });
  return 0;
}

int sage3_emu_quant_vt(const void* x, int type, const int64_t* strides, int b, int h, int n, int n_pad, int d,
                       int block, uint8_t* codes, uint8_t* scales, float* block_scales) {
  const sage3::VtQuantArgs args{x,     static_cast<sage3::InputType>(type), strides[0], strides[1], strides[2], b, h, n,
                                n_pad, d,     block, codes, scales, block_scales};
  const dim3 grid(n_pad / block, b * h);
  emu::launch(grid, 128, [&] {
    if (type == 0) {
      sage3::quant_vt_kernel<__half>(args);
    } else {
      sage3::quant_vt_kernel<__nv_bfloat16>(args);
    }
  });
  return 0;
}

// Pointers in the order of sage3::AttnArgs; mask_strides and out_strides: 4 and 3 int64 (elements).
int sage3_emu_attention(const uint8_t* const* operands, const float* const* block_scales, const float* corr,
                        const void* mask, int mask_kind, const int64_t* mask_strides, void* out, int out_type,
                        const int64_t* out_strides, float* lse, const int* sizes, float qk_scale, int causal) {
  sage3::AttnArgs a{};
  a.q_codes = operands[0];
  a.q_scales = operands[1];
  a.k_codes = operands[2];
  a.k_scales = operands[3];
  a.v_codes = operands[4];
  a.v_scales = operands[5];
  a.q_gs = block_scales[0];
  a.k_gs = block_scales[1];
  a.v_gs = block_scales[2];
  a.corr = corr;
  a.mask = mask;
  a.mask_kind = static_cast<sage3::MaskKind>(mask_kind);
  a.mask_stride_b = mask_strides[0];
  a.mask_stride_h = mask_strides[1];
  a.mask_stride_m = mask_strides[2];
  a.mask_stride_n = mask_strides[3];
  a.out = out;
  a.out_type = static_cast<sage3::InputType>(out_type);
  a.out_stride_b = out_strides[0];
  a.out_stride_h = out_strides[1];
  a.out_stride_n = out_strides[2];
  a.lse = lse;
  a.b = sizes[0];
  a.hq = sizes[1];
  a.hkv = sizes[2];
  a.nq = sizes[3];
  a.nk = sizes[4];
  a.nq_pad = sizes[5];
  a.nk_pad = sizes[6];
  a.d = sizes[7];
  a.qk_scale = qk_scale;
  a.causal = causal != 0;
  const dim3 grid((a.nq + sage3::kBlockM - 1) / sage3::kBlockM, a.hq, a.b);
  emu::launch(grid, sage3::kThreads, [&] {
    if (a.d == 64) {
      sage3::attn_kernel<64>(a);
    } else {
      sage3::attn_kernel<128>(a);
    }
  });
  return 0;
}

}  // extern "C"
