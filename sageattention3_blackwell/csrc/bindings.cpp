// The one translation unit of sageattn3 that includes torch: op schemas, argument checks and the
// calls into the plain C++ launchers of the .cu files (sage3_kernels.h). Importing the module runs
// the registrations; it holds no Python functions.
#include <ATen/ATen.h>
#include <Python.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <utility>

#include "sage3_kernels.h"

#define SAGE3_CONCAT_(a, b) a##b
#define SAGE3_CONCAT(a, b) SAGE3_CONCAT_(a, b)
#define SAGE3_STR_(a) #a
#define SAGE3_STR(a) SAGE3_STR_(a)

PyMODINIT_FUNC SAGE3_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, SAGE3_STR(TORCH_EXTENSION_NAME), nullptr, -1, nullptr};
  return PyModule_Create(&def);
}

namespace {

void check_cuda(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, " failed: ", cudaGetErrorString(err));
}

// x: [B, H, N, D] float16/bfloat16 (last dim contiguous) -> (codes, scales as uint8, block scales, mean).
// mode: 0 none, 1 subtract `mean` [B, H, D], 2 per-block mean (returned; otherwise an empty tensor).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quant_nvfp4_rows(const at::Tensor& x, int64_t block,
                                                                             int64_t mode,
                                                                             const std::optional<at::Tensor>& mean) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 4, "x must be a 4-D CUDA tensor [B, H, N, D]");
  TORCH_CHECK(x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16, "x must be float16 or bfloat16");
  TORCH_CHECK(x.stride(3) == 1, "x must have a contiguous last dimension");
  TORCH_CHECK(x.size(3) == 64 || x.size(3) == 128, "x: head dim must be 64 or 128, got ", x.size(3));
  TORCH_CHECK(block == 128, "block must be 128");
  TORCH_CHECK(mode >= 0 && mode <= 2, "mode must be 0, 1 or 2");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t b = x.size(0), h = x.size(1), n = x.size(2), d = x.size(3);
  const int64_t n_pad = (n + block - 1) / block * block, nblk = n_pad / block;
  auto u8 = x.options().dtype(at::kByte);
  auto f32 = x.options().dtype(at::kFloat);
  auto codes = at::empty({b, h, n_pad, d / 2}, u8);
  auto scales = at::empty({b, h, n_pad, d / 16}, u8);
  auto gs = at::empty({b, h, nblk}, f32);
  at::Tensor mean_t = at::empty({0}, f32);
  if (mode == 1) {
    TORCH_CHECK(mean.has_value(), "mode 1 needs mean");
    mean_t = mean->contiguous();
    TORCH_CHECK(mean_t.scalar_type() == at::kFloat && mean_t.numel() == b * h * d && mean_t.device() == x.device(),
                "mean must be float32 [B, H, D] on x's device");
  } else if (mode == 2) {
    mean_t = at::empty({b, h, nblk, d}, f32);
  }
  sage3::RowsQuantArgs args{x.data_ptr(),
                            x.scalar_type() == at::kHalf ? sage3::InputType::kFloat16 : sage3::InputType::kBFloat16,
                            x.stride(0), x.stride(1), x.stride(2),
                            static_cast<int>(b), static_cast<int>(h), static_cast<int>(n), static_cast<int>(n_pad),
                            static_cast<int>(d), static_cast<int>(block), static_cast<sage3::Smoothing>(mode),
                            mode == 0 ? nullptr : mean_t.data_ptr<float>(), codes.data_ptr<uint8_t>(),
                            scales.data_ptr<uint8_t>(), gs.data_ptr<float>()};
  check_cuda(sage3::launch_quant_rows(args, c10::cuda::getCurrentCUDAStream()), "quant_nvfp4_rows");
  return {codes, scales, gs, mode == 2 ? mean_t : at::empty({0}, f32)};
}

