// The one translation unit that includes torch: op schemas, argument checks, and the calls into the
// plain C++ launchers of the kernel files. It is compiled into every extension module; the
// SAGEATTN_FAMILY_* macro set by setup.py (from build-matrix.yaml) says which kernels the module
// holds, and TORCH_EXTENSION_NAME names the module.
//
// Ops are registered with TORCH_LIBRARY_FRAGMENT: several modules (and the Python-side custom ops)
// share the `sageattention` namespace. Fake (meta) implementations live in sageattention/ops.py.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <Python.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "sage_types.h"

#ifdef SAGEATTN_FAMILY_FUSED
#include "fused/quant.h"
#endif

#define SAGE_CONCAT_(a, b) a##b
#define SAGE_CONCAT(a, b) SAGE_CONCAT_(a, b)
#define SAGE_STR_(a) #a
#define SAGE_STR(a) SAGE_STR_(a)

// The module holds no Python functions: importing it runs the static registrations below.
PyMODINIT_FUNC SAGE_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, SAGE_STR(TORCH_EXTENSION_NAME), nullptr, -1, nullptr};
  return PyModule_Create(&def);
}

namespace {

void check_cuda(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, " failed: ", cudaGetErrorString(err));
}

void check_input(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(x.dim() == 4, name, " must be [B, H, N, D], got ", x.dim(), " dimensions");
  TORCH_CHECK(x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16, name,
              " must be float16 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK(x.stride(3) == 1, name, " must have a contiguous last dimension");
}

void check_float(const at::Tensor& x, const char* name, const at::Tensor& like, int64_t heads) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.device() == like.device(), name,
              " must be a contiguous float32 tensor on ", like.device());
  TORCH_CHECK(x.dim() == 3 && x.size(0) == like.size(0) && x.size(1) == heads && x.size(2) == like.size(3), name,
              " must be [B, H, D] = [", like.size(0), ", ", heads, ", ", like.size(3), "], got ", x.sizes());
}

[[maybe_unused]] sage::HalfType half_type(const at::Tensor& x) {
  return x.scalar_type() == at::kHalf ? sage::HalfType::kFloat16 : sage::HalfType::kBFloat16;
}

[[maybe_unused]] sage::Strides3 strides(const at::Tensor& x) { return {x.stride(0), x.stride(1), x.stride(2)}; }

[[maybe_unused]] void check_d_pad(int64_t d_pad, int64_t head_dim) {
  TORCH_CHECK((d_pad == 32 || d_pad == 64 || d_pad == 128) && head_dim <= d_pad,
              "d_pad must be 32, 64 or 128 and at least the head dim ", head_dim, ", got ", d_pad);
}

#ifdef SAGEATTN_FAMILY_FUSED
std::tuple<at::Tensor, at::Tensor, at::Tensor> quant_q_per_token(const at::Tensor& q,
                                                                 const std::optional<at::Tensor>& k_mean,
                                                                 double sm_scale, double scale_mul, int64_t d_pad,
                                                                 int64_t kv_group, bool with_corr) {
  check_input(q, "q");
  check_d_pad(d_pad, q.size(3));
  TORCH_CHECK(kv_group >= 1 && q.size(1) % kv_group == 0, "kv_group must divide the head count");
  TORCH_CHECK(!with_corr || k_mean.has_value(), "with_corr needs k_mean");
  if (with_corr) check_float(*k_mean, "k_mean", q, q.size(1) / kv_group);
  const c10::cuda::CUDAGuard guard(q.device());
  const int64_t b = q.size(0), h = q.size(1), n = q.size(2);
  auto q_int8 = at::empty({b, h, n, d_pad}, q.options().dtype(at::kChar));
  auto q_scale = at::empty({b, h, n}, q.options().dtype(at::kFloat));
  auto corr = at::empty({with_corr ? b : 0, h, n}, q.options().dtype(at::kFloat));
  check_cuda(sage::launch_quant_q_per_token(
                 q.data_ptr(), half_type(q), strides(q), b, h, n, q.size(3), d_pad, static_cast<float>(scale_mul),
                 q_int8.data_ptr<int8_t>(), q_scale.data_ptr<float>(),
                 with_corr ? k_mean->data_ptr<float>() : nullptr, kv_group, static_cast<float>(sm_scale),
                 with_corr ? corr.data_ptr<float>() : nullptr, c10::cuda::getCurrentCUDAStream().stream()),
             "quant_q_per_token");
  return {q_int8, q_scale, corr};
}

