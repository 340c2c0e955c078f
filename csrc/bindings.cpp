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

#if defined(SAGEATTN_FAMILY_FUSED) || defined(SAGEATTN_FAMILY_SM90)
#include <algorithm>
#include <array>
#include <vector>

#include "fused/quant.h"  // the sm90 module holds quant_qkv.cu too (attn_sm90, build-matrix.yaml)
#endif
#ifdef SAGEATTN_FAMILY_SM80
#include <string>
#include <vector>

#include "sm80/attn.h"
#endif
#ifdef SAGEATTN_FAMILY_SM89
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "sm89/attn.h"
#endif
#ifdef SAGEATTN_FAMILY_SM90
#include <cuda_runtime.h>

#include <vector>

#include "sm90/attn.h"
#endif

#define SAGE_CONCAT_(a, b) a##b
#define SAGE_CONCAT(a, b) SAGE_CONCAT_(a, b)
#define SAGE_STR_(a) #a
#define SAGE_STR(a) SAGE_STR_(a)

// The module holds no Python functions: importing it runs the static registrations below. The sm89
// module also carries FP8_MMA_F16_ACCUM (1 or 0): whether its "fp32+fp16" kernels were built (the
// FP16-accumulating FP8 MMA needs CUDA >= 12.8), so Python can choose without trying.
PyMODINIT_FUNC SAGE_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, SAGE_STR(TORCH_EXTENSION_NAME), nullptr, -1, nullptr};
  PyObject* module = PyModule_Create(&def);
#ifdef SAGEATTN_FAMILY_SM89
  if (module != nullptr &&
      PyModule_AddIntConstant(module, "FP8_MMA_F16_ACCUM", sage::sm89_fp16_accum_built() ? 1 : 0) != 0) {
    Py_DECREF(module);
    return nullptr;
  }
#endif
  return module;
}

namespace {

void check_cuda(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, " failed: ", cudaGetErrorString(err));
}

[[maybe_unused]] void check_input(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(x.dim() == 4, name, " must be [B, H, N, D], got ", x.dim(), " dimensions");
  TORCH_CHECK(x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16, name,
              " must be float16 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK(x.stride(3) == 1, name, " must have a contiguous last dimension");
}

[[maybe_unused]] void check_float(const at::Tensor& x, const char* name, const at::Tensor& like, int64_t heads) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.device() == like.device(), name,
              " must be a contiguous float32 tensor on ", like.device());
  TORCH_CHECK(x.dim() == 3 && x.size(0) == like.size(0) && x.size(1) == heads && x.size(2) == like.size(3), name,
              " must be [B, H, D] = [", like.size(0), ", ", heads, ", ", like.size(3), "], got ", x.sizes());
}

[[maybe_unused]] sage::HalfType half_type(const at::Tensor& x) {
  return x.scalar_type() == at::kHalf ? sage::HalfType::kFloat16 : sage::HalfType::kBFloat16;
}

[[maybe_unused]] sage::Strides3 strides(const at::Tensor& x) { return {x.stride(0), x.stride(1), x.stride(2)}; }

// The sizes of an argument struct with query and KV head counts (sage::QuantQkvArgs, AttnSm90Args),
// checked by the caller to fit in int.
template <typename Args>
[[maybe_unused]] void set_sizes(Args& args, int64_t b, int64_t hq, int64_t hkv, int64_t nq, int64_t nk,
                                int64_t head_dim, int64_t d_pad) {
  args.batch = static_cast<int>(b);
  args.heads_q = static_cast<int>(hq);
  args.heads_kv = static_cast<int>(hkv);
  args.nq = static_cast<int>(nq);
  args.nk = static_cast<int>(nk);
  args.head_dim = static_cast<int>(head_dim);
  args.d_pad = static_cast<int>(d_pad);
}

[[maybe_unused]] void check_d_pad(int64_t d_pad, int64_t head_dim) {
  TORCH_CHECK((d_pad == 32 || d_pad == 64 || d_pad == 128) && head_dim <= d_pad,
              "d_pad must be 32, 64 or 128 and at least the head dim ", head_dim, ", got ", d_pad);
}

#if defined(SAGEATTN_FAMILY_FUSED) || defined(SAGEATTN_FAMILY_SM90)
// The inputs of quant_qkv_sm90 (and of attn_sm90, which quantizes the same way), checked: the argument
// struct with the inputs, sizes and options set and every output pointer null.
sage::QuantQkvArgs qkv_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool smooth_k,
                              double sm_scale, double scale_mul, int64_t d_pad, bool with_corr) {
  check_input(q, "q");
  check_input(k, "k");
  check_input(v, "v");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "q, k and v must share one dtype, got ", q.scalar_type(), ", ", k.scalar_type(), " and ",
              v.scalar_type());
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device(), "q, k and v must be on one device, got ",
              q.device(), ", ", k.device(), " and ", v.device());
  const int64_t b = q.size(0), hq = q.size(1), nq = q.size(2), head_dim = q.size(3);
  const int64_t hkv = k.size(1), nk = k.size(2);
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == b && k.size(3) == head_dim, "k ", k.sizes(), " and v ",
              v.sizes(), " must be [B, Hkv, Nk, D] = [", b, ", Hkv, Nk, ", head_dim, "]");
  TORCH_CHECK(hkv >= 1 && hq % hkv == 0, "the query heads (", hq, ") must be a multiple of the KV heads (", hkv, ")");
  TORCH_CHECK(d_pad == 64 || d_pad == 128, "d_pad must be 64 or 128, got ", d_pad);
  TORCH_CHECK(head_dim % 8 == 0 && head_dim >= 8 && head_dim <= d_pad, "the head dim D = ", head_dim,
              " must be a multiple of 8 and at most d_pad ", d_pad);
  TORCH_CHECK(nk >= 1, "k and v must hold at least one key");
  TORCH_CHECK(nq < (int64_t{1} << 31) - 1024 && nk < (int64_t{1} << 31) - 1024,
              "sequence lengths must be below 2^31 - 1024");
  TORCH_CHECK(b <= 65535 && hkv <= 65535, "B and Hkv must be at most 65535, got ", b, " and ", hkv);
  TORCH_CHECK(!with_corr || smooth_k, "with_corr needs smooth_k (the correction is q . k_mean)");
  sage::QuantQkvArgs args{};
  args.q = q.data_ptr();
  args.k = k.data_ptr();
  args.v = v.data_ptr();
  args.type = half_type(q);
  args.q_strides = strides(q);
  args.k_strides = strides(k);
  args.v_strides = strides(v);
  set_sizes(args, b, hq, hkv, nq, nk, head_dim, d_pad);
  args.n_pad = static_cast<int>((nk + sage::kQkvKeyGroup - 1) / sage::kQkvKeyGroup * sage::kQkvKeyGroup);
  args.smooth_k = smooth_k;
  args.sm_scale = static_cast<float>(sm_scale);
  args.scale_mul = static_cast<float>(scale_mul);
  return args;
}

