// The one translation unit of sageattn3 that talks to the framework, through the plain C ABI that
// sageattention's modules export too (sage_cabi.h: descriptors, errors, the op signature, the version
// exports): no torch header, no libtorch symbol, so one compiled module serves every PyTorch from the
// wheel's floor on. sageattn3/ops.py loads it with ctypes, defines the torch ops around it and allocates
// their outputs in the shapes it gives; the checks of the launchers' inputs and of those outputs live
// here, next to the calls into the plain C++ launchers of the .cu files (sage3_kernels.h), which run on
// the stream the caller passes (its current one).
//
// Each op returns 0, or 1 with sage_last_error() naming the argument that was wrong and what would be
// valid.

#include <cuda_runtime.h>

#include "sage3_kernels.h"
#include "sage_cabi.h"

SAGE_PYTHON_MODULE(TORCH_EXTENSION_NAME)

namespace {

// Rows (tokens) per float32 block scale, the only block the kernels are built for.
constexpr int64_t kBlock = 128;
// The most blocks a launch grid has along y and z.
constexpr int64_t kMaxGridYZ = 65535;

constexpr int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// Printable list of sizes, for messages: [1, 8, 256, 64].
struct Shape {
  std::initializer_list<int64_t> sizes;
};
std::ostream& operator<<(std::ostream& os, Shape s) {
  os << "[";
  const char* sep = "";
  for (const int64_t n : s.sizes) {
    os << sep << n;
    sep = ", ";
  }
  return os << "]";
}

// A dense (contiguous) tensor of one element type and shape on `like`'s GPU: an operand the
// quantization wrote, or an output the caller allocated. `what` names its layout in the message.
void check_dense(const View& x, const char* name, int64_t dtype, std::initializer_list<int64_t> sizes,
                 const View& like, const char* what) {
  if (x.defined() && x.cuda && x.device == like.device && x.dtype == dtype && x.has_sizes(sizes) &&
      x.contiguous()) {
    return;
  }
  std::ostringstream got;
  if (x.defined()) {
    got << DtypeOf{x} << " " << SizesOf{x} << " strides " << StridesOf{x} << " on " << DeviceOf{x};
  } else {
    got << "None";
  }
  fail(name, " must be a contiguous ", dtype_name(dtype), " tensor ", what, " = ", Shape{sizes}, " on ",
       DeviceOf{like}, ", got ", got.str());
}

sage3::InputType input_type(const View& x) {
  return x.dtype == kF16 ? sage3::InputType::kFloat16 : sage3::InputType::kBFloat16;
}

// The quantization inputs x (Q, K) and v: [B, H, N, D] with D 64 or 128, sizes the launch grid holds.
void check_quant_input(const View& x, const char* name) {
  check_input(x, name);
  const int64_t b = x.size(0), h = x.size(1), n = x.size(2), d = x.size(3);
  SAGE_CHECK(d == 64 || d == 128, name, ": the head dim D (its last dim) must be 64 or 128, got ", d);
  SAGE_CHECK(b >= 1 && h >= 1 && n >= 1, name, " must hold at least one batch, head and token, got ", SizesOf{x});
  SAGE_CHECK(b * h <= kMaxGridYZ, name, ": B * H must be at most ", kMaxGridYZ, " (the launch grid), got ", b * h);
  SAGE_CHECK(n <= (int64_t{1} << 31) - kBlock, name, ": the sequence length must be below 2^31 - 128, got ", n);
}

// Makes `device` current and checks that this module holds code for its GPU (the launchers would return
// cudaErrorNotSupported); `need` > 0: that family bit exactly (the sm_120a-only MMA test).
void check_family(int device, const char* op, int need = 0) {
  const int family = sage3::device_family();
  if (need ? family == need : family != 0) return;
  int major = 0, minor = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute");
  const int built = sage3::compiled_families();
  fail(op, ": this build of sageattn3._C holds code for", (built & 4) ? " sm_90a" : "", (built & 1) ? " sm_100a" : "",
       (built & 2) ? " sm_120a" : "", built ? "" : " no GPU", need ? " (this op needs sm_120a)" : "",
       ", not for the GPU cuda:", device, " (sm_", major, minor, ")");
}

}  // namespace

