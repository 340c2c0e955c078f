// The one translation unit that talks to the framework, through a plain C ABI: no torch header, no
// libtorch symbol, so one compiled module serves every PyTorch (sageattention/_native.py loads it with
// ctypes; sageattention/cuda_ops.py defines the torch ops around it and allocates their outputs).
//
// It is compiled into every extension module; the SAGEATTN_FAMILY_* macro set by setup.py (from
// build-matrix.yaml) says which kernels the module holds, and TORCH_EXTENSION_NAME names the module.
//
// Every op has the same C signature (SAGE_OP, include/sage_cabi.h): the tensors as descriptors of
// kDescWords int64 words each (_native.py packs them), then the op's int and float arguments in its
// schema's order, the stream, and a small int64 return array. It returns 0, or 1 with sage_last_error()
// saying what was wrong (the argument named, what would be valid): the checks of the launchers' inputs
// live here, next to the launches. Outputs are allocated by the caller in the shapes cuda_ops.py gives
// and checked here.

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>

#include "sage_cabi.h"  // the descriptors, errors, op signature and exports both packages' modules share
#include "sage_types.h"

#if defined(SAGEATTN_FAMILY_FUSED) || defined(SAGEATTN_FAMILY_SM90)
#include "fused/quant.h"  // the sm90 module holds quant_qkv.cu too (attn_sm90, build-matrix.yaml)
#endif
#ifdef SAGEATTN_FAMILY_SM80
#include "sm80/attn.h"
#endif
#ifdef SAGEATTN_FAMILY_SM89
#include "sm89/attn.h"
#endif
#ifdef SAGEATTN_FAMILY_SM90
#include "sm90/attn.h"
#endif

SAGE_PYTHON_MODULE(TORCH_EXTENSION_NAME)

namespace {

[[maybe_unused]] int device_attribute(cudaDeviceAttr attr, int device) {
  int value = 0;
  check_cuda(cudaDeviceGetAttribute(&value, attr, device), "cudaDeviceGetAttribute");
  return value;
}

// A GPU's compute capability and SM count, asked of the driver once per device (three queries a call
// otherwise, on a path whose host time short sequences feel).
struct DeviceFacts {
  int major, minor, sms;
};
[[maybe_unused]] DeviceFacts device_facts(int device) {
  constexpr int kCached = 64;
  static std::array<std::atomic<int64_t>, kCached> cache{};  // (major << 40) | (minor << 32) | sms; 0: unknown
  if (device >= 0 && device < kCached) {
    const int64_t packed = cache[device].load(std::memory_order_relaxed);
    if (packed != 0) {
      return {static_cast<int>(packed >> 40), static_cast<int>((packed >> 32) & 0xff),
              static_cast<int>(packed & 0xffffffff)};
    }
  }
  const DeviceFacts facts{device_attribute(cudaDevAttrComputeCapabilityMajor, device),
                          device_attribute(cudaDevAttrComputeCapabilityMinor, device),
                          device_attribute(cudaDevAttrMultiProcessorCount, device)};
  if (device >= 0 && device < kCached) {
    cache[device].store((int64_t{facts.major} << 40) | (int64_t{facts.minor} << 32) | facts.sms,
                        std::memory_order_relaxed);
  }
  return facts;
}

[[maybe_unused]] void check_float(const View& x, const char* name, const View& like, int64_t heads) {
  SAGE_CHECK(x.defined() && x.dtype == kF32 && x.contiguous() && x.cuda && x.device == like.device, name,
             " must be a contiguous float32 tensor on ", DeviceOf{like});
  SAGE_CHECK(x.dim() == 3 && x.size(0) == like.size(0) && x.size(1) == heads && x.size(2) == like.size(3), name,
             " must be [B, H, D] = [", like.size(0), ", ", heads, ", ", like.size(3), "], got ", SizesOf{x});
}

// An output the caller allocated (cuda_ops.py): of this dtype and shape, contiguous unless `any_strides`
// (the attention outputs, laid out HND or NHD), on `like`'s device.
[[maybe_unused]] void check_output(const View& x, const char* name, int64_t dtype, std::initializer_list<int64_t> shape,
                                   const View& like, bool any_strides = false) {
  SAGE_CHECK(x.defined() && x.dtype == dtype && x.has_sizes(shape) && x.cuda && x.device == like.device &&
                 (any_strides || x.contiguous()),
             "output ", name, " must be a contiguous ", dtype_name(dtype), " tensor of the op's shape on ",
             DeviceOf{like}, ", got ", DtypeOf{x}, " ", SizesOf{x}, " strides ", StridesOf{x});
}

// The attention outputs: out [B, Hq, Nq, D] (HND or NHD memory) and, when given, lse [B, Hq, Nq].
[[maybe_unused]] void check_attn_outputs(const View& out, const View& lse, int64_t b, int64_t hq, int64_t nq, int64_t head_dim,
                        const View& like) {
  SAGE_CHECK(out.defined() && is_half(out) && out.has_sizes({b, hq, nq, head_dim}) && out.stride(3) == 1 &&
                 out.cuda && out.device == like.device,
             "output out must be a float16 or bfloat16 tensor [", b, ", ", hq, ", ", nq, ", ", head_dim,
             "] with a unit last stride on ", DeviceOf{like}, ", got ", DtypeOf{out}, " ", SizesOf{out});
  if (lse.defined()) check_output(lse, "lse", kF32, {b, hq, nq}, like);
}

[[maybe_unused]] sage::HalfType half_type(const View& x) {
  return x.dtype == kF16 ? sage::HalfType::kFloat16 : sage::HalfType::kBFloat16;
}

[[maybe_unused]] sage::Strides3 strides(const View& x) {
  if (x.dim() < 3) return {0, 0, 0};
  return {x.stride(0), x.stride(1), x.stride(2)};
}

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
  SAGE_CHECK((d_pad == 32 || d_pad == 64 || d_pad == 128) && head_dim <= d_pad,
             "d_pad must be 32, 64 or 128 and at least the head dim ", head_dim, ", got ", d_pad);
}

constexpr int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