// quant_qkv_sm90's nine outputs, in its return order (the workspace last, not returned): the shape and
// element type of each, from the checked arguments; empty where the options leave one out (corr without
// with_corr, k_mean without smooth-K). quant_qkv_sm90 allocates them one by one, attn_sm90 places them
// in one buffer; set_outputs points the arguments at them.
enum QkvPart { kQInt8, kQScale, kCorr, kKInt8, kKScale, kVt, kVScale, kKMean, kWorkspace, kQkvParts };
struct QkvLayout {
  std::array<std::vector<int64_t>, kQkvParts> shape;
  std::array<at::ScalarType, kQkvParts> dtype;
  QkvLayout(const sage::QuantQkvArgs& a, bool with_corr) {
    const int64_t b = a.batch, hq = a.heads_q, hkv = a.heads_kv, nq = a.nq, nk = a.nk, d = a.head_dim;
    const int64_t d_pad = a.d_pad, key_blocks = (nk + sage::kQkvKeyBlock - 1) / sage::kQkvKeyBlock;
    shape = {{{b, hq, nq, d_pad},
              {b, hq, nq},
              {with_corr ? b : 0, hq, nq},
              {b, hkv, nk, d_pad},
              {b, hkv, key_blocks},
              {b, hkv, d_pad, a.n_pad},
              {b, hkv, d},
              a.smooth_k ? std::vector<int64_t>{b, hkv, d} : std::vector<int64_t>{0},
              {sage::quant_qkv_workspace_floats(a.batch, a.heads_kv, a.nk, a.d_pad)}}};
    dtype = {at::kChar, at::kFloat, at::kFloat, at::kChar, at::kFloat, at::kFloat8_e4m3fn, at::kFloat, at::kFloat,
             at::kFloat};
  }
  int64_t bytes(int part) const {
    int64_t n = 1;
    for (const int64_t e : shape[part]) n *= e;
    return n * static_cast<int64_t>(at::elementSize(dtype[part]));
  }
  // (b, h, n) strides in elements of a contiguous part (the last dimension's extent past n, if any).
  sage::Strides3 strides(int part) const {
    const std::vector<int64_t>& e = shape[part];
    const int64_t inner = e.size() == 4 ? e[3] : 1;
    return {e[1] * e[2] * inner, e[2] * inner, inner};
  }
};

void set_outputs(sage::QuantQkvArgs& a, const std::array<void*, kQkvParts>& p, bool with_corr) {
  a.q_int8 = static_cast<int8_t*>(p[kQInt8]);
  a.q_scale = static_cast<float*>(p[kQScale]);
  a.corr = with_corr ? static_cast<float*>(p[kCorr]) : nullptr;
  a.k_int8 = static_cast<int8_t*>(p[kKInt8]);
  a.k_scale = static_cast<float*>(p[kKScale]);
  a.vt = static_cast<uint8_t*>(p[kVt]);
  a.v_scale = static_cast<float*>(p[kVScale]);
  a.k_mean = a.smooth_k ? static_cast<float*>(p[kKMean]) : nullptr;
  a.workspace = static_cast<float*>(p[kWorkspace]);
}

// The fused quantization on the current stream, with a clear_nonce of its own (quant.h).
void launch_quant_qkv(sage::QuantQkvArgs& a, const char* what) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  a.clear_nonce = sage::quant_qkv_clear_nonce(stream);
  check_cuda(sage::launch_quant_qkv_sm90(a, stream), what);
}
#endif

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

// Returns [k_int8, k_scale], or [k_int8, k_scale, k_residual] with residual: the second INT8 digit of
// two-level K (laid out like k_int8), k_scale then being amax * K_RESIDUAL_SCALE (csrc/fused/quant.h).
// A list, so that callers of the one-level form keep unpacking two tensors.
std::vector<at::Tensor> quant_k_per_block(const at::Tensor& k, const std::optional<at::Tensor>& k_mean, int64_t block,
                                          int64_t d_pad, bool residual) {
  check_input(k, "k");
  check_d_pad(d_pad, k.size(3));
  TORCH_CHECK(block >= 1, "block must be positive, got ", block);
  if (k_mean.has_value()) check_float(*k_mean, "k_mean", k, k.size(1));
  const c10::cuda::CUDAGuard guard(k.device());
  const int64_t b = k.size(0), h = k.size(1), n = k.size(2);
  auto k_int8 = at::empty({b, h, n, d_pad}, k.options().dtype(at::kChar));
  auto k_scale = at::empty({b, h, (n + block - 1) / block}, k.options().dtype(at::kFloat));
  at::Tensor k_residual = residual ? at::empty_like(k_int8) : at::Tensor();
  check_cuda(sage::launch_quant_k_per_block(k.data_ptr(), half_type(k), strides(k), b, h, n, k.size(3), d_pad,
                                            block, k_mean.has_value() ? k_mean->data_ptr<float>() : nullptr,
                                            k_int8.data_ptr<int8_t>(),
                                            residual ? k_residual.data_ptr<int8_t>() : nullptr,
                                            k_scale.data_ptr<float>(), c10::cuda::getCurrentCUDAStream().stream()),
             "quant_k_per_block");
  if (residual) return {k_int8, k_scale, k_residual};
  return {k_int8, k_scale};
}