// v: [B, H, N, D] float16/bfloat16 -> V^T (codes [B, H, D, N_pad / 2], scales as uint8 [B, H, D, N_pad / 16],
// block scales [B, H, N_pad / block]).
std::tuple<at::Tensor, at::Tensor, at::Tensor> quant_nvfp4_vt(const at::Tensor& v, int64_t block) {
  TORCH_CHECK(v.is_cuda() && v.dim() == 4, "v must be a 4-D CUDA tensor [B, H, N, D]");
  TORCH_CHECK(v.scalar_type() == at::kHalf || v.scalar_type() == at::kBFloat16, "v must be float16 or bfloat16");
  TORCH_CHECK(v.stride(3) == 1, "v must have a contiguous last dimension");
  TORCH_CHECK(v.size(3) == 64 || v.size(3) == 128, "v: head dim must be 64 or 128, got ", v.size(3));
  TORCH_CHECK(block == 128, "block must be 128");
  const c10::cuda::CUDAGuard guard(v.device());
  const int64_t b = v.size(0), h = v.size(1), n = v.size(2), d = v.size(3);
  const int64_t n_pad = (n + block - 1) / block * block;
  auto u8 = v.options().dtype(at::kByte);
  auto codes = at::empty({b, h, d, n_pad / 2}, u8);
  auto scales = at::empty({b, h, d, n_pad / 16}, u8);
  auto gs = at::empty({b, h, n_pad / block}, v.options().dtype(at::kFloat));
  sage3::VtQuantArgs args{v.data_ptr(),
                          v.scalar_type() == at::kHalf ? sage3::InputType::kFloat16 : sage3::InputType::kBFloat16,
                          v.stride(0), v.stride(1), v.stride(2),
                          static_cast<int>(b), static_cast<int>(h), static_cast<int>(n), static_cast<int>(n_pad),
                          static_cast<int>(d), static_cast<int>(block), codes.data_ptr<uint8_t>(),
                          scales.data_ptr<uint8_t>(), gs.data_ptr<float>()};
  check_cuda(sage3::launch_quant_vt(args, c10::cuda::getCurrentCUDAStream()), "quant_nvfp4_vt");
  return {codes, scales, gs};
}

void check_operand(const at::Tensor& t, const char* name, at::ScalarType type, const at::Tensor& like) {
  TORCH_CHECK(t.device() == like.device() && t.scalar_type() == type && t.is_contiguous(), name,
              " must be a contiguous ", c10::toString(type), " tensor on ", like.device());
}

