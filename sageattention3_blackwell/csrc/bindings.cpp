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

}  // namespace

TORCH_LIBRARY_FRAGMENT(sageattn3, m) {
  m.def("quant_nvfp4_rows(Tensor x, int block, int mode, Tensor? mean) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("mma_nvfp4_smoke(Tensor a_codes, Tensor a_scales, Tensor b_codes, Tensor b_scales) -> Tensor");
  // No tensor arguments, so nothing to dispatch on: a catch-all kernel.
  m.def("compiled_families() -> int", &compiled_families);
}

TORCH_LIBRARY_IMPL(sageattn3, CUDA, m) {
  m.impl("quant_nvfp4_rows", &quant_nvfp4_rows);
  m.impl("mma_nvfp4_smoke", &mma_nvfp4_smoke);
}