// permute_keys: the key order the FP8 P·V kernels (sm_90a, sm89) multiply with (csrc/fused/quant.h);
// needs n_pad to be a multiple of 16.
at::Tensor quant_v_fp8(const at::Tensor& v, const at::Tensor& v_amax, int64_t d_pad, int64_t n_pad,
                       bool permute_keys) {
  check_input(v, "v");
  check_d_pad(d_pad, v.size(3));
  check_float(v_amax, "v_amax", v, v.size(1));
  TORCH_CHECK(n_pad >= v.size(2), "n_pad must be at least the sequence length");
  TORCH_CHECK(!permute_keys || n_pad % 16 == 0, "permute_keys needs n_pad to be a multiple of 16, got ", n_pad);
  const c10::cuda::CUDAGuard guard(v.device());
  const int64_t b = v.size(0), h = v.size(1), n = v.size(2);
  auto vt = at::empty({b, h, d_pad, n_pad}, v.options().dtype(at::kFloat8_e4m3fn));
  check_cuda(sage::launch_quant_v_fp8_transposed(v.data_ptr(), half_type(v), strides(v), b, h, n, v.size(3), d_pad,
                                                 n_pad, v_amax.data_ptr<float>(),
                                                 static_cast<uint8_t*>(vt.data_ptr()), permute_keys,
                                                 c10::cuda::getCurrentCUDAStream().stream()),
             "quant_v_fp8");
  return vt;
}

// Q, K and V of one sm_90a attention call (sageattention.cuda_sm90) in one kernel launch (two for long
// sequences) after the clearing of its counters (csrc/fused/quant_qkv.cu): what quant_q_per_token,
// quant_k_per_block(block = 128), quant_v_fp8(..., permute_keys=True) and the K mean / V amax around
// them give, bit for bit given the returned k_mean.
// q [B, Hq, Nq, D], k and v [B, Hkv, Nk, D]: views with a unit last stride, one dtype (float16 or
// bfloat16), Hq a multiple of Hkv, D a multiple of 8 and at most d_pad (64 or 128). Returns q_int8
// [B, Hq, Nq, d_pad], q_scale [B, Hq, Nq], corr [B, Hq, Nq] ([0, Hq, Nq] without with_corr, which
// needs smooth_k), k_int8 [B, Hkv, Nk, d_pad], k_scale [B, Hkv, ceil(Nk / 128)], vt [B, Hkv, d_pad,
// n_pad] float8_e4m3fn (n_pad = Nk rounded up to 16), v_scale [B, Hkv, D] = v_amax * float(1 / 448)
// and k_mean [B, Hkv, D] (an empty [0] without smooth_k).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
quant_qkv_sm90(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool smooth_k, double sm_scale,
               double scale_mul, int64_t d_pad, bool with_corr) {
  sage::QuantQkvArgs args = qkv_inputs(q, k, v, smooth_k, sm_scale, scale_mul, d_pad, with_corr);
  const c10::cuda::CUDAGuard guard(q.device());
  const QkvLayout layout(args, with_corr);
  std::array<at::Tensor, kQkvParts> t;
  std::array<void*, kQkvParts> p;
  for (int i = 0; i < kQkvParts; ++i) {
    t[i] = at::empty(layout.shape[i], q.options().dtype(layout.dtype[i]));
    p[i] = t[i].data_ptr();
  }
  set_outputs(args, p, with_corr);
  launch_quant_qkv(args, "quant_qkv_sm90");
  return {t[kQInt8], t[kQScale], t[kCorr], t[kKInt8], t[kKScale], t[kVt], t[kVScale], t[kKMean]};
}
#endif

#if defined(SAGEATTN_FAMILY_SM80) || defined(SAGEATTN_FAMILY_SM89)
// The mma.sync kernels (csrc/sm80, csrc/sm89; sage_attn_mma.cuh) read what the fused quantization ops
// produce: q_int8 [B, Hq, Nq, d_pad] with q_scale [B, Hq, Nq] (quant_q_per_token), k_int8
// [B, Hkv, Nk, d_pad] with k_scale [B, Hkv, ceil(Nk / 64)] (quant_k_per_block with block = 64). They
// return out [B, Hq, Nq, D] of out_dtype, whose memory is [B, Nq, Hq, D] when out_nhd (so an NHD
// caller gets NHD memory without a copy), and the natural-log LSE [B, Hq, Nq] float32 (plus corr when
// given) or an empty tensor without return_lse.
void check_int8_qk(const at::Tensor& x, const char* name, int64_t align_elems) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kChar && x.dim() == 4, name,
              " must be a 4-d int8 CUDA tensor [B, H, N, d_pad], got ", x.scalar_type(), " ", x.sizes(), " on ",
              x.device());
  TORCH_CHECK(x.stride(3) == 1, name, " must have a contiguous last dimension, got strides ", x.strides());
  TORCH_CHECK(x.size(3) == 64 || x.size(3) == 128, name, ": d_pad (its last dim) must be 64 or 128, got ",
              x.size(3));
  // Q is read as 4-byte words, K with 16-byte cp.async: rows and the base must be aligned to that.
  TORCH_CHECK(reinterpret_cast<uintptr_t>(x.data_ptr()) % align_elems == 0 && x.stride(0) % align_elems == 0 &&
                  x.stride(1) % align_elems == 0 && x.stride(2) % align_elems == 0,
              name, " must be aligned to ", align_elems, " bytes (base and strides), got strides ", x.strides());
}

void check_scale(const at::Tensor& x, const char* name, at::IntArrayRef sizes, const at::Tensor& like) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device() == like.device() && x.sizes() == sizes, name,
              " must be a float32 tensor of shape ", sizes, " on ", like.device(), ", got ", x.scalar_type(), " ",
              x.sizes(), " on ", x.device());
}