#if defined(SAGEATTN_FAMILY_FUSED) || defined(SAGEATTN_FAMILY_SM90)
// The inputs of quant_qkv_sm90 (and of attn_sm90, which quantizes the same way), checked: the argument
// struct with the inputs, sizes and options set and every output pointer null.
sage::QuantQkvArgs qkv_inputs(const View& q, const View& k, const View& v, bool smooth_k, double sm_scale,
                              double scale_mul, int64_t d_pad, bool with_corr) {
  check_input(q, "q");
  check_input(k, "k");
  check_input(v, "v");
  SAGE_CHECK(k.dtype == q.dtype && v.dtype == q.dtype, "q, k and v must share one dtype, got ", DtypeOf{q}, ", ",
             DtypeOf{k}, " and ", DtypeOf{v});
  SAGE_CHECK(k.device == q.device && v.device == q.device, "q, k and v must be on one device, got ", DeviceOf{q},
             ", ", DeviceOf{k}, " and ", DeviceOf{v});
  const int64_t b = q.size(0), hq = q.size(1), nq = q.size(2), head_dim = q.size(3);
  const int64_t hkv = k.size(1), nk = k.size(2);
  const bool kv_same = k.size(0) == v.size(0) && k.size(1) == v.size(1) && k.size(2) == v.size(2) &&
                       k.size(3) == v.size(3);
  SAGE_CHECK(kv_same && k.size(0) == b && k.size(3) == head_dim, "k ", SizesOf{k}, " and v ", SizesOf{v},
             " must be [B, Hkv, Nk, D] = [", b, ", Hkv, Nk, ", head_dim, "]");
  SAGE_CHECK(hkv >= 1 && hq % hkv == 0, "the query heads (", hq, ") must be a multiple of the KV heads (", hkv, ")");
  SAGE_CHECK(d_pad == 64 || d_pad == 128, "d_pad must be 64 or 128, got ", d_pad);
  SAGE_CHECK(head_dim % 8 == 0 && head_dim >= 8 && head_dim <= d_pad, "the head dim D = ", head_dim,
             " must be a multiple of 8 and at most d_pad ", d_pad);
  SAGE_CHECK(nk >= 1, "k and v must hold at least one key");
  SAGE_CHECK(nq < (int64_t{1} << 31) - 1024 && nk < (int64_t{1} << 31) - 1024,
             "sequence lengths must be below 2^31 - 1024");
  SAGE_CHECK(b <= 65535 && hkv <= 65535, "B and Hkv must be at most 65535, got ", b, " and ", hkv);
  SAGE_CHECK(!with_corr || smooth_k, "with_corr needs smooth_k (the correction is q . k_mean)");
  sage::QuantQkvArgs args{};
  args.q = q.data;
  args.k = k.data;
  args.v = v.data;
  args.type = half_type(q);
  args.q_strides = strides(q);
  args.k_strides = strides(k);
  args.v_strides = strides(v);
  set_sizes(args, b, hq, hkv, nq, nk, head_dim, d_pad);
  args.n_pad = static_cast<int>(round_up(nk, sage::kQkvKeyGroup));
  args.smooth_k = smooth_k;
  args.sm_scale = static_cast<float>(sm_scale);
  args.scale_mul = static_cast<float>(scale_mul);
  return args;
}