std::tuple<at::Tensor, at::Tensor> quant_k_per_block(const at::Tensor& k, const std::optional<at::Tensor>& k_mean,
                                                     int64_t block, int64_t d_pad) {
  check_input(k, "k");
  check_d_pad(d_pad, k.size(3));
  TORCH_CHECK(block >= 1, "block must be positive, got ", block);
  if (k_mean.has_value()) check_float(*k_mean, "k_mean", k, k.size(1));
  const c10::cuda::CUDAGuard guard(k.device());
  const int64_t b = k.size(0), h = k.size(1), n = k.size(2);
  auto k_int8 = at::empty({b, h, n, d_pad}, k.options().dtype(at::kChar));
  auto k_scale = at::empty({b, h, (n + block - 1) / block}, k.options().dtype(at::kFloat));
  check_cuda(sage::launch_quant_k_per_block(k.data_ptr(), half_type(k), strides(k), b, h, n, k.size(3), d_pad,
                                            block, k_mean.has_value() ? k_mean->data_ptr<float>() : nullptr,
                                            k_int8.data_ptr<int8_t>(), k_scale.data_ptr<float>(),
                                            c10::cuda::getCurrentCUDAStream().stream()),
             "quant_k_per_block");
  return {k_int8, k_scale};
}

at::Tensor quant_v_fp8(const at::Tensor& v, const at::Tensor& v_amax, int64_t d_pad, int64_t n_pad) {
  check_input(v, "v");
  check_d_pad(d_pad, v.size(3));
  check_float(v_amax, "v_amax", v, v.size(1));
  TORCH_CHECK(n_pad >= v.size(2), "n_pad must be at least the sequence length");
  const c10::cuda::CUDAGuard guard(v.device());
  const int64_t b = v.size(0), h = v.size(1), n = v.size(2);
  auto vt = at::empty({b, h, d_pad, n_pad}, v.options().dtype(at::kFloat8_e4m3fn));
  check_cuda(sage::launch_quant_v_fp8_transposed(v.data_ptr(), half_type(v), strides(v), b, h, n, v.size(3), d_pad,
                                                 n_pad, v_amax.data_ptr<float>(),
                                                 static_cast<uint8_t*>(vt.data_ptr()),
                                                 c10::cuda::getCurrentCUDAStream().stream()),
             "quant_v_fp8");
  return vt;
}
#endif

}  // namespace

#ifdef SAGEATTN_FAMILY_FUSED
TORCH_LIBRARY_FRAGMENT(sageattention, m) {
  m.def(
      "quant_q_per_token(Tensor q, Tensor? k_mean, float sm_scale, float scale_mul, int d_pad, int kv_group, "
      "bool with_corr) -> (Tensor, Tensor, Tensor)");
  m.def("quant_k_per_block(Tensor k, Tensor? k_mean, int block, int d_pad) -> (Tensor, Tensor)");
  m.def("quant_v_fp8(Tensor v, Tensor v_amax, int d_pad, int n_pad) -> Tensor");
}

TORCH_LIBRARY_IMPL(sageattention, CUDA, m) {
  m.impl("quant_q_per_token", &quant_q_per_token);
  m.impl("quant_k_per_block", &quant_k_per_block);
  m.impl("quant_v_fp8", &quant_v_fp8);
}
#endif