// Checks Q, K and their scales, allocates out and lse, and fills the arguments both kernels share.
// head_dim: the output's head dim D, taken from head_dim_from (named in errors).
sage::MmaAttnArgs mma_common_args(const at::Tensor& q_int8, const at::Tensor& k_int8, const at::Tensor& q_scale,
                                  const at::Tensor& k_scale, const std::optional<at::Tensor>& corr, bool is_causal,
                                  bool return_lse, at::ScalarType out_dtype, bool out_nhd, int64_t head_dim,
                                  const char* head_dim_from, at::Tensor& out, at::Tensor& lse) {
  check_int8_qk(q_int8, "q_int8", 4);
  check_int8_qk(k_int8, "k_int8", 16);
  TORCH_CHECK(q_int8.device() == k_int8.device(), "q_int8 and k_int8 must be on one device, got ", q_int8.device(),
              " and ", k_int8.device());
  const int64_t b = q_int8.size(0), hq = q_int8.size(1), nq = q_int8.size(2), d_pad = q_int8.size(3);
  const int64_t hkv = k_int8.size(1), nk = k_int8.size(2);
  TORCH_CHECK(k_int8.size(0) == b && k_int8.size(3) == d_pad, "k_int8 must be [", b, ", Hkv, Nk, ", d_pad,
              "], got ", k_int8.sizes());
  TORCH_CHECK(hkv >= 1 && hq % hkv == 0, "the query heads (", hq, ") must be a multiple of the KV heads (", hkv, ")");
  TORCH_CHECK(head_dim % 8 == 0 && head_dim >= 8 && head_dim <= d_pad, "the head dim D = ", head_dim, " (",
              head_dim_from, ") must be a multiple of 8 and at most d_pad ", d_pad);
  TORCH_CHECK(nq < (int64_t{1} << 31) && nk < (int64_t{1} << 31), "sequence lengths must be below 2^31");
  const int64_t key_blocks = (nk + sage::kMmaKeyBlock - 1) / sage::kMmaKeyBlock;
  check_scale(q_scale, "q_scale", {b, hq, nq}, q_int8);
  check_scale(k_scale, "k_scale (one scale per 64 keys)", {b, hkv, key_blocks}, q_int8);
  if (corr.has_value()) check_scale(*corr, "corr", {b, hq, nq}, q_int8);
  TORCH_CHECK(out_dtype == at::kHalf || out_dtype == at::kBFloat16, "out_dtype must be float16 or bfloat16, got ",
              out_dtype);

  const auto out_options = q_int8.options().dtype(out_dtype);
  out = out_nhd ? at::empty({b, nq, hq, head_dim}, out_options).transpose(1, 2)
                : at::empty({b, hq, nq, head_dim}, out_options);
  const std::vector<int64_t> lse_shape = return_lse ? std::vector<int64_t>{b, hq, nq} : std::vector<int64_t>{0};
  lse = at::empty(lse_shape, q_int8.options().dtype(at::kFloat));

  sage::MmaAttnArgs args{};
  args.q = q_int8.data_ptr<int8_t>();
  args.q_strides = strides(q_int8);
  args.k = k_int8.data_ptr<int8_t>();
  args.k_strides = strides(k_int8);
  args.q_scale = q_scale.data_ptr<float>();
  args.q_scale_strides = strides(q_scale);
  args.k_scale = k_scale.data_ptr<float>();
  args.k_scale_strides = strides(k_scale);
  if (corr.has_value() && return_lse) {
    args.corr = corr->data_ptr<float>();
    args.corr_strides = strides(*corr);
  }
  args.out = out.data_ptr();
  args.out_strides = strides(out);
  args.out_type = half_type(out);
  if (return_lse) {
    args.lse = lse.data_ptr<float>();
    args.lse_strides = strides(lse);
  }
  args.batch = static_cast<int>(b);
  args.heads_q = static_cast<int>(hq);
  args.kv_group = static_cast<int>(hq / hkv);
  args.nq = static_cast<int>(nq);
  args.nk = static_cast<int>(nk);
  args.head_dim = static_cast<int>(head_dim);
  args.d_pad = static_cast<int>(d_pad);
  args.causal = is_causal;
  return args;
}
#endif

#ifdef SAGEATTN_FAMILY_SM80
// INT8 Q·Kᵀ, FP16 P·V attention (csrc/sm80). v: FP16 [B, Hkv, Nk, D] (any strides, unit last stride).
// k_residual (optional): K's second INT8 digit [B, Hkv, Nk, d_pad] (quant_k_per_block with
// residual=True), k_scale then being that op's two-level scale.
std::tuple<at::Tensor, at::Tensor> qk_int8_sv_f16_attn(const at::Tensor& q_int8, const at::Tensor& k_int8,
                                                       const at::Tensor& v, const at::Tensor& q_scale,
                                                       const at::Tensor& k_scale,
                                                       const std::optional<at::Tensor>& corr, bool is_causal,
                                                       bool return_lse, at::ScalarType out_dtype, bool out_nhd,
                                                       c10::string_view pv_accum,
                                                       const std::optional<at::Tensor>& k_residual) {
  sage::PvAccum accum;
  if (pv_accum == "fp32") {
    accum = sage::PvAccum::kFp32;
  } else if (pv_accum == "fp16+fp32") {
    accum = sage::PvAccum::kFp16ThenFp32;
  } else {
    TORCH_CHECK(false, "pv_accum must be 'fp32' or 'fp16+fp32', got '", std::string(pv_accum), "'");
  }
  TORCH_CHECK(v.is_cuda() && v.scalar_type() == at::kHalf && v.dim() == 4 && v.stride(3) == 1,
              "v must be a 4-d float16 CUDA tensor [B, Hkv, Nk, D] with a contiguous last dimension, got ",
              v.scalar_type(), " ", v.sizes(), " strides ", v.strides(), " on ", v.device());
  TORCH_CHECK(reinterpret_cast<uintptr_t>(v.data_ptr()) % 16 == 0 && v.stride(0) % 8 == 0 && v.stride(1) % 8 == 0 &&
                  v.stride(2) % 8 == 0,
              "v must be aligned to 16 bytes (base and strides), got strides ", v.strides());

  const c10::cuda::CUDAGuard guard(q_int8.device());
  at::Tensor out, lse;
  sage::AttnSm80Args args = mma_common_args(q_int8, k_int8, q_scale, k_scale, corr, is_causal, return_lse, out_dtype,
                                            out_nhd, v.size(3), "v's last dim", out, lse);
  TORCH_CHECK(v.device() == q_int8.device(), "q_int8, k_int8 and v must be on one device, got ", q_int8.device(),
              " and ", v.device());
  TORCH_CHECK(v.size(0) == k_int8.size(0) && v.size(1) == k_int8.size(1) && v.size(2) == k_int8.size(2),
              "v must be [", k_int8.size(0), ", ", k_int8.size(1), ", ", k_int8.size(2), ", D] like k_int8, got ",
              v.sizes());
  if (k_residual.has_value()) {
    check_int8_qk(*k_residual, "k_residual", 16);
    TORCH_CHECK(k_residual->sizes() == k_int8.sizes() && k_residual->device() == k_int8.device(),
                "k_residual must have k_int8's shape ", k_int8.sizes(), " and device ", k_int8.device(), ", got ",
                k_residual->sizes(), " on ", k_residual->device());
    args.k_residual = k_residual->data_ptr<int8_t>();
    args.k_residual_strides = strides(*k_residual);
  }
  args.v = v.data_ptr();
  args.v_strides = strides(v);
  args.accum = accum;
  check_cuda(sage::launch_qk_int8_sv_f16_attn_sm80(args, c10::cuda::getCurrentCUDAStream().stream()),
             "qk_int8_sv_f16_attn");
  return {out, lse};
}
#endif