// x [B, H, N, D] float16/bfloat16 (last dim dense) -> NVFP4 codes, E4M3 scales (as uint8) and float32
// block scales, rows padded to whole blocks. mode 0: no smoothing; 1: subtract `mean` [B, H, D] (K);
// 2: subtract each block's mean and store it to block_mean [B, H, N_pad / 128, D] (Q).
// tensors: x, mean? (read in mode 1), codes [B, H, N_pad, D / 2], scales [B, H, N_pad, D / 16],
// block_scales [B, H, N_pad / 128], block_mean? (exactly in mode 2); ints: block, mode.
SAGE_OP(quant_nvfp4_rows) {
  return guarded([&] {
    SAGE_OP_BODY;
    const View x = a.tensor(0), mean = a.tensor(1), codes = a.tensor(2), scales = a.tensor(3),
               block_scales = a.tensor(4), block_mean = a.tensor(5);
    const int64_t block = a.integer(0), mode = a.integer(1);
    check_quant_input(x, "x");
    SAGE_CHECK(block == kBlock, "block must be ", kBlock, " (the kernels' block), got ", block);
    SAGE_CHECK(mode >= 0 && mode <= 2,
               "mode must be 0 (no smoothing), 1 (subtract mean) or 2 (per-block mean), got ", mode);
    const int64_t b = x.size(0), h = x.size(1), n = x.size(2), d = x.size(3);
    const int64_t n_pad = round_up(n, block), blocks = n_pad / block;
    if (mode == 1) check_dense(mean, "mean (mode 1)", kF32, {b, h, d}, x, "[B, H, D]");
    check_dense(codes, "output codes", kU8, {b, h, n_pad, d / 2}, x, "[B, H, N_pad, D / 2]");
    check_dense(scales, "output scales", kU8, {b, h, n_pad, d / 16}, x, "[B, H, N_pad, D / 16]");
    check_dense(block_scales, "output block_scales", kF32, {b, h, blocks}, x, "[B, H, N_pad / 128]");
    SAGE_CHECK(block_mean.defined() == (mode == 2), "output block_mean must be passed exactly in mode 2");
    if (mode == 2) check_dense(block_mean, "output block_mean", kF32, {b, h, blocks, d}, x, "[B, H, N_pad / 128, D]");
    const DeviceGuard guard(x.device);
    check_family(x.device, "quant_nvfp4_rows");
    const sage3::RowsQuantArgs args{x.data, input_type(x), x.stride(0), x.stride(1), x.stride(2),
                                    static_cast<int>(b), static_cast<int>(h), static_cast<int>(n),
                                    static_cast<int>(n_pad), static_cast<int>(d), static_cast<int>(block),
                                    static_cast<sage3::Smoothing>(mode),
                                    mode == 1 ? mean.ptr<float>() : mode == 2 ? block_mean.ptr<float>() : nullptr,
                                    codes.ptr<uint8_t>(), scales.ptr<uint8_t>(), block_scales.ptr<float>()};
    check_cuda(sage3::launch_quant_rows(args, stream), "quant_nvfp4_rows");
  });
}