// NVFP4 attention on the outputs of quant_nvfp4_rows (Q, K) and quant_nvfp4_vt (V). Writes `out`
// ([B, Hq, Nq, D] view, any strides with a contiguous last dimension, float16/bfloat16) and returns the
// LSE [B, Hq, Nq] (natural log, without the K-mean term; an empty tensor unless return_lse).
// mask: None, or [B, Hq, Nq, Nk] (broadcast strides allowed) bool/uint8 (keep where nonzero) or
// float32 (added to the scores).
at::Tensor attn_nvfp4(const at::Tensor& q_codes, const at::Tensor& q_scales, const at::Tensor& q_gs,
                      const at::Tensor& k_codes, const at::Tensor& k_scales, const at::Tensor& k_gs,
                      const at::Tensor& v_codes, const at::Tensor& v_scales, const at::Tensor& v_gs,
                      const std::optional<at::Tensor>& corr, const std::optional<at::Tensor>& mask, at::Tensor out,
                      int64_t nq, int64_t nk, bool is_causal, double qk_scale, bool return_lse) {
  TORCH_CHECK(q_codes.is_cuda() && q_codes.dim() == 4, "q_codes must be a 4-D CUDA tensor");
  const int64_t b = q_codes.size(0), hq = q_codes.size(1), nq_pad = q_codes.size(2), d = q_codes.size(3) * 2;
  const int64_t hkv = k_codes.size(1), nk_pad = k_codes.size(2);
  TORCH_CHECK(d == 64 || d == 128, "head dim must be 64 or 128, got ", d);
  const std::pair<const at::Tensor*, const char*> bytes[] = {{&q_codes, "q_codes"}, {&q_scales, "q_scales"},
                                                             {&k_codes, "k_codes"}, {&k_scales, "k_scales"},
                                                             {&v_codes, "v_codes"}, {&v_scales, "v_scales"}};
  for (const auto& [t, name] : bytes) check_operand(*t, name, at::kByte, q_codes);
  const std::pair<const at::Tensor*, const char*> floats[] = {{&q_gs, "q_gs"}, {&k_gs, "k_gs"}, {&v_gs, "v_gs"}};
  for (const auto& [t, name] : floats) check_operand(*t, name, at::kFloat, q_codes);
  TORCH_CHECK(q_scales.sizes() == at::IntArrayRef({b, hq, nq_pad, d / 16}), "q_scales: wrong shape");
  TORCH_CHECK(k_codes.dim() == 4 && k_codes.size(0) == b && k_codes.size(3) == d / 2 && hkv > 0 && hq % hkv == 0,
              "k_codes must be [B, Hkv, Nk_pad, D / 2] with Hq a multiple of Hkv");
  TORCH_CHECK(k_scales.sizes() == at::IntArrayRef({b, hkv, nk_pad, d / 16}), "k_scales: wrong shape");
  TORCH_CHECK(v_codes.sizes() == at::IntArrayRef({b, hkv, d, nk_pad / 2}), "v_codes: wrong shape");
  TORCH_CHECK(v_scales.sizes() == at::IntArrayRef({b, hkv, d, nk_pad / 16}), "v_scales: wrong shape");
  TORCH_CHECK(q_gs.numel() == b * hq * (nq_pad / 128) && k_gs.numel() == b * hkv * (nk_pad / 128) &&
                  v_gs.numel() == b * hkv * (nk_pad / 128),
              "block scales: wrong sizes");
  TORCH_CHECK(nq > 0 && nq <= nq_pad && nq_pad % 128 == 0 && nk > 0 && nk <= nk_pad && nk_pad % 128 == 0,
              "nq, nk must fit the padded operands (padded to multiples of 128)");
  TORCH_CHECK(out.device() == q_codes.device() && out.dim() == 4 && out.size(0) == b && out.size(1) == hq &&
                  out.size(2) == nq && out.size(3) == d && out.stride(3) == 1 &&
                  (out.scalar_type() == at::kHalf || out.scalar_type() == at::kBFloat16),
              "out must be a float16/bfloat16 [B, Hq, Nq, D] tensor with a contiguous last dimension");
  TORCH_CHECK(out.stride(2) % 2 == 0 && out.stride(1) % 2 == 0 && out.stride(0) % 2 == 0 &&
                  reinterpret_cast<uintptr_t>(out.data_ptr()) % 4 == 0,
              "out: the kernel stores pairs of channels; strides must be even");
  at::Tensor corr_t;
  if (corr.has_value()) {
    corr_t = *corr;
    check_operand(corr_t, "corr", at::kFloat, q_codes);
    TORCH_CHECK(corr_t.numel() == b * hq * (nq_pad / 128) * nk, "corr must be [B, Hq, Nq_pad / 128, Nk]");
  }
  sage3::AttnArgs a{};
  if (mask.has_value()) {
    const at::Tensor& m = *mask;
    TORCH_CHECK(m.device() == q_codes.device() && m.dim() == 4 && m.size(0) == b && m.size(1) == hq &&
                    m.size(2) == nq && m.size(3) == nk,
                "mask must be [B, Hq, Nq, Nk] (expanded) on q's device");
    if (m.scalar_type() == at::kBool || m.scalar_type() == at::kByte) {
      a.mask_kind = sage3::MaskKind::kBool;
    } else {
      TORCH_CHECK(m.scalar_type() == at::kFloat, "mask must be bool, uint8 or float32");
      a.mask_kind = sage3::MaskKind::kAdditive;
    }
    a.mask = m.data_ptr();
    a.mask_stride_b = m.stride(0);
    a.mask_stride_h = m.stride(1);
    a.mask_stride_m = m.stride(2);
    a.mask_stride_n = m.stride(3);
  }
  const c10::cuda::CUDAGuard guard(q_codes.device());
  at::Tensor lse = return_lse ? at::empty({b, hq, nq}, q_gs.options()) : at::empty({0}, q_gs.options());
  a.q_codes = q_codes.data_ptr<uint8_t>();
  a.q_scales = q_scales.data_ptr<uint8_t>();
  a.q_gs = q_gs.data_ptr<float>();
  a.k_codes = k_codes.data_ptr<uint8_t>();
  a.k_scales = k_scales.data_ptr<uint8_t>();
  a.k_gs = k_gs.data_ptr<float>();
  a.v_codes = v_codes.data_ptr<uint8_t>();
  a.v_scales = v_scales.data_ptr<uint8_t>();
  a.v_gs = v_gs.data_ptr<float>();
  a.corr = corr.has_value() ? corr_t.data_ptr<float>() : nullptr;
  a.out = out.data_ptr();
  a.out_type = out.scalar_type() == at::kHalf ? sage3::InputType::kFloat16 : sage3::InputType::kBFloat16;
  a.out_stride_b = out.stride(0);
  a.out_stride_h = out.stride(1);
  a.out_stride_n = out.stride(2);
  a.lse = return_lse ? lse.data_ptr<float>() : nullptr;
  a.b = static_cast<int>(b);
  a.hq = static_cast<int>(hq);
  a.hkv = static_cast<int>(hkv);
  a.nq = static_cast<int>(nq);
  a.nk = static_cast<int>(nk);
  a.nq_pad = static_cast<int>(nq_pad);
  a.nk_pad = static_cast<int>(nk_pad);
  a.d = static_cast<int>(d);
  a.qk_scale = static_cast<float>(qk_scale);
  a.causal = is_causal;
  check_cuda(sage3::launch_attention(a, c10::cuda::getCurrentCUDAStream()), "attn_nvfp4");
  return lse;
}