#ifdef SAGEATTN_FAMILY_SM89
// INT8 Q·Kᵀ, FP8 P·V attention (csrc/sm89), sm_89 and newer. vt_fp8: Vᵀ [B, Hkv, d_pad, n_pad]
// float8_e4m3fn from quant_v_fp8(..., permute_keys=True) (n_pad >= Nk, a multiple of 16); v_scale
// [B, Hkv, D] float32 (v_amax / 448), whose last dim D (a multiple of 8, at most d_pad) is the head
// dim of the output. pv_accum: "fp32", "fp32+fp32" or "fp32+fp16"; the last accumulates each 64-key
// block in FP16 and needs V quantized with v_amax * 256 (v_scale = v_amax * 256 / 448), see
// kSm89Fp16AccumVHeadroom in csrc/sm89/attn.h.
std::tuple<at::Tensor, at::Tensor> qk_int8_sv_f8_attn_sm89(const at::Tensor& q_int8, const at::Tensor& k_int8,
                                                           const at::Tensor& vt_fp8, const at::Tensor& q_scale,
                                                           const at::Tensor& k_scale, const at::Tensor& v_scale,
                                                           const std::optional<at::Tensor>& corr, bool is_causal,
                                                           bool return_lse, at::ScalarType out_dtype, bool out_nhd,
                                                           c10::string_view pv_accum) {
  sage::PvAccum accum;
  if (pv_accum == "fp32") {
    accum = sage::PvAccum::kFp32;
  } else if (pv_accum == "fp32+fp32") {
    accum = sage::PvAccum::kFp32ThenFp32;
  } else if (pv_accum == "fp32+fp16") {
    accum = sage::PvAccum::kFp16ThenFp32;
    TORCH_CHECK(sage::sm89_fp16_accum_built(),
                "pv_accum 'fp32+fp16' needs the FP16-accumulating FP8 MMA (PTX ISA 8.7), which this build of "
                "sageattention._qattn_sm89 lacks: it was compiled with a CUDA older than 12.8. Use 'fp32+fp32'.");
  } else {
    TORCH_CHECK(false, "pv_accum must be 'fp32', 'fp32+fp32' or 'fp32+fp16', got '", std::string(pv_accum), "'");
  }
  TORCH_CHECK(vt_fp8.is_cuda() && vt_fp8.scalar_type() == at::kFloat8_e4m3fn && vt_fp8.dim() == 4,
              "vt_fp8 must be a 4-d float8_e4m3fn CUDA tensor [B, Hkv, d_pad, n_pad], got ", vt_fp8.scalar_type(),
              " ", vt_fp8.sizes(), " on ", vt_fp8.device());
  // Read with 16-byte cp.async: a 16-byte aligned base and strides (bytes = elements here).
  TORCH_CHECK(vt_fp8.stride(3) == 1 && reinterpret_cast<uintptr_t>(vt_fp8.data_ptr()) % 16 == 0 &&
                  vt_fp8.stride(0) % 16 == 0 && vt_fp8.stride(1) % 16 == 0 && vt_fp8.stride(2) % 16 == 0,
              "vt_fp8 must have a contiguous last dimension, a 16-byte aligned base and strides that are multiples "
              "of 16, got strides ",
              vt_fp8.strides());
  TORCH_CHECK(v_scale.scalar_type() == at::kFloat && v_scale.dim() == 3, "v_scale must be a 3-d float32 tensor "
              "[B, Hkv, D], got ", v_scale.scalar_type(), " ", v_scale.sizes());

  const c10::cuda::CUDAGuard guard(q_int8.device());
  int major = 0, minor = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q_int8.get_device()),
             "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, q_int8.get_device()),
             "cudaDeviceGetAttribute");
  TORCH_CHECK(major * 10 + minor >= 89, "qk_int8_sv_f8_attn_sm89 needs an sm_89 or newer GPU (FP8 MMA), got sm_",
              major, minor);
  at::Tensor out, lse;
  sage::AttnSm89Args args = mma_common_args(q_int8, k_int8, q_scale, k_scale, corr, is_causal, return_lse,
                                            out_dtype, out_nhd, v_scale.size(2), "v_scale's last dim", out, lse);
  const int64_t b = k_int8.size(0), hkv = k_int8.size(1), nk = k_int8.size(2), d_pad = k_int8.size(3);
  const int64_t n_pad = vt_fp8.size(3);
  TORCH_CHECK(vt_fp8.device() == q_int8.device() && v_scale.device() == q_int8.device(),
              "q_int8, k_int8, vt_fp8 and v_scale must be on one device, got ", q_int8.device(), ", ",
              vt_fp8.device(), " and ", v_scale.device());
  TORCH_CHECK(vt_fp8.size(0) == b && vt_fp8.size(1) == hkv && vt_fp8.size(2) == d_pad,
              "vt_fp8 must be [B, Hkv, d_pad, n_pad] = [", b, ", ", hkv, ", ", d_pad, ", n_pad] to match k_int8, got ",
              vt_fp8.sizes());
  TORCH_CHECK(n_pad >= nk && n_pad % sage::kSm89KeyPermuteGroup == 0 && n_pad < (int64_t{1} << 31),
              "vt_fp8: n_pad (its last dim) must be at least Nk = ", nk, " and a multiple of ",
              sage::kSm89KeyPermuteGroup, ", got ", n_pad);
  TORCH_CHECK(v_scale.size(0) == b && v_scale.size(1) == hkv, "v_scale must be [", b, ", ", hkv,
              ", D] to match k_int8, got ", v_scale.sizes());
  args.v = vt_fp8.data_ptr();
  args.v_strides = strides(vt_fp8);
  args.n_pad = static_cast<int>(n_pad);
  args.v_scale = v_scale.data_ptr<float>();
  args.v_scale_strides = strides(v_scale);
  args.accum = accum;
  check_cuda(sage::launch_qk_int8_sv_f8_attn_sm89(args, c10::cuda::getCurrentCUDAStream().stream()),
             "qk_int8_sv_f8_attn_sm89");
  return {out, lse};
}
#endif