// v [B, H, N, D] float16/bfloat16 -> Vᵀ as NVFP4 along the tokens. tensors: v, codes [B, H, D, N_pad / 2],
// scales [B, H, D, N_pad / 16], block_scales [B, H, N_pad / 128]; ints: block.
SAGE_OP(quant_nvfp4_vt) {
  return guarded([&] {
    SAGE_OP_BODY;
    const View v = a.tensor(0), codes = a.tensor(1), scales = a.tensor(2), block_scales = a.tensor(3);
    const int64_t block = a.integer(0);
    check_quant_input(v, "v");
    SAGE_CHECK(block == kBlock, "block must be ", kBlock, " (the kernels' block), got ", block);
    const int64_t b = v.size(0), h = v.size(1), n = v.size(2), d = v.size(3);
    const int64_t n_pad = round_up(n, block);
    check_dense(codes, "output codes", kU8, {b, h, d, n_pad / 2}, v, "[B, H, D, N_pad / 2]");
    check_dense(scales, "output scales", kU8, {b, h, d, n_pad / 16}, v, "[B, H, D, N_pad / 16]");
    check_dense(block_scales, "output block_scales", kF32, {b, h, n_pad / block}, v, "[B, H, N_pad / 128]");
    const DeviceGuard guard(v.device);
    check_family(v.device, "quant_nvfp4_vt");
    const sage3::VtQuantArgs args{v.data, input_type(v), v.stride(0), v.stride(1), v.stride(2),
                                  static_cast<int>(b), static_cast<int>(h), static_cast<int>(n),
                                  static_cast<int>(n_pad), static_cast<int>(d), static_cast<int>(block),
                                  codes.ptr<uint8_t>(), scales.ptr<uint8_t>(), block_scales.ptr<float>()};
    check_cuda(sage3::launch_quant_vt(args, stream), "quant_nvfp4_vt");
  });
}