at::Tensor mma_nvfp4_smoke(const at::Tensor& a_codes, const at::Tensor& a_scales, const at::Tensor& b_codes,
                           const at::Tensor& b_scales) {
  const auto check = [](const at::Tensor& t, const char* name, int64_t rows, int64_t cols) {
    TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kByte && t.is_contiguous() && t.dim() == 2 &&
                    t.size(0) == rows && t.size(1) == cols,
                name, " must be a contiguous uint8 CUDA tensor [", rows, ", ", cols, "]");
  };
  check(a_codes, "a_codes", 16, 32);
  check(a_scales, "a_scales", 16, 4);
  check(b_codes, "b_codes", 8, 32);
  check(b_scales, "b_scales", 8, 4);
  const c10::cuda::CUDAGuard guard(a_codes.device());
  auto out = at::empty({16, 8}, a_codes.options().dtype(at::kFloat));
  check_cuda(sage3::launch_mma_smoke(a_codes.data_ptr<uint8_t>(), a_scales.data_ptr<uint8_t>(),
                                     b_codes.data_ptr<uint8_t>(), b_scales.data_ptr<uint8_t>(), out.data_ptr<float>(),
                                     c10::cuda::getCurrentCUDAStream()),
             "mma_nvfp4_smoke");
  return out;
}

int64_t compiled_families() { return sage3::compiled_families(); }

// The family bit (1: sm_100a, 2: sm_120a, 4: sm_90a) of the current device if this module can run on it.
int64_t device_family() { return sage3::device_family(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(sageattn3, m) {
  m.def("quant_nvfp4_rows(Tensor x, int block, int mode, Tensor? mean) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("quant_nvfp4_vt(Tensor v, int block) -> (Tensor, Tensor, Tensor)");
  m.def(
      "attn_nvfp4(Tensor q_codes, Tensor q_scales, Tensor q_gs, Tensor k_codes, Tensor k_scales, Tensor k_gs, "
      "Tensor v_codes, Tensor v_scales, Tensor v_gs, Tensor? corr, Tensor? mask, Tensor(a!) out, int nq, int nk, "
      "bool is_causal, float qk_scale, bool return_lse) -> Tensor");
  m.def("mma_nvfp4_smoke(Tensor a_codes, Tensor a_scales, Tensor b_codes, Tensor b_scales) -> Tensor");
  // No tensor arguments, so nothing to dispatch on: catch-all kernels.
  m.def("compiled_families() -> int", &compiled_families);
  m.def("device_family() -> int", &device_family);
}

TORCH_LIBRARY_IMPL(sageattn3, CUDA, m) {
  m.impl("quant_nvfp4_rows", &quant_nvfp4_rows);
  m.impl("quant_nvfp4_vt", &quant_nvfp4_vt);
  m.impl("attn_nvfp4", &attn_nvfp4);
  m.impl("mma_nvfp4_smoke", &mma_nvfp4_smoke);
}