#ifdef SAGEATTN_FAMILY_SM90
// INT8 Q·Kᵀ, FP8 P·V attention for sm_90a (csrc/sm90). Inputs are what the fused quantization ops
// produce: q_int8 [B, Hq, Nq, d_pad] with q_scale [B, Hq, Nq] (quant_q_per_token), k_int8
// [B, Hkv, Nk, d_pad] with k_scale [B, Hkv, ceil(Nk / 128)] (quant_k_per_block with block = 128),
// vt_fp8 [B, Hkv, d_pad, n_pad] float8_e4m3fn (quant_v_fp8 with permute_keys=True; n_pad >= Nk, a
// multiple of 16) and v_scale [B, Hkv, D] float32 = v_amax / 448, whose last dim D (a multiple of 8,
// at most d_pad) is the head dim of the output. Returns out [B, Hq, Nq, D] of out_dtype, whose
// memory is [B, Nq, Hq, D] when out_nhd (so an NHD caller gets NHD memory without a copy), and the
// natural-log LSE [B, Hq, Nq] float32 (plus corr when given) or an empty tensor without return_lse.

// The 8-bit operands are read by TMA: a 16-byte aligned base and strides (bytes = elements here)
// that are multiples of 16.
void check_tma_operand(const at::Tensor& x, const char* name, at::ScalarType dtype, const char* what) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == dtype && x.dim() == 4, name, " must be a 4-d ", what,
              " CUDA tensor, got ", x.scalar_type(), " ", x.sizes(), " on ", x.device());
  TORCH_CHECK(x.stride(3) == 1, name, " must have a contiguous last dimension, got strides ", x.strides());
  bool strides_ok = reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
  for (int i = 0; i < 3; ++i) strides_ok = strides_ok && x.stride(i) > 0 && x.stride(i) % 16 == 0;
  TORCH_CHECK(strides_ok, name,
              " must have a 16-byte aligned base and positive strides that are multiples of 16 (TMA), got strides ",
              x.strides());
}

void check_f32(const at::Tensor& x, const char* name, at::IntArrayRef sizes, const at::Tensor& like) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device() == like.device() && x.sizes() == sizes, name,
              " must be a float32 tensor of shape ", sizes, " on ", like.device(), ", got ", x.scalar_type(), " ",
              x.sizes(), " on ", x.device());
}