// NVFP4 attention on what quant_nvfp4_rows (Q, K) and quant_nvfp4_vt (V) give. Writes out [B, Hq, Nq, D]
// (any strides with a dense last dimension, float16/bfloat16) and, when lse is passed, the LSE
// [B, Hq, Nq] float32 (natural log, without the K-mean term). corr: q_mean . (k - k_mean)
// [B, Hq, Nq_pad / 128, Nk]; mask: [B, Hq, Nq, Nk] by strides (0 on broadcast dims), uint8 (keep
// where nonzero; a bool mask is passed as its uint8 view) or float32 (added to the scores).
// tensors: q_codes, q_scales, q_gs, k_codes, k_scales, k_gs, v_codes, v_scales, v_gs, corr?, mask?, out,
// lse? (exactly with return_lse); ints: nq, nk, is_causal, return_lse; floats: qk_scale.
SAGE_OP(attn_nvfp4) {
  return guarded([&] {
    SAGE_OP_BODY;
    const View q_codes = a.tensor(0), q_scales = a.tensor(1), q_gs = a.tensor(2), k_codes = a.tensor(3),
               k_scales = a.tensor(4), k_gs = a.tensor(5), v_codes = a.tensor(6), v_scales = a.tensor(7),
               v_gs = a.tensor(8), corr = a.tensor(9), mask = a.tensor(10), out = a.tensor(11),
               lse = a.tensor(12);
    const int64_t nq = a.integer(0), nk = a.integer(1);
    const bool is_causal = a.flag(2), return_lse = a.flag(3);
    SAGE_CHECK(q_codes.defined() && q_codes.cuda && q_codes.dtype == kU8 && q_codes.dim() == 4 && q_codes.contiguous(),
               "q_codes must be a contiguous uint8 CUDA tensor [B, Hq, Nq_pad, D / 2], got ", DtypeOf{q_codes}, " ",
               SizesOf{q_codes}, " on ", DeviceOf{q_codes});
    SAGE_CHECK(k_codes.defined() && k_codes.dim() == 4, "k_codes must be a 4-d tensor [B, Hkv, Nk_pad, D / 2], got ",
               SizesOf{k_codes});
    const int64_t b = q_codes.size(0), hq = q_codes.size(1), nq_pad = q_codes.size(2), d = q_codes.size(3) * 2;
    const int64_t hkv = k_codes.size(1), nk_pad = k_codes.size(2);
    SAGE_CHECK(d == 64 || d == 128, "q_codes: the head dim D (twice its last dim) must be 64 or 128, got ", d);
    SAGE_CHECK(nq_pad % kBlock == 0 && nq >= 1 && nq <= nq_pad, "nq must be in [1, Nq_pad] and q_codes' Nq_pad a "
               "multiple of 128, got nq = ", nq, ", Nq_pad = ", nq_pad);
    SAGE_CHECK(nk_pad % kBlock == 0 && nk >= 1 && nk <= nk_pad, "nk must be in [1, Nk_pad] and k_codes' Nk_pad a "
               "multiple of 128, got nk = ", nk, ", Nk_pad = ", nk_pad);
    SAGE_CHECK(hkv >= 1 && hq % hkv == 0, "the query heads of q_codes (", hq, ") must be a multiple of the KV heads "
               "of k_codes (", hkv, ")");
    SAGE_CHECK(b <= kMaxGridYZ && hq <= kMaxGridYZ, "B and Hq must be at most ", kMaxGridYZ, ", got ", b, " and ", hq);
    SAGE_CHECK(nq_pad < (int64_t{1} << 31) && nk_pad < (int64_t{1} << 31), "Nq_pad and Nk_pad must be below 2^31, got ",
               nq_pad, " and ", nk_pad);
    const int64_t q_blocks = nq_pad / kBlock, k_blocks = nk_pad / kBlock;
    check_dense(q_scales, "q_scales", kU8, {b, hq, nq_pad, d / 16}, q_codes, "[B, Hq, Nq_pad, D / 16]");
    check_dense(q_gs, "q_gs", kF32, {b, hq, q_blocks}, q_codes, "[B, Hq, Nq_pad / 128]");
    check_dense(k_codes, "k_codes", kU8, {b, hkv, nk_pad, d / 2}, q_codes, "[B, Hkv, Nk_pad, D / 2]");
    check_dense(k_scales, "k_scales", kU8, {b, hkv, nk_pad, d / 16}, q_codes, "[B, Hkv, Nk_pad, D / 16]");
    check_dense(k_gs, "k_gs", kF32, {b, hkv, k_blocks}, q_codes, "[B, Hkv, Nk_pad / 128]");
    check_dense(v_codes, "v_codes", kU8, {b, hkv, d, nk_pad / 2}, q_codes, "[B, Hkv, D, Nk_pad / 2]");
    check_dense(v_scales, "v_scales", kU8, {b, hkv, d, nk_pad / 16}, q_codes, "[B, Hkv, D, Nk_pad / 16]");
    check_dense(v_gs, "v_gs", kF32, {b, hkv, k_blocks}, q_codes, "[B, Hkv, Nk_pad / 128]");
    if (corr.defined()) check_dense(corr, "corr", kF32, {b, hq, q_blocks, nk}, q_codes, "[B, Hq, Nq_pad / 128, Nk]");
    SAGE_CHECK(out.defined() && out.cuda && out.device == q_codes.device && is_half(out) &&
                   out.has_sizes({b, hq, nq, d}) && out.stride(3) == 1,
               "out must be a float16 or bfloat16 tensor [B, Hq, Nq, D] = ", Shape{{b, hq, nq, d}},
               " with a dense last dimension on ", DeviceOf{q_codes}, ", got ", DtypeOf{out}, " ", SizesOf{out},
               " strides ", StridesOf{out}, " on ", DeviceOf{out});
    SAGE_CHECK(out.stride(0) % 2 == 0 && out.stride(1) % 2 == 0 && out.stride(2) % 2 == 0 &&
                   reinterpret_cast<uintptr_t>(out.data) % 4 == 0,
               "out: the kernel stores pairs of channels, so its strides must be even and its base 4-byte aligned, "
               "got strides ", StridesOf{out});
    SAGE_CHECK(lse.defined() == return_lse, "output lse must be passed exactly when return_lse is set");
    if (return_lse) check_dense(lse, "output lse", kF32, {b, hq, nq}, q_codes, "[B, Hq, Nq]");
    sage3::AttnArgs args{};
    if (mask.defined()) {
      SAGE_CHECK(mask.cuda && mask.device == q_codes.device && mask.has_sizes({b, hq, nq, nk}),
                 "mask must be [B, Hq, Nq, Nk] = ", Shape{{b, hq, nq, nk}}, " (expanded) on ", DeviceOf{q_codes},
                 ", got ", SizesOf{mask}, " on ", DeviceOf{mask});
      SAGE_CHECK(mask.dtype == kU8 || mask.dtype == kF32,
                 "mask must be uint8 or bool (keep where nonzero) or float32 (added to the scores), got ",
                 DtypeOf{mask});
      args.mask_kind = mask.dtype == kU8 ? sage3::MaskKind::kBool : sage3::MaskKind::kAdditive;
      args.mask = mask.data;
      args.mask_stride_b = mask.stride(0);
      args.mask_stride_h = mask.stride(1);
      args.mask_stride_m = mask.stride(2);
      args.mask_stride_n = mask.stride(3);
    }
    args.q_codes = q_codes.ptr<uint8_t>();
    args.q_scales = q_scales.ptr<uint8_t>();
    args.q_gs = q_gs.ptr<float>();
    args.k_codes = k_codes.ptr<uint8_t>();
    args.k_scales = k_scales.ptr<uint8_t>();
    args.k_gs = k_gs.ptr<float>();
    args.v_codes = v_codes.ptr<uint8_t>();
    args.v_scales = v_scales.ptr<uint8_t>();
    args.v_gs = v_gs.ptr<float>();
    args.corr = corr.defined() ? corr.ptr<float>() : nullptr;
    args.out = out.data;
    args.out_type = input_type(out);
    args.out_stride_b = out.stride(0);
    args.out_stride_h = out.stride(1);
    args.out_stride_n = out.stride(2);
    args.lse = return_lse ? lse.ptr<float>() : nullptr;
    // The sizes, checked above to fit the kernel's ints.
    const auto narrow = [](int64_t x) { return static_cast<int>(x); };
    args.b = narrow(b), args.hq = narrow(hq), args.hkv = narrow(hkv), args.d = narrow(d);
    args.nq = narrow(nq), args.nk = narrow(nk), args.nq_pad = narrow(nq_pad), args.nk_pad = narrow(nk_pad);
    args.qk_scale = static_cast<float>(a.real(0));
    args.causal = is_causal;
    const DeviceGuard guard(q_codes.device);
    check_family(q_codes.device, "attn_nvfp4");
    check_cuda(sage3::launch_attention(args, stream), "attn_nvfp4");
  });
}