// quant_qkv_sm90's nine parts, in its output order (the workspace last, not returned by the op):
// the shape and element type of each, from the checked arguments; empty where the options leave one out
// (corr without with_corr, k_mean without smooth-K). quant_qkv_sm90's caller allocates them one by one,
// attn_sm90 places them in its one workspace.
enum QkvPart { kQInt8, kQScale, kCorr, kKInt8, kKScale, kVt, kVScale, kKMean, kWorkspace, kQkvParts };
struct QkvLayout {
  std::array<std::array<int64_t, 4>, kQkvParts> shape;
  std::array<int, kQkvParts> rank;
  std::array<int64_t, kQkvParts> elem_bytes;
  QkvLayout(const sage::QuantQkvArgs& a, bool with_corr) {
    const int64_t b = a.batch, hq = a.heads_q, hkv = a.heads_kv, nq = a.nq, nk = a.nk, d = a.head_dim;
    const int64_t d_pad = a.d_pad, key_blocks = (nk + sage::kQkvKeyBlock - 1) / sage::kQkvKeyBlock;
    set(kQInt8, {b, hq, nq, d_pad}, 1);
    set(kQScale, {b, hq, nq}, 4);
    set(kCorr, {with_corr ? b : 0, hq, nq}, 4);
    set(kKInt8, {b, hkv, nk, d_pad}, 1);
    set(kKScale, {b, hkv, key_blocks}, 4);
    set(kVt, {b, hkv, d_pad, a.n_pad}, 1);
    set(kVScale, {b, hkv, d}, 4);
    if (a.smooth_k) {
      set(kKMean, {b, hkv, d}, 4);
    } else {
      set(kKMean, {0}, 4);
    }
    set(kWorkspace, {sage::quant_qkv_workspace_floats(a.batch, a.heads_kv, a.nk, a.d_pad)}, 4);
  }
  void set(int part, std::initializer_list<int64_t> dims, int64_t bytes) {
    rank[part] = static_cast<int>(dims.size());
    shape[part] = {0, 0, 0, 0};
    std::copy(dims.begin(), dims.end(), shape[part].begin());
    elem_bytes[part] = bytes;
  }
  int64_t bytes(int part) const {
    int64_t n = elem_bytes[part];
    for (int i = 0; i < rank[part]; ++i) n *= shape[part][i];
    return n;
  }
  // (b, h, n) strides in elements of a contiguous part (the last dimension's extent past n, if any).
  sage::Strides3 strides(int part) const {
    const auto& e = shape[part];
    const int64_t inner = rank[part] == 4 ? e[3] : 1;
    return {e[1] * e[2] * inner, e[2] * inner, inner};
  }
  // Byte offsets of the parts in one buffer, each 256-byte aligned (TMA needs 16), and the total.
  std::array<int64_t, kQkvParts + 1> offsets() const {
    std::array<int64_t, kQkvParts + 1> at{};
    for (int i = 0; i < kQkvParts; ++i) at[i + 1] = at[i] + round_up(bytes(i), 256);
    return at;
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

// The fused quantization on `stream`, with a clear_nonce of its own (quant.h).
void launch_quant_qkv(sage::QuantQkvArgs& a, cudaStream_t stream, const char* what) {
  a.clear_nonce = sage::quant_qkv_clear_nonce(stream);
  check_cuda(sage::launch_quant_qkv_sm90(a, stream), what);
}
#endif

#if defined(SAGEATTN_FAMILY_SM80) || defined(SAGEATTN_FAMILY_SM89)
// The mma.sync kernels (csrc/sm80, csrc/sm89; sage_attn_mma.cuh) read what the fused quantization ops
// produce: q_int8 [B, Hq, Nq, d_pad] with q_scale [B, Hq, Nq] (quant_q_per_token), k_int8
// [B, Hkv, Nk, d_pad] with k_scale [B, Hkv, ceil(Nk / 64)] (quant_k_per_block with block = 64). They
// write out [B, Hq, Nq, D] of out's dtype (any strides with a unit last one: HND or NHD memory) and
// the natural-log LSE [B, Hq, Nq] float32 (plus corr when given) when an lse is passed.
void check_int8_qk(const View& x, const char* name, int64_t align_elems) {
  SAGE_CHECK(x.defined() && x.cuda && x.dtype == kI8 && x.dim() == 4, name,
             " must be a 4-d int8 CUDA tensor [B, H, N, d_pad], got ", DtypeOf{x}, " ", SizesOf{x}, " on ",
             DeviceOf{x});
  SAGE_CHECK(x.stride(3) == 1, name, " must have a contiguous last dimension, got strides ", StridesOf{x});
  SAGE_CHECK(x.size(3) == 64 || x.size(3) == 128, name, ": d_pad (its last dim) must be 64 or 128, got ",
             x.size(3));
  // Q is read as 4-byte words, K with 16-byte cp.async: rows and the base must be aligned to that.
  SAGE_CHECK(reinterpret_cast<uintptr_t>(x.data) % align_elems == 0 && x.stride(0) % align_elems == 0 &&
                 x.stride(1) % align_elems == 0 && x.stride(2) % align_elems == 0,
             name, " must be aligned to ", align_elems, " bytes (base and strides), got strides ", StridesOf{x});
}

void check_scale(const View& x, const char* name, std::initializer_list<int64_t> sizes, const View& like) {
  SAGE_CHECK(x.defined() && x.dtype == kF32 && x.cuda && x.device == like.device && x.has_sizes(sizes), name,
             " must be a float32 tensor of the shape of the op's other inputs on ", DeviceOf{like}, ", got ",
             DtypeOf{x}, " ", SizesOf{x}, " on ", DeviceOf{x});
}


// Checks Q, K, their scales and the outputs, and fills the arguments both kernels share.
// head_dim: the output's head dim D, taken from head_dim_from (named in errors).
sage::MmaAttnArgs mma_common_args(const View& q_int8, const View& k_int8, const View& q_scale, const View& k_scale,
                                  const View& corr, bool is_causal, bool return_lse, int64_t head_dim,
                                  const char* head_dim_from, const View& out, const View& lse) {
  check_int8_qk(q_int8, "q_int8", 4);
  check_int8_qk(k_int8, "k_int8", 16);
  SAGE_CHECK(q_int8.device == k_int8.device, "q_int8 and k_int8 must be on one device, got ", DeviceOf{q_int8},
             " and ", DeviceOf{k_int8});
  const int64_t b = q_int8.size(0), hq = q_int8.size(1), nq = q_int8.size(2), d_pad = q_int8.size(3);
  const int64_t hkv = k_int8.size(1), nk = k_int8.size(2);
  SAGE_CHECK(k_int8.size(0) == b && k_int8.size(3) == d_pad, "k_int8 must be [", b, ", Hkv, Nk, ", d_pad,
             "], got ", SizesOf{k_int8});
  SAGE_CHECK(hkv >= 1 && hq % hkv == 0, "the query heads (", hq, ") must be a multiple of the KV heads (", hkv, ")");
  SAGE_CHECK(head_dim % 8 == 0 && head_dim >= 8 && head_dim <= d_pad, "the head dim D = ", head_dim, " (",
             head_dim_from, ") must be a multiple of 8 and at most d_pad ", d_pad);
  SAGE_CHECK(nq < (int64_t{1} << 31) && nk < (int64_t{1} << 31), "sequence lengths must be below 2^31");
  const int64_t key_blocks = (nk + sage::kMmaKeyBlock - 1) / sage::kMmaKeyBlock;
  check_scale(q_scale, "q_scale", {b, hq, nq}, q_int8);
  check_scale(k_scale, "k_scale (one scale per 64 keys)", {b, hkv, key_blocks}, q_int8);
  if (corr.defined()) check_scale(corr, "corr", {b, hq, nq}, q_int8);
  SAGE_CHECK(lse.defined() == return_lse, "lse must be passed exactly when return_lse is set");
  check_attn_outputs(out, lse, b, hq, nq, head_dim, q_int8);

  sage::MmaAttnArgs args{};
  args.q = q_int8.ptr<int8_t>();
  args.q_strides = strides(q_int8);
  args.k = k_int8.ptr<int8_t>();
  args.k_strides = strides(k_int8);
  args.q_scale = q_scale.ptr<float>();
  args.q_scale_strides = strides(q_scale);
  args.k_scale = k_scale.ptr<float>();
  args.k_scale_strides = strides(k_scale);
  if (corr.defined() && return_lse) {
    args.corr = corr.ptr<float>();
    args.corr_strides = strides(corr);
  }
  args.out = out.data;
  args.out_strides = strides(out);
  args.out_type = half_type(out);
  if (return_lse) {
    args.lse = lse.ptr<float>();
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

#ifdef SAGEATTN_FAMILY_SM90
// The 8-bit operands are read by TMA: a 16-byte aligned base and strides (bytes = elements here)
// that are multiples of 16.
void check_tma_operand(const View& x, const char* name, int64_t dtype, const char* what) {
  SAGE_CHECK(x.defined() && x.cuda && x.dtype == dtype && x.dim() == 4, name, " must be a 4-d ", what,
             " CUDA tensor, got ", DtypeOf{x}, " ", SizesOf{x}, " on ", DeviceOf{x});
  SAGE_CHECK(x.stride(3) == 1, name, " must have a contiguous last dimension, got strides ", StridesOf{x});
  bool strides_ok = reinterpret_cast<uintptr_t>(x.data) % 16 == 0;
  for (int i = 0; i < 3; ++i) strides_ok = strides_ok && x.stride(i) > 0 && x.stride(i) % 16 == 0;
  SAGE_CHECK(strides_ok, name,
             " must have a 16-byte aligned base and positive strides that are multiples of 16 (TMA), got strides ",
             StridesOf{x});
}

void check_sm90_gpu(int device) {
  const DeviceFacts gpu = device_facts(device);
  const int major = gpu.major, minor = gpu.minor;
  SAGE_CHECK(major == 9 && minor == 0, "the sm_90a attention kernel needs an sm_90 GPU (H100, H200, H20), got sm_",
             major, minor);
}

sage::AttnSm90Split split_plan_on(const sage::AttnSm90Args& a, int device) {
  const int sms = device_facts(device).sms;
  return sage::attn_sm90_split_plan(a.batch, a.heads_q, a.nq, a.nk, a.d_pad, a.causal, sms);
}

// Bytes of the split tiles' partials a launch of these sizes needs on `device`, 256-byte aligned.
int64_t split_bytes(int64_t b, int64_t hq, int64_t nq, int64_t nk, int64_t d_pad, bool causal, int device) {
  sage::AttnSm90Args a{};
  a.batch = static_cast<int>(b);
  a.heads_q = static_cast<int>(hq);
  a.nq = static_cast<int>(nq);
  a.nk = static_cast<int>(nk);
  a.d_pad = static_cast<int>(d_pad);
  a.causal = causal;
  const sage::AttnSm90Split split = split_plan_on(a, device);
  return split.parts > 1 ? round_up(split.partials_floats * 4, 256) : 0;
}

// Completes `args` (operands, sizes and causal set) with the outputs and the split's partials (at
// `partials`, split_bytes of them) and launches the sm_90a kernel on `stream`.
void run_attn_sm90(sage::AttnSm90Args& args, const View& out, const View& lse, void* partials, int device,
                   cudaStream_t stream) {
  args.out = out.data;
  args.out_strides = strides(out);
  args.out_type = half_type(out);
  if (lse.defined()) {
    args.lse = lse.ptr<float>();
    args.lse_strides = strides(lse);
  }
  // The last wave's tiles split along the keys, where that pays (sm90/attn.h, AttnSm90Split); with key
  // lengths, whose batch entries have keys of their own, none is.
  const sage::AttnSm90Split split = split_plan_on(args, device);
  if (split.parts > 1 && args.kv_len == nullptr) {
    args.split_first = split.first;
    args.split_parts = split.parts;
    args.split_partials = static_cast<float*>(partials);
  }
  check_cuda(sage::launch_qk_int8_sv_f8_attn_sm90(args, stream), "qk_int8_sv_f8_attn_sm90");
}

// Bytes of qk_int8_sv_f8_attn_sm90's workspace: its tile counters (zeroed by the op), then the
// split's partials.
constexpr int64_t kCounterBytes = round_up(4 * (1 + sage::kSm90SplitCounters), 256);
#endif
}  // namespace


#ifdef SAGEATTN_FAMILY_FUSED
// tensors: q, k_mean?, q_int8, q_scale, corr ([0, H, N] without with_corr); ints: d_pad, kv_group,
// with_corr; floats: sm_scale, scale_mul.
SAGE_OP(quant_q_per_token) {
  return guarded([&] {
    SAGE_OP_BODY;
    const View q = a.tensor(0), k_mean = a.tensor(1), q_int8 = a.tensor(2), q_scale = a.tensor(3),
               corr = a.tensor(4);
    const int64_t d_pad = a.integer(0), kv_group = a.integer(1);
    const bool with_corr = a.flag(2);
    check_input(q, "q");
    check_d_pad(d_pad, q.size(3));
    SAGE_CHECK(kv_group >= 1 && q.size(1) % kv_group == 0, "kv_group must divide the head count");
    SAGE_CHECK(!with_corr || k_mean.defined(), "with_corr needs k_mean");
    if (with_corr) check_float(k_mean, "k_mean", q, q.size(1) / kv_group);
    const int64_t b = q.size(0), h = q.size(1), n = q.size(2);
    check_output(q_int8, "q_int8", kI8, {b, h, n, d_pad}, q);
    check_output(q_scale, "q_scale", kF32, {b, h, n}, q);
    check_output(corr, "corr", kF32, {with_corr ? b : 0, h, n}, q);
    const DeviceGuard guard(q.device);
    check_cuda(sage::launch_quant_q_per_token(q.data, half_type(q), strides(q), static_cast<int>(b),
                                              static_cast<int>(h), static_cast<int>(n), static_cast<int>(q.size(3)),
                                              static_cast<int>(d_pad), static_cast<float>(a.real(1)),
                                              q_int8.ptr<int8_t>(), q_scale.ptr<float>(),
                                              with_corr ? k_mean.ptr<float>() : nullptr, static_cast<int>(kv_group),
                                              static_cast<float>(a.real(0)), with_corr ? corr.ptr<float>() : nullptr,
                                              stream),
               "quant_q_per_token");
  });
}

// tensors: k, k_mean?, k_int8, k_scale, k_residual (present exactly with residual); ints: block, d_pad,
// residual. With residual, k_residual gets the second INT8 digit of two-level K (laid out like k_int8)
// and k_scale is amax * K_RESIDUAL_SCALE (csrc/fused/quant.h).
SAGE_OP(quant_k_per_block) {
  return guarded([&] {
    SAGE_OP_BODY;
    const View k = a.tensor(0), k_mean = a.tensor(1), k_int8 = a.tensor(2), k_scale = a.tensor(3),
               k_residual = a.tensor(4);
    const int64_t block = a.integer(0), d_pad = a.integer(1);
    const bool residual = a.flag(2);
    check_input(k, "k");
    check_d_pad(d_pad, k.size(3));
    SAGE_CHECK(block >= 1, "block must be positive, got ", block);
    if (k_mean.defined()) check_float(k_mean, "k_mean", k, k.size(1));
    const int64_t b = k.size(0), h = k.size(1), n = k.size(2);
    check_output(k_int8, "k_int8", kI8, {b, h, n, d_pad}, k);
    check_output(k_scale, "k_scale", kF32, {b, h, (n + block - 1) / block}, k);
    SAGE_CHECK(k_residual.defined() == residual, "k_residual must be passed exactly when residual is set");
    if (residual) check_output(k_residual, "k_residual", kI8, {b, h, n, d_pad}, k);
    const DeviceGuard guard(k.device);
    check_cuda(sage::launch_quant_k_per_block(k.data, half_type(k), strides(k), static_cast<int>(b),
                                              static_cast<int>(h), static_cast<int>(n), static_cast<int>(k.size(3)),
                                              static_cast<int>(d_pad), static_cast<int>(block),
                                              k_mean.defined() ? k_mean.ptr<float>() : nullptr,
                                              k_int8.ptr<int8_t>(), residual ? k_residual.ptr<int8_t>() : nullptr,
                                              k_scale.ptr<float>(), stream),
               "quant_k_per_block");
  });
}

// tensors: v, v_amax, vt; ints: d_pad, n_pad, permute_keys. permute_keys: the key order the FP8 P·V
// kernels (sm_90a, sm89) multiply with (csrc/fused/quant.h); needs n_pad to be a multiple of 16.
SAGE_OP(quant_v_fp8) {
  return guarded([&] {
    SAGE_OP_BODY;
    const View v = a.tensor(0), v_amax = a.tensor(1), vt = a.tensor(2);
    const int64_t d_pad = a.integer(0), n_pad = a.integer(1);
    const bool permute_keys = a.flag(2);
    check_input(v, "v");
    check_d_pad(d_pad, v.size(3));
    check_float(v_amax, "v_amax", v, v.size(1));
    SAGE_CHECK(n_pad >= v.size(2), "n_pad must be at least the sequence length");
    SAGE_CHECK(!permute_keys || n_pad % 16 == 0, "permute_keys needs n_pad to be a multiple of 16, got ", n_pad);
    const int64_t b = v.size(0), h = v.size(1), n = v.size(2);
    check_output(vt, "vt", kF8E4M3, {b, h, d_pad, n_pad}, v);
    const DeviceGuard guard(v.device);
    check_cuda(sage::launch_quant_v_fp8_transposed(v.data, half_type(v), strides(v), static_cast<int>(b),
                                                   static_cast<int>(h), static_cast<int>(n),
                                                   static_cast<int>(v.size(3)), static_cast<int>(d_pad),
                                                   static_cast<int>(n_pad), v_amax.ptr<float>(), vt.ptr<uint8_t>(),
                                                   permute_keys, stream),
               "quant_v_fp8");
  });
}

// Floats of quant_qkv_sm90's workspace for these sizes (the caller allocates it).
SAGE_EXPORT int64_t sage_quant_qkv_workspace_floats(int64_t batch, int64_t heads_kv, int64_t nk, int64_t d_pad) {
  return sage::quant_qkv_workspace_floats(static_cast<int>(batch), static_cast<int>(heads_kv), static_cast<int>(nk),
                                          static_cast<int>(d_pad));
}

// Q, K and V of one sm_90a attention call (sageattention.cuda_sm90) in one kernel launch (two for long
// sequences) after the clearing of its counters (csrc/fused/quant_qkv.cu): what quant_q_per_token,
// quant_k_per_block(block = 128), quant_v_fp8(..., permute_keys=True) and the K mean / V amax around
// them give, bit for bit given the returned k_mean.
// tensors: q, k, v, then the outputs q_int8, q_scale, corr, k_int8, k_scale, vt, v_scale, k_mean (shapes:
// QkvLayout) and the workspace (sage_quant_qkv_workspace_floats float32); ints: smooth_k, d_pad,
// with_corr; floats: sm_scale, scale_mul.
SAGE_OP(quant_qkv_sm90) {
  return guarded([&] {
    SAGE_OP_BODY;
    const View q = a.tensor(0), k = a.tensor(1), v = a.tensor(2);
    const bool smooth_k = a.flag(0), with_corr = a.flag(2);
    const int64_t d_pad = a.integer(1);
    sage::QuantQkvArgs args = qkv_inputs(q, k, v, smooth_k, a.real(0), a.real(1), d_pad, with_corr);
    const QkvLayout layout(args, with_corr);
    static constexpr const char* kNames[kQkvParts] = {"q_int8", "q_scale", "corr", "k_int8", "k_scale",
                                                      "vt", "v_scale", "k_mean", "workspace"};
    static constexpr int64_t kTypes[kQkvParts] = {kI8, kF32, kF32, kI8, kF32, kF8E4M3, kF32, kF32, kF32};
    std::array<void*, kQkvParts> p;
    for (int part = 0; part < kQkvParts; ++part) {
      const View x = a.tensor(3 + part);
      const auto& s = layout.shape[part];
      const bool fits = x.defined() && x.dtype == kTypes[part] && x.ndim == layout.rank[part] && x.contiguous() &&
                        x.cuda && x.device == q.device &&
                        std::equal(s.begin(), s.begin() + layout.rank[part], x.sizes);
      SAGE_CHECK(fits, "output ", kNames[part], " must be a contiguous ", dtype_name(kTypes[part]),
                 " tensor of the op's shape on ", DeviceOf{q}, ", got ", DtypeOf{x}, " ", SizesOf{x});
      p[part] = x.data;
    }
    set_outputs(args, p, with_corr);
    const DeviceGuard guard(q.device);
    launch_quant_qkv(args, stream, "quant_qkv_sm90");
  });
}
#endif

#ifdef SAGEATTN_FAMILY_SM80
// INT8 Q·Kᵀ, FP16 P·V attention (csrc/sm80). tensors: q_int8, k_int8, v (FP16 [B, Hkv, Nk, D], any
// strides with a unit last one), q_scale, k_scale, corr?, k_residual? (K's second INT8 digit, k_scale then
// being the two-level scale), out, lse (present exactly with return_lse); ints: is_causal, return_lse,
// pv_accum (sage::PvAccum: kFp32 or kFp16ThenFp32).
SAGE_OP(qk_int8_sv_f16_attn) {
  return guarded([&] {
    SAGE_OP_BODY;
    const View q_int8 = a.tensor(0), k_int8 = a.tensor(1), v = a.tensor(2), q_scale = a.tensor(3),
               k_scale = a.tensor(4), corr = a.tensor(5), k_residual = a.tensor(6), out = a.tensor(7),
               lse = a.tensor(8);
    const bool is_causal = a.flag(0), return_lse = a.flag(1);
    const auto accum = static_cast<sage::PvAccum>(a.integer(2));
    SAGE_CHECK(accum == sage::PvAccum::kFp32 || accum == sage::PvAccum::kFp16ThenFp32,
               "pv_accum must be 'fp32' or 'fp16+fp32'");
    SAGE_CHECK(v.defined() && v.cuda && v.dtype == kF16 && v.dim() == 4 && v.stride(3) == 1,
               "v must be a 4-d float16 CUDA tensor [B, Hkv, Nk, D] with a contiguous last dimension, got ",
               DtypeOf{v}, " ", SizesOf{v}, " strides ", StridesOf{v}, " on ", DeviceOf{v});
    SAGE_CHECK(reinterpret_cast<uintptr_t>(v.data) % 16 == 0 && v.stride(0) % 8 == 0 && v.stride(1) % 8 == 0 &&
                   v.stride(2) % 8 == 0,
               "v must be aligned to 16 bytes (base and strides), got strides ", StridesOf{v});
    sage::AttnSm80Args args = mma_common_args(q_int8, k_int8, q_scale, k_scale, corr, is_causal, return_lse,
                                              v.size(3), "v's last dim", out, lse);
    SAGE_CHECK(v.device == q_int8.device, "q_int8, k_int8 and v must be on one device, got ", DeviceOf{q_int8},
               " and ", DeviceOf{v});
    SAGE_CHECK(v.size(0) == k_int8.size(0) && v.size(1) == k_int8.size(1) && v.size(2) == k_int8.size(2),
               "v must be [", k_int8.size(0), ", ", k_int8.size(1), ", ", k_int8.size(2), ", D] like k_int8, got ",
               SizesOf{v});
    if (k_residual.defined()) {
      check_int8_qk(k_residual, "k_residual", 16);
      SAGE_CHECK(k_residual.has_sizes({k_int8.size(0), k_int8.size(1), k_int8.size(2), k_int8.size(3)}) &&
                     k_residual.device == k_int8.device,
                 "k_residual must have k_int8's shape ", SizesOf{k_int8}, " and device ", DeviceOf{k_int8}, ", got ",
                 SizesOf{k_residual}, " on ", DeviceOf{k_residual});
      args.k_residual = k_residual.ptr<int8_t>();
      args.k_residual_strides = strides(k_residual);
    }
    args.v = v.data;
    args.v_strides = strides(v);
    args.accum = accum;
    const DeviceGuard guard(q_int8.device);
    check_cuda(sage::launch_qk_int8_sv_f16_attn_sm80(args, stream), "qk_int8_sv_f16_attn");
  });
}
#endif

#ifdef SAGEATTN_FAMILY_SM89
// Whether the "fp32+fp16" kernels were built (the FP16-accumulating FP8 MMA needs CUDA >= 12.8), so
// Python can choose without trying.
SAGE_EXPORT int sage_sm89_fp16_accum_built() { return sage::sm89_fp16_accum_built() ? 1 : 0; }

// INT8 Q·Kᵀ, FP8 P·V attention (csrc/sm89), sm_89 and newer. tensors: q_int8, k_int8, vt_fp8 (Vᵀ
// [B, Hkv, d_pad, n_pad] from quant_v_fp8(..., permute_keys=True)), q_scale, k_scale, v_scale ([B, Hkv,
// D] float32, v_amax / 448; its last dim D is the output's head dim), corr?, out, lse?; ints: is_causal,
// return_lse, pv_accum (sage::PvAccum). kFp16ThenFp32 accumulates each 64-key block in FP16 and needs V
// quantized with v_amax * 256 (kSm89Fp16AccumVHeadroom in csrc/sm89/attn.h).
SAGE_OP(qk_int8_sv_f8_attn_sm89) {
  return guarded([&] {
    SAGE_OP_BODY;
    const View q_int8 = a.tensor(0), k_int8 = a.tensor(1), vt_fp8 = a.tensor(2), q_scale = a.tensor(3),
               k_scale = a.tensor(4), v_scale = a.tensor(5), corr = a.tensor(6), out = a.tensor(7),
               lse = a.tensor(8);
    const bool is_causal = a.flag(0), return_lse = a.flag(1);
    const auto accum = static_cast<sage::PvAccum>(a.integer(2));
    SAGE_CHECK(accum == sage::PvAccum::kFp32 || accum == sage::PvAccum::kFp32ThenFp32 ||
                   accum == sage::PvAccum::kFp16ThenFp32,
               "pv_accum must be 'fp32', 'fp32+fp32' or 'fp32+fp16'");
    SAGE_CHECK(accum != sage::PvAccum::kFp16ThenFp32 || sage::sm89_fp16_accum_built(),
               "pv_accum 'fp32+fp16' needs the FP16-accumulating FP8 MMA (PTX ISA 8.7), which this build of "
               "sageattention._qattn_sm89 lacks: it was compiled with a CUDA older than 12.8. Use 'fp32+fp32'.");
    SAGE_CHECK(vt_fp8.defined() && vt_fp8.cuda && vt_fp8.dtype == kF8E4M3 && vt_fp8.dim() == 4,
               "vt_fp8 must be a 4-d float8_e4m3fn CUDA tensor [B, Hkv, d_pad, n_pad], got ", DtypeOf{vt_fp8}, " ",
               SizesOf{vt_fp8}, " on ", DeviceOf{vt_fp8});
    // Read with 16-byte cp.async: a 16-byte aligned base and strides (bytes = elements here).
    SAGE_CHECK(vt_fp8.stride(3) == 1 && reinterpret_cast<uintptr_t>(vt_fp8.data) % 16 == 0 &&
                   vt_fp8.stride(0) % 16 == 0 && vt_fp8.stride(1) % 16 == 0 && vt_fp8.stride(2) % 16 == 0,
               "vt_fp8 must have a contiguous last dimension, a 16-byte aligned base and strides that are multiples "
               "of 16, got strides ",
               StridesOf{vt_fp8});
    SAGE_CHECK(v_scale.defined() && v_scale.dtype == kF32 && v_scale.dim() == 3,
               "v_scale must be a 3-d float32 tensor [B, Hkv, D], got ", DtypeOf{v_scale}, " ", SizesOf{v_scale});
    const DeviceFacts gpu = device_facts(q_int8.device);
    const int major = gpu.major, minor = gpu.minor;
    SAGE_CHECK(major * 10 + minor >= 89, "qk_int8_sv_f8_attn_sm89 needs an sm_89 or newer GPU (FP8 MMA), got sm_",
               major, minor);
    sage::AttnSm89Args args = mma_common_args(q_int8, k_int8, q_scale, k_scale, corr, is_causal, return_lse,
                                              v_scale.size(2), "v_scale's last dim", out, lse);
    const int64_t b = k_int8.size(0), hkv = k_int8.size(1), nk = k_int8.size(2), d_pad = k_int8.size(3);
    const int64_t n_pad = vt_fp8.size(3);
    SAGE_CHECK(vt_fp8.device == q_int8.device && v_scale.device == q_int8.device && v_scale.cuda,
               "q_int8, k_int8, vt_fp8 and v_scale must be on one device, got ", DeviceOf{q_int8}, ", ",
               DeviceOf{vt_fp8}, " and ", DeviceOf{v_scale});
    SAGE_CHECK(vt_fp8.size(0) == b && vt_fp8.size(1) == hkv && vt_fp8.size(2) == d_pad,
               "vt_fp8 must be [B, Hkv, d_pad, n_pad] = [", b, ", ", hkv, ", ", d_pad,
               ", n_pad] to match k_int8, got ", SizesOf{vt_fp8});
    SAGE_CHECK(n_pad >= nk && n_pad % sage::kSm89KeyPermuteGroup == 0 && n_pad < (int64_t{1} << 31),
               "vt_fp8: n_pad (its last dim) must be at least Nk = ", nk, " and a multiple of ",
               sage::kSm89KeyPermuteGroup, ", got ", n_pad);
    SAGE_CHECK(v_scale.size(0) == b && v_scale.size(1) == hkv, "v_scale must be [", b, ", ", hkv,
               ", D] to match k_int8, got ", SizesOf{v_scale});
    args.v = vt_fp8.data;
    args.v_strides = strides(vt_fp8);
    args.n_pad = static_cast<int>(n_pad);
    args.v_scale = v_scale.ptr<float>();
    args.v_scale_strides = strides(v_scale);
    args.accum = accum;
    const DeviceGuard guard(q_int8.device);
    check_cuda(sage::launch_qk_int8_sv_f8_attn_sm89(args, stream), "qk_int8_sv_f8_attn_sm89");
  });
}
#endif

#ifdef SAGEATTN_FAMILY_SM90
// The split of the last wave's tiles that the sm_90a attention takes for these sizes on `sms` SMs
// (sm90/attn.h). ints: batch, heads_q, nq, nk, d_pad, causal, sms; ret: [first, parts, rows], tiles
// from `first` on run in `parts` parts (1: none), a tile holds `rows` query rows.
SAGE_OP(sm90_split_plan) {
  return guarded([&] {
    SAGE_OP_BODY;
    const int64_t batch = a.integer(0), heads_q = a.integer(1), nq = a.integer(2), nk = a.integer(3),
                  d_pad = a.integer(4), sms = a.integer(6);
    SAGE_CHECK(batch >= 0 && heads_q >= 0 && nq >= 0 && nk >= 0 && sms >= 0,
               "sm90_split_plan: batch, heads_q, nq, nk and sms must be non-negative");
    SAGE_CHECK(d_pad == 64 || d_pad == 128, "sm90_split_plan: d_pad must be 64 or 128, got ", d_pad);
    const auto narrow = [](int64_t x) { return static_cast<int>(std::min<int64_t>(x, (int64_t{1} << 31) - 1)); };
    const sage::AttnSm90Split split = sage::attn_sm90_split_plan(
        narrow(batch), narrow(heads_q), narrow(nq), narrow(nk), static_cast<int>(d_pad), a.flag(5), narrow(sms));
    ret[0] = split.first;
    ret[1] = split.parts;
    ret[2] = split.rows;
  });
}

// Bytes of qk_int8_sv_f8_attn_sm90's workspace for these sizes on `device` (-1 with sage_last_error set
// when the device cannot be asked).
SAGE_EXPORT int64_t sage_qk_int8_sv_f8_attn_sm90_workspace_bytes(int64_t b, int64_t hq, int64_t nq, int64_t nk,
                                                                 int64_t d_pad, int64_t causal, int64_t device) {
  int64_t bytes = -1;
  guarded([&] { bytes = kCounterBytes + split_bytes(b, hq, nq, nk, d_pad, causal != 0, static_cast<int>(device)); });
  return bytes;
}

// INT8 Q·Kᵀ, FP8 P·V attention for sm_90a (csrc/sm90) on what the fused quantization ops produce:
// q_int8 [B, Hq, Nq, d_pad] with q_scale [B, Hq, Nq] (quant_q_per_token), k_int8 [B, Hkv, Nk, d_pad]
// with k_scale [B, Hkv, ceil(Nk / 128)] (quant_k_per_block with block = 128), vt_fp8 [B, Hkv, d_pad,
// n_pad] float8_e4m3fn (quant_v_fp8 with permute_keys=True; n_pad >= Nk, a multiple of 16) and v_scale
// [B, Hkv, D] float32 = v_amax / 448, whose last dim D is the output's head dim. tensors: those, corr?,
// out, lse?, workspace (..._workspace_bytes uint8); ints: is_causal, return_lse.
SAGE_OP(qk_int8_sv_f8_attn_sm90) {
  return guarded([&] {
    SAGE_OP_BODY;
    const View q_int8 = a.tensor(0), k_int8 = a.tensor(1), vt_fp8 = a.tensor(2), q_scale = a.tensor(3),
               k_scale = a.tensor(4), v_scale = a.tensor(5), corr = a.tensor(6), out = a.tensor(7),
               lse = a.tensor(8), workspace = a.tensor(9);
    const bool is_causal = a.flag(0), return_lse = a.flag(1);
    check_tma_operand(q_int8, "q_int8", kI8, "int8 [B, Hq, Nq, d_pad]");
    check_tma_operand(k_int8, "k_int8", kI8, "int8 [B, Hkv, Nk, d_pad]");
    check_tma_operand(vt_fp8, "vt_fp8", kF8E4M3, "float8_e4m3fn [B, Hkv, d_pad, n_pad]");
    SAGE_CHECK(q_int8.device == k_int8.device && q_int8.device == vt_fp8.device,
               "q_int8, k_int8 and vt_fp8 must be on one device");
    const int64_t b = q_int8.size(0), hq = q_int8.size(1), nq = q_int8.size(2), d_pad = q_int8.size(3);
    const int64_t hkv = k_int8.size(1), nk = k_int8.size(2), n_pad = vt_fp8.size(3);
    SAGE_CHECK(d_pad == 64 || d_pad == 128, "q_int8: d_pad (its last dim) must be 64 or 128, got ", d_pad);
    SAGE_CHECK(k_int8.size(0) == b && k_int8.size(3) == d_pad, "k_int8 must be [", b, ", Hkv, Nk, ", d_pad,
               "], got ", SizesOf{k_int8});
    SAGE_CHECK(vt_fp8.size(0) == b && vt_fp8.size(1) == hkv && vt_fp8.size(2) == d_pad, "vt_fp8 must be [", b,
               ", ", hkv, ", ", d_pad, ", n_pad], got ", SizesOf{vt_fp8});
    SAGE_CHECK(n_pad >= nk && n_pad % sage::kSm90KeyPermuteGroup == 0,
               "vt_fp8: n_pad (its last dim) must be at least Nk = ", nk, " and a multiple of ",
               sage::kSm90KeyPermuteGroup, ", got ", n_pad);
    SAGE_CHECK(hkv >= 1 && hq % hkv == 0, "the query heads (", hq, ") must be a multiple of the KV heads (", hkv,
               ")");
    SAGE_CHECK(nk >= 1, "k_int8 must hold at least one key (Nk = 0)");
    SAGE_CHECK(nq < (int64_t{1} << 31) && n_pad < (int64_t{1} << 31), "sequence lengths must be below 2^31");
    const int64_t key_blocks = (nk + sage::kSm90KeyBlock - 1) / sage::kSm90KeyBlock;
    check_output(q_scale, "q_scale", kF32, {b, hq, nq}, q_int8, true);
    check_output(k_scale, "k_scale (one scale per 128 keys)", kF32, {b, hkv, key_blocks}, q_int8, true);
    SAGE_CHECK(v_scale.defined() && v_scale.dtype == kF32 && v_scale.cuda && v_scale.device == q_int8.device &&
                   v_scale.dim() == 3 && v_scale.size(0) == b && v_scale.size(1) == hkv && v_scale.stride(2) == 1,
               "v_scale must be a float32 tensor [", b, ", ", hkv, ", D] on ", DeviceOf{q_int8},
               " with a contiguous last dimension, got ", DtypeOf{v_scale}, " ", SizesOf{v_scale}, " on ",
               DeviceOf{v_scale});
    const int64_t head_dim = v_scale.size(2);
    SAGE_CHECK(head_dim % 8 == 0 && head_dim >= 8 && head_dim <= d_pad, "v_scale: the head dim D = ", head_dim,
               " (its last dim) must be a multiple of 8 and at most d_pad ", d_pad);
    if (corr.defined()) check_output(corr, "corr", kF32, {b, hq, nq}, q_int8, true);
    SAGE_CHECK(lse.defined() == return_lse, "lse must be passed exactly when return_lse is set");
    check_attn_outputs(out, lse, b, hq, nq, head_dim, q_int8);
    check_sm90_gpu(q_int8.device);
    const int64_t split = split_bytes(b, hq, nq, nk, d_pad, is_causal, q_int8.device);
    SAGE_CHECK(workspace.defined() && workspace.dtype == kU8 && workspace.cuda &&
                   workspace.device == q_int8.device && workspace.numel() >= kCounterBytes + split,
               "workspace must be a uint8 tensor of at least ", kCounterBytes + split, " bytes on ",
               DeviceOf{q_int8});

    sage::AttnSm90Args args{};
    args.q = q_int8.ptr<int8_t>();
    args.q_strides = strides(q_int8);
    args.k = k_int8.ptr<int8_t>();
    args.k_strides = strides(k_int8);
    args.vt = vt_fp8.ptr<uint8_t>();
    args.vt_strides = strides(vt_fp8);
    args.n_pad = static_cast<int>(n_pad);
    args.q_scale = q_scale.ptr<float>();
    args.q_scale_strides = strides(q_scale);
    args.k_scale = k_scale.ptr<float>();
    args.k_scale_strides = strides(k_scale);
    args.v_scale = v_scale.ptr<float>();
    args.v_scale_strides = strides(v_scale);
    if (corr.defined() && return_lse) {
      args.corr = corr.ptr<float>();
      args.corr_strides = strides(corr);
    }
    set_sizes(args, b, hq, hkv, nq, nk, head_dim, d_pad);
    args.causal = is_causal;
    const DeviceGuard guard(q_int8.device);
    args.tile_counter = workspace.ptr<int>();
    check_cuda(cudaMemsetAsync(workspace.data, 0, 4 * (1 + sage::kSm90SplitCounters), stream), "cudaMemsetAsync");
    run_attn_sm90(args, out, lse, workspace.ptr<uint8_t>() + kCounterBytes, q_int8.device, stream);
  });
}

// Bytes of attn_sm90's workspace for these sizes on `device`: the quantized Q, K, V with their scales
// and the quantization's workspace (QkvLayout), then the split's partials (-1 with sage_last_error set
// when the sizes are not valid or the device cannot be asked).
SAGE_EXPORT int64_t sage_attn_sm90_workspace_bytes(int64_t b, int64_t hq, int64_t hkv, int64_t nq, int64_t nk,
                                                   int64_t head_dim, int64_t d_pad, int64_t smooth_k,
                                                   int64_t with_corr, int64_t causal, int64_t device) {
  int64_t bytes = -1;
  guarded([&] {
    SAGE_CHECK(b >= 1 && hkv >= 1 && nk >= 1 && nq >= 0 && b <= 65535 && hkv <= 65535 &&
                   nq < (int64_t{1} << 31) - 1024 && nk < (int64_t{1} << 31) - 1024 && (d_pad == 64 || d_pad == 128),
               "attn_sm90: sizes out of range");
    sage::QuantQkvArgs qa{};
    set_sizes(qa, b, hq, hkv, nq, nk, head_dim, d_pad);
    qa.n_pad = static_cast<int>(round_up(nk, sage::kQkvKeyGroup));
    qa.smooth_k = smooth_k != 0;
    const QkvLayout layout(qa, with_corr != 0);
    bytes = layout.offsets()[kQkvParts] + split_bytes(b, hq, nq, nk, d_pad, causal != 0, static_cast<int>(device));
  });
  return bytes;
}

// The whole sm_90a call in one op: quant_qkv_sm90 (with_corr = return_lse and smooth_k) with its
// outputs in the workspace, then qk_int8_sv_f8_attn_sm90 on them, out of q's dtype. The same kernels on
// the same data as the two ops, so the same bits, with one allocation for the intermediates and none of
// them handed to Python. tensors: q, k, v, out [B, Hq, Nq, D] of q's dtype (HND or NHD memory), lse?,
// workspace (sage_attn_sm90_workspace_bytes uint8), kv_len? (int32 [B]: batch entry b attends to its
// first kv_len[b] keys; not with is_causal), key_order? (int32 [B, Nk], with kv_len: key t of batch entry
// b is input row key_order[b, t] of k and v, which must then be 16-byte aligned; without it, key t is row
// t); ints: is_causal, d_pad, smooth_k, return_lse; floats: sm_scale, scale_mul.
SAGE_OP(attn_sm90) {
  return guarded([&] {
    SAGE_OP_BODY;
    const View q = a.tensor(0), k = a.tensor(1), v = a.tensor(2), out = a.tensor(3), lse = a.tensor(4),
               workspace = a.tensor(5), kv_len = a.tensor(6), key_order = a.tensor(7);
    const bool is_causal = a.flag(0), smooth_k = a.flag(2), return_lse = a.flag(3);
    const int64_t d_pad = a.integer(1);
    const bool with_corr = return_lse && smooth_k;
    sage::QuantQkvArgs qa = qkv_inputs(q, k, v, smooth_k, a.real(0), a.real(1), d_pad, with_corr);
    if (key_order.defined()) {
      SAGE_CHECK(kv_len.defined(), "key_order comes with kv_len (the kept keys first, then how many)");
      SAGE_CHECK(key_order.dtype == kI32 && key_order.cuda && key_order.device == q.device &&
                     key_order.has_sizes({qa.batch, qa.nk}) && key_order.contiguous(),
                 "key_order must be a contiguous int32 tensor [", qa.batch, ", ", qa.nk, "] on ", DeviceOf{q},
                 ", got ", DtypeOf{key_order}, " ", SizesOf{key_order}, " on ", DeviceOf{key_order});
      qa.key_order = key_order.ptr<int>();
    }
    SAGE_CHECK(lse.defined() == return_lse, "lse must be passed exactly when return_lse is set");
    check_attn_outputs(out, lse, qa.batch, qa.heads_q, qa.nq, qa.head_dim, q);
    SAGE_CHECK(out.dtype == q.dtype, "output out must have q's dtype ", DtypeOf{q}, ", got ", DtypeOf{out});
    check_sm90_gpu(q.device);
    const QkvLayout layout(qa, with_corr);
    const auto offset = layout.offsets();
    const int64_t split = split_bytes(qa.batch, qa.heads_q, qa.nq, qa.nk, d_pad, is_causal, q.device);
    SAGE_CHECK(workspace.defined() && workspace.dtype == kU8 && workspace.cuda && workspace.device == q.device &&
                   workspace.numel() >= offset[kQkvParts] + split,
               "workspace must be a uint8 tensor of at least ", offset[kQkvParts] + split, " bytes on ",
               DeviceOf{q});
    uint8_t* base = workspace.ptr<uint8_t>();
    std::array<void*, kQkvParts> p;
    for (int i = 0; i < kQkvParts; ++i) p[i] = base + offset[i];
    set_outputs(qa, p, with_corr);
    const DeviceGuard guard(q.device);
    launch_quant_qkv(qa, stream, "attn_sm90 (quantization)");

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
    if (kv_len.defined()) {
      SAGE_CHECK(kv_len.dtype == kI32 && kv_len.cuda && kv_len.device == q.device && kv_len.has_sizes({qa.batch}) &&
                     kv_len.contiguous(),
                 "kv_len must be a contiguous int32 tensor [", qa.batch, "] on ", DeviceOf{q}, ", got ",
                 DtypeOf{kv_len}, " ", SizesOf{kv_len}, " on ", DeviceOf{kv_len});
      SAGE_CHECK(!is_causal, "kv_len (key lengths) cannot be combined with is_causal");
      args.kv_len = kv_len.ptr<int>();
    }
    // The tile counter and the split tiles' counters: ints of the quantization's workspace that its launch
    // has zeroed (quant.h).
    args.tile_counter = reinterpret_cast<int*>(
        qa.workspace + sage::quant_qkv_spare_int_offset(qa.batch, qa.heads_kv, qa.nk, static_cast<int>(d_pad)));
    run_attn_sm90(args, out, lse, base + offset[kQkvParts], q.device, stream);
  });
}
#endif