// Allocates out [B, Hq, Nq, D] of out_dtype (memory [B, Nq, Hq, D] when out_nhd) and the LSE ([B, Hq,
// Nq], or [0] without return_lse) on `like`'s device, completes `args` (operands, sizes and causal
// set) with them and launches the sm_90a kernel; the caller holds the device guard.
std::tuple<at::Tensor, at::Tensor> run_attn_sm90(sage::AttnSm90Args& args, const at::Tensor& like,
                                                 at::ScalarType out_dtype, bool out_nhd, bool return_lse) {
  int major = 0, minor = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, like.get_device()),
             "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, like.get_device()),
             "cudaDeviceGetAttribute");
  TORCH_CHECK(major == 9 && minor == 0, "the sm_90a attention kernel needs an sm_90 GPU (H100, H200, H20), got sm_",
              major, minor);
  const int64_t b = args.batch, hq = args.heads_q, nq = args.nq, head_dim = args.head_dim;
  const auto out_options = like.options().dtype(out_dtype);
  at::Tensor out = out_nhd ? at::empty({b, nq, hq, head_dim}, out_options).transpose(1, 2)
                           : at::empty({b, hq, nq, head_dim}, out_options);
  const std::vector<int64_t> lse_shape = return_lse ? std::vector<int64_t>{b, hq, nq} : std::vector<int64_t>{0};
  at::Tensor lse = at::empty(lse_shape, like.options().dtype(at::kFloat));
  args.out = out.data_ptr();
  args.out_strides = strides(out);
  args.out_type = out_dtype == at::kHalf ? sage::HalfType::kFloat16 : sage::HalfType::kBFloat16;
  if (return_lse) {
    args.lse = lse.data_ptr<float>();
    args.lse_strides = strides(lse);
  }
  // The last wave's tiles split along the keys, where that pays (sm90/attn.h, AttnSm90Split).
  int sms = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, like.get_device()),
             "cudaDeviceGetAttribute");
  const sage::AttnSm90Split split =
      sage::attn_sm90_split_plan(args.batch, args.heads_q, args.nq, args.nk, args.d_pad, args.causal, sms);
  at::Tensor partials;
  if (split.parts > 1) {
    partials = at::empty({split.partials_floats}, like.options().dtype(at::kFloat));
    args.split_first = split.first;
    args.split_parts = split.parts;
    args.split_partials = partials.data_ptr<float>();
  }
  check_cuda(sage::launch_qk_int8_sv_f8_attn_sm90(args, c10::cuda::getCurrentCUDAStream().stream()),
             "qk_int8_sv_f8_attn_sm90");
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor> qk_int8_sv_f8_attn_sm90(const at::Tensor& q_int8, const at::Tensor& k_int8,
                                                           const at::Tensor& vt_fp8, const at::Tensor& q_scale,
                                                           const at::Tensor& k_scale, const at::Tensor& v_scale,
                                                           const std::optional<at::Tensor>& corr, bool is_causal,
                                                           bool return_lse, at::ScalarType out_dtype, bool out_nhd) {
  check_tma_operand(q_int8, "q_int8", at::kChar, "int8 [B, Hq, Nq, d_pad]");
  check_tma_operand(k_int8, "k_int8", at::kChar, "int8 [B, Hkv, Nk, d_pad]");
  check_tma_operand(vt_fp8, "vt_fp8", at::kFloat8_e4m3fn, "float8_e4m3fn [B, Hkv, d_pad, n_pad]");
  TORCH_CHECK(q_int8.device() == k_int8.device() && q_int8.device() == vt_fp8.device(),
              "q_int8, k_int8 and vt_fp8 must be on one device");
  const int64_t b = q_int8.size(0), hq = q_int8.size(1), nq = q_int8.size(2), d_pad = q_int8.size(3);
  const int64_t hkv = k_int8.size(1), nk = k_int8.size(2), n_pad = vt_fp8.size(3);
  TORCH_CHECK(d_pad == 64 || d_pad == 128, "q_int8: d_pad (its last dim) must be 64 or 128, got ", d_pad);
  TORCH_CHECK(k_int8.size(0) == b && k_int8.size(3) == d_pad, "k_int8 must be [", b, ", Hkv, Nk, ", d_pad,
              "], got ", k_int8.sizes());
  TORCH_CHECK(vt_fp8.size(0) == b && vt_fp8.size(1) == hkv && vt_fp8.size(2) == d_pad, "vt_fp8 must be [", b,
              ", ", hkv, ", ", d_pad, ", n_pad], got ", vt_fp8.sizes());
  TORCH_CHECK(n_pad >= nk && n_pad % sage::kSm90KeyPermuteGroup == 0,
              "vt_fp8: n_pad (its last dim) must be at least Nk = ", nk, " and a multiple of ",
              sage::kSm90KeyPermuteGroup, ", got ", n_pad);
  TORCH_CHECK(hkv >= 1 && hq % hkv == 0, "the query heads (", hq, ") must be a multiple of the KV heads (", hkv, ")");
  TORCH_CHECK(nk >= 1, "k_int8 must hold at least one key (Nk = 0)");
  TORCH_CHECK(nq < (int64_t{1} << 31) && n_pad < (int64_t{1} << 31), "sequence lengths must be below 2^31");
  const int64_t key_blocks = (nk + sage::kSm90KeyBlock - 1) / sage::kSm90KeyBlock;
  check_f32(q_scale, "q_scale", {b, hq, nq}, q_int8);
  check_f32(k_scale, "k_scale (one scale per 128 keys)", {b, hkv, key_blocks}, q_int8);
  TORCH_CHECK(v_scale.scalar_type() == at::kFloat && v_scale.device() == q_int8.device() && v_scale.dim() == 3 &&
                  v_scale.size(0) == b && v_scale.size(1) == hkv && v_scale.stride(2) == 1,
              "v_scale must be a float32 tensor [", b, ", ", hkv, ", D] on ", q_int8.device(),
              " with a contiguous last dimension, got ", v_scale.scalar_type(), " ", v_scale.sizes(), " on ",
              v_scale.device());
  const int64_t head_dim = v_scale.size(2);
  TORCH_CHECK(head_dim % 8 == 0 && head_dim >= 8 && head_dim <= d_pad, "v_scale: the head dim D = ", head_dim,
              " (its last dim) must be a multiple of 8 and at most d_pad ", d_pad);
  if (corr.has_value()) check_f32(*corr, "corr", {b, hq, nq}, q_int8);
  TORCH_CHECK(out_dtype == at::kHalf || out_dtype == at::kBFloat16, "out_dtype must be float16 or bfloat16, got ",
              out_dtype);

  const c10::cuda::CUDAGuard guard(q_int8.device());
  sage::AttnSm90Args args{};
  args.q = q_int8.data_ptr<int8_t>();
  args.q_strides = strides(q_int8);
  args.k = k_int8.data_ptr<int8_t>();
  args.k_strides = strides(k_int8);
  args.vt = static_cast<const uint8_t*>(vt_fp8.data_ptr());
  args.vt_strides = strides(vt_fp8);
  args.n_pad = static_cast<int>(n_pad);
  args.q_scale = q_scale.data_ptr<float>();
  args.q_scale_strides = strides(q_scale);
  args.k_scale = k_scale.data_ptr<float>();
  args.k_scale_strides = strides(k_scale);
  args.v_scale = v_scale.data_ptr<float>();
  args.v_scale_strides = strides(v_scale);
  if (corr.has_value() && return_lse) {
    args.corr = corr->data_ptr<float>();
    args.corr_strides = strides(*corr);
  }
  set_sizes(args, b, hq, hkv, nq, nk, head_dim, d_pad);
  args.causal = is_causal;
  const at::Tensor tile_counter = at::zeros({1 + sage::kSm90SplitCounters}, q_int8.options().dtype(at::kInt));
  args.tile_counter = tile_counter.data_ptr<int>();
  return run_attn_sm90(args, q_int8, out_dtype, out_nhd, return_lse);
}

// The whole sm_90a call in one op: quant_qkv_sm90 (with_corr = return_lse and smooth_k) with its
// outputs in one scratch buffer, then qk_int8_sv_f8_attn_sm90 on
// them, out of q's dtype. The same kernels on the same data as the two ops, so the same bits, with
// one allocation for the intermediates instead of nine and none of them handed to Python. Returns
// (out, lse) as qk_int8_sv_f8_attn_sm90.
std::tuple<at::Tensor, at::Tensor> attn_sm90(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             bool is_causal, double sm_scale, double scale_mul, int64_t d_pad,
                                             bool smooth_k, bool return_lse, bool out_nhd) {
  const bool with_corr = return_lse && smooth_k;
  sage::QuantQkvArgs qa = qkv_inputs(q, k, v, smooth_k, sm_scale, scale_mul, d_pad, with_corr);
  const c10::cuda::CUDAGuard guard(q.device());
  // The intermediates in one byte buffer, each part 256-byte aligned (TMA needs 16).
  const QkvLayout layout(qa, with_corr);
  std::array<int64_t, kQkvParts> offset;
  int64_t total = 0;
  for (int i = 0; i < kQkvParts; ++i) {
    offset[i] = total;
    total += (layout.bytes(i) + 255) / 256 * 256;
  }
  const at::Tensor scratch = at::empty({total}, q.options().dtype(at::kByte));
  std::array<void*, kQkvParts> p;
  for (int i = 0; i < kQkvParts; ++i) p[i] = scratch.data_ptr<uint8_t>() + offset[i];
  set_outputs(qa, p, with_corr);
  launch_quant_qkv(qa, "attn_sm90 (quantization)");

  // The attention on the contiguous intermediates (strides in elements: bytes for the 8-bit ones).
  sage::AttnSm90Args args{};
  args.q = qa.q_int8;
  args.q_strides = layout.strides(kQInt8);
  args.k = qa.k_int8;
  args.k_strides = layout.strides(kKInt8);
  args.vt = qa.vt;
  args.vt_strides = layout.strides(kVt);
  args.n_pad = qa.n_pad;
  args.q_scale = qa.q_scale;
  args.q_scale_strides = layout.strides(kQScale);
  args.k_scale = qa.k_scale;
  args.k_scale_strides = layout.strides(kKScale);
  args.v_scale = qa.v_scale;
  args.v_scale_strides = layout.strides(kVScale);
  if (with_corr) {
    args.corr = qa.corr;
    args.corr_strides = layout.strides(kCorr);
  }
  set_sizes(args, qa.batch, qa.heads_q, qa.heads_kv, qa.nq, qa.nk, qa.head_dim, d_pad);
  args.causal = is_causal;
  // The tile counter and the split tiles' counters: ints of the quantization's workspace that its launch
  // has zeroed (quant.h).
  args.tile_counter = reinterpret_cast<int*>(
      qa.workspace + sage::quant_qkv_spare_int_offset(qa.batch, qa.heads_kv, qa.nk, static_cast<int>(d_pad)));
  return run_attn_sm90(args, q, q.scalar_type(), out_nhd, return_lse);
}
#endif

}  // namespace