// One 16x8x64 block-scaled FP4 MMA (sm_120a), for the hardware smoke test: out [16, 8] float32 = A . Bᵀ.
// tensors: a_codes [16, 32], a_scales [16, 4], b_codes [8, 32], b_scales [8, 4] (uint8), out.
SAGE_OP(mma_nvfp4_smoke) {
  return guarded([&] {
    SAGE_OP_BODY;
    const View a_codes = a.tensor(0), a_scales = a.tensor(1), b_codes = a.tensor(2), b_scales = a.tensor(3),
               out = a.tensor(4);
    SAGE_CHECK(a_codes.defined() && a_codes.cuda, "a_codes must be a CUDA tensor, got one on ", DeviceOf{a_codes});
    check_dense(a_codes, "a_codes", kU8, {16, 32}, a_codes, "[16, 32]");
    check_dense(a_scales, "a_scales", kU8, {16, 4}, a_codes, "[16, 4]");
    check_dense(b_codes, "b_codes", kU8, {8, 32}, a_codes, "[8, 32]");
    check_dense(b_scales, "b_scales", kU8, {8, 4}, a_codes, "[8, 4]");
    check_dense(out, "output out", kF32, {16, 8}, a_codes, "[16, 8]");
    const DeviceGuard guard(a_codes.device);
    check_family(a_codes.device, "mma_nvfp4_smoke", 2);
    check_cuda(sage3::launch_mma_smoke(a_codes.ptr<uint8_t>(), a_scales.ptr<uint8_t>(), b_codes.ptr<uint8_t>(),
                                       b_scales.ptr<uint8_t>(), out.ptr<float>(), stream),
               "mma_nvfp4_smoke");
  });
}

// Which families this module holds SASS for: a bit per family (1: sm_100a, 2: sm_120a, 4: sm_90a).
SAGE_EXPORT int sage_compiled_families() { return sage3::compiled_families(); }

// The family bit (as above) that GPU `device` runs, 0 when this module has no code for it, -1 with
// sage_last_error() set when the device cannot be asked (no GPU, no driver).
SAGE_EXPORT int sage_device_family(int64_t device) {
  int family = -1;
  guarded([&] {
    const DeviceGuard guard(static_cast<int>(device));
    family = sage3::device_family();
  });
  return family;
}