#ifdef SAGEATTN_FAMILY_FUSED
TORCH_LIBRARY_FRAGMENT(sageattention, m) {
  m.def(
      "quant_q_per_token(Tensor q, Tensor? k_mean, float sm_scale, float scale_mul, int d_pad, int kv_group, "
      "bool with_corr) -> (Tensor, Tensor, Tensor)");
  m.def("quant_k_per_block(Tensor k, Tensor? k_mean, int block, int d_pad, bool residual=False) -> Tensor[]");
  m.def("quant_v_fp8(Tensor v, Tensor v_amax, int d_pad, int n_pad, bool permute_keys=False) -> Tensor");
  m.def(
      "quant_qkv_sm90(Tensor q, Tensor k, Tensor v, bool smooth_k, float sm_scale, float scale_mul, int d_pad, "
      "bool with_corr) -> (Tensor q_int8, Tensor q_scale, Tensor corr, Tensor k_int8, Tensor k_scale, Tensor vt, "
      "Tensor v_scale, Tensor k_mean)");
}

TORCH_LIBRARY_IMPL(sageattention, CUDA, m) {
  m.impl("quant_q_per_token", &quant_q_per_token);
  m.impl("quant_k_per_block", &quant_k_per_block);
  m.impl("quant_v_fp8", &quant_v_fp8);
  m.impl("quant_qkv_sm90", &quant_qkv_sm90);
}
#endif

#ifdef SAGEATTN_FAMILY_SM80
TORCH_LIBRARY_FRAGMENT(sageattention, m) {
  m.def(
      "qk_int8_sv_f16_attn(Tensor q_int8, Tensor k_int8, Tensor v, Tensor q_scale, Tensor k_scale, Tensor? corr, "
      "bool is_causal, bool return_lse, ScalarType out_dtype, bool out_nhd, str pv_accum, "
      "Tensor? k_residual=None) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(sageattention, CUDA, m) { m.impl("qk_int8_sv_f16_attn", &qk_int8_sv_f16_attn); }
#endif

#ifdef SAGEATTN_FAMILY_SM89
TORCH_LIBRARY_FRAGMENT(sageattention, m) {
  m.def(
      "qk_int8_sv_f8_attn_sm89(Tensor q_int8, Tensor k_int8, Tensor vt_fp8, Tensor q_scale, Tensor k_scale, "
      "Tensor v_scale, Tensor? corr, bool is_causal, bool return_lse, ScalarType out_dtype, bool out_nhd, "
      "str pv_accum) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(sageattention, CUDA, m) { m.impl("qk_int8_sv_f8_attn_sm89", &qk_int8_sv_f8_attn_sm89); }
#endif

#ifdef SAGEATTN_FAMILY_SM90
namespace {
// The split of the last wave's tiles that the sm_90a attention takes for these sizes on `sms` SMs
// (sm90/attn.h): [first, parts, rows], tiles from `first` on run in `parts` parts (1: none), a tile
// holds `rows` query rows.
std::vector<int64_t> sm90_split_plan(int64_t batch, int64_t heads_q, int64_t nq, int64_t nk, int64_t d_pad,
                                     bool causal, int64_t sms) {
  TORCH_CHECK(batch >= 0 && heads_q >= 0 && nq >= 0 && nk >= 0 && sms >= 0,
              "sm90_split_plan: batch, heads_q, nq, nk and sms must be non-negative");
  TORCH_CHECK(d_pad == 64 || d_pad == 128, "sm90_split_plan: d_pad must be 64 or 128, got ", d_pad);
  const auto narrow = [](int64_t x) { return static_cast<int>(std::min<int64_t>(x, (int64_t{1} << 31) - 1)); };
  const sage::AttnSm90Split split = sage::attn_sm90_split_plan(narrow(batch), narrow(heads_q), narrow(nq), narrow(nk),
                                                               static_cast<int>(d_pad), causal, narrow(sms));
  return {split.first, split.parts, split.rows};
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(sageattention, m) {
  m.def("sm90_split_plan(int batch, int heads_q, int nq, int nk, int d_pad, bool causal, int sms) -> int[]",
        &sm90_split_plan);
  m.def(
      "qk_int8_sv_f8_attn_sm90(Tensor q_int8, Tensor k_int8, Tensor vt_fp8, Tensor q_scale, Tensor k_scale, "
      "Tensor v_scale, Tensor? corr, bool is_causal, bool return_lse, ScalarType out_dtype, bool out_nhd) "
      "-> (Tensor, Tensor)");
  m.def(
      "attn_sm90(Tensor q, Tensor k, Tensor v, bool is_causal, float sm_scale, float scale_mul, int d_pad, "
      "bool smooth_k, bool return_lse, bool out_nhd) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(sageattention, CUDA, m) {
  m.impl("qk_int8_sv_f8_attn_sm90", &qk_int8_sv_f8_attn_sm90);
  m.impl("attn_sm90", &attn_sm90);
}
#endif
