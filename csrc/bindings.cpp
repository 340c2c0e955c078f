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
// and checked here. The checks are helpers that every op of a kind shares (a tensor of a shape, an
// 8-bit operand as its kernel reads it, the quantized Q and K of every attention op, Vᵀ of the FP8
// ones), so that one rule has one wording wherever it applies.

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

// The compute capability of `device` as one number: 89 for sm_89, 120 for sm_120.
[[maybe_unused]] int compute_capability(int device) {
  const DeviceFacts gpu = device_facts(device);
  return gpu.major * 10 + gpu.minor;
}

constexpr int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }
constexpr int64_t blocks_of(int64_t n, int64_t block) { return (n + block - 1) / block; }

// Sequence lengths stay below these, so that token indices fit in int: the attention kernels', and the
// fused quantization's (kMaxTokens in csrc/fused/quant_qkv.cu).
constexpr int64_t kSeqLimit = int64_t{1} << 31;
constexpr int64_t kQkvSeqLimit = kSeqLimit - 1024;

[[maybe_unused]] int64_t element_bytes(int64_t dtype) {
  switch (dtype) {
    case kF16:
    case kBF16: return 2;
    case kF32:
    case kI32: return 4;
    default: return 1;
  }
}

// The sizes a tensor argument must have (at most four), for its check and its message.
struct Shape {
  std::array<int64_t, 4> dims{};
  int rank = 0;
  Shape() = default;
  Shape(std::initializer_list<int64_t> sizes) : rank(static_cast<int>(sizes.size())) {
    std::copy(sizes.begin(), sizes.end(), dims.begin());
  }
  bool of(const View& x) const { return x.ndim == rank && std::equal(dims.begin(), dims.begin() + rank, x.sizes); }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
};
[[maybe_unused]] std::ostream& operator<<(std::ostream& os, const Shape& s) {
  os << "[";
  for (int i = 0; i < s.rank; ++i) os << (i ? ", " : "") << s.dims[i];
  return os << "]";
}

// A tensor argument of `dtype` and `shape` on `like`'s device, contiguous unless `any_strides`. `role`
// starts the message ("output " for the outputs, which the caller allocated in the shapes cuda_ops.py
// gives), `note` follows the shape in it.
template <typename... Note>
void check_tensor(const char* role, const View& x, const char* name, int64_t dtype, const Shape& shape,
                  const View& like, bool any_strides, const Note&... note) {
  SAGE_CHECK(x.defined() && x.dtype == dtype && shape.of(x) && x.cuda && x.device == like.device &&
                 (any_strides || x.contiguous()),
             role, name, " must be a ", any_strides ? "" : "contiguous ", dtype_name(dtype), " tensor ", shape,
             note..., " on ", DeviceOf{like}, ", got ", DtypeOf{x}, " ", SizesOf{x}, " strides ", StridesOf{x},
             " on ", DeviceOf{x});
}

[[maybe_unused]] void check_output(const View& x, const char* name, int64_t dtype, const Shape& shape,
                                   const View& like) {
  check_tensor("output ", x, name, dtype, shape, like, false);
}

// The attention outputs: out [B, Hq, Nq, D] (HND or NHD memory) and lse [B, Hq, Nq], which is passed
// exactly when return_lse is set.
[[maybe_unused]] void check_attn_outputs(const View& out, const View& lse, bool return_lse, int64_t b, int64_t hq,
                                         int64_t nq, int64_t head_dim, const View& like) {
  SAGE_CHECK(lse.defined() == return_lse, "lse must be passed exactly when return_lse is set");
  SAGE_CHECK(out.defined() && is_half(out) && out.has_sizes({b, hq, nq, head_dim}) && out.stride(3) == 1 &&
                 out.cuda && out.device == like.device,
             "output out must be a float16 or bfloat16 tensor [", b, ", ", hq, ", ", nq, ", ", head_dim,
             "] with a unit last stride on ", DeviceOf{like}, ", got ", DtypeOf{out}, " ", SizesOf{out});
  if (lse.defined()) check_output(lse, "lse", kF32, {b, hq, nq}, like);
}

// How a kernel reads an 8-bit or half operand: the byte alignment its base and (b, h, n) strides need,
// and whether those strides must be positive (a TMA tensor map takes no others).
struct Reads {
  int64_t align;
  bool tma;
};
constexpr Reads kWords{4, false};     // the mma.sync kernels read Q as 4-byte words
constexpr Reads kCpAsync{16, false};  // and K and V with 16-byte cp.async
constexpr Reads kTma{16, true};       // the sm_90a kernel reads its operands by TMA

// A 4-d operand (`dims` names its dimensions) of `dtype` on a GPU, its last dimension contiguous, that
// its kernel can read as `reads` says.
[[maybe_unused]] void check_operand(const View& x, const char* name, int64_t dtype, const char* dims, Reads reads) {
  SAGE_CHECK(x.defined() && x.cuda && x.dtype == dtype && x.dim() == 4, name, " must be a 4-d ", dtype_name(dtype),
             " CUDA tensor ", dims, ", got ", DtypeOf{x}, " ", SizesOf{x}, " on ", DeviceOf{x});
  SAGE_CHECK(x.stride(3) == 1, name, " must have a contiguous last dimension, got strides ", StridesOf{x});
  const int64_t bytes = element_bytes(dtype);
  bool aligned = reinterpret_cast<uintptr_t>(x.data) % reads.align == 0;
  for (int i = 0; i < 3; ++i) {
    aligned = aligned && (x.stride(i) * bytes) % reads.align == 0 && (!reads.tma || x.stride(i) > 0);
  }
  SAGE_CHECK(aligned, name, " must have a ", reads.align, "-byte aligned base and ",
             reads.tma ? "positive strides" : "strides", " that are multiples of ", reads.align, " bytes",
             reads.tma ? " (TMA)" : "", ", got strides ", StridesOf{x});
}

// `launch(args...)` with `device` current (the stream belongs to it); `what` names it in an error.
template <typename Launch, typename... LaunchArgs>
void launch_on(int device, const char* what, Launch launch, const LaunchArgs&... args) {
  const DeviceGuard guard(device);
  check_cuda(launch(args...), what);
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

// d_pad of the standalone quantization ops.
[[maybe_unused]] void check_d_pad(int64_t d_pad, int64_t head_dim) {
  SAGE_CHECK((d_pad == 32 || d_pad == 64 || d_pad == 128) && head_dim <= d_pad,
             "d_pad must be 32, 64 or 128 and at least the head dim ", head_dim, ", got ", d_pad);
}

// d_pad of the attention kernels and the fused quantization (`what` names where it is read).
[[maybe_unused]] void check_attn_d_pad(int64_t d_pad, const char* what) {
  SAGE_CHECK(d_pad == 64 || d_pad == 128, what, " must be 64 or 128, got ", d_pad);
}

[[maybe_unused]] void check_kv_heads(int64_t hq, int64_t hkv) {
  SAGE_CHECK(hkv >= 1 && hq % hkv == 0, "the query heads (", hq, ") must be a multiple of the KV heads (", hkv, ")");
}

// The head dim D (`from` says which dimension gives it): a multiple of 8, at most d_pad.
[[maybe_unused]] void check_head_dim(int64_t head_dim, int64_t d_pad, const char* from) {
  SAGE_CHECK(head_dim % 8 == 0 && head_dim >= 8 && head_dim <= d_pad, "the head dim D = ", head_dim, " (", from,
             ") must be a multiple of 8 and at most d_pad ", d_pad);
}

// The sizes of every attention op's quantized Q and K.
struct QkSizes {
  int64_t b, hq, hkv, nq, nk, d_pad;
};

// The quantized Q and K of an attention op: q_int8 [B, Hq, Nq, d_pad] and k_int8 [B, Hkv, Nk, d_pad] on
// one GPU, read as `q_reads` and `k_reads` say, with their scales q_scale [B, Hq, Nq] and k_scale
// [B, Hkv, ceil(Nk / key_block)] (any strides) and, when given, smooth-K's LSE correction corr [B, Hq, Nq].
[[maybe_unused]] QkSizes check_qk(const View& q_int8, const View& k_int8, const View& q_scale, const View& k_scale,
                                  const View& corr, Reads q_reads, Reads k_reads, int64_t key_block) {
  check_operand(q_int8, "q_int8", kI8, "[B, Hq, Nq, d_pad]", q_reads);
  check_operand(k_int8, "k_int8", kI8, "[B, Hkv, Nk, d_pad]", k_reads);
  SAGE_CHECK(q_int8.device == k_int8.device, "q_int8 and k_int8 must be on one device, got ", DeviceOf{q_int8},
             " and ", DeviceOf{k_int8});
  const QkSizes s{q_int8.size(0), q_int8.size(1), k_int8.size(1), q_int8.size(2), k_int8.size(2), q_int8.size(3)};
  check_attn_d_pad(s.d_pad, "q_int8: d_pad (its last dim)");
  SAGE_CHECK(k_int8.size(0) == s.b && k_int8.size(3) == s.d_pad, "k_int8 must be [", s.b, ", Hkv, Nk, ", s.d_pad,
             "], got ", SizesOf{k_int8});
  check_kv_heads(s.hq, s.hkv);
  SAGE_CHECK(s.nq < kSeqLimit && s.nk < kSeqLimit, "sequence lengths must be below 2^31");
  check_tensor("", q_scale, "q_scale", kF32, {s.b, s.hq, s.nq}, q_int8, true);
  check_tensor("", k_scale, "k_scale", kF32, {s.b, s.hkv, blocks_of(s.nk, key_block)}, q_int8, true,
               " (one scale per ", key_block, " keys)");
  if (corr.defined()) check_tensor("", corr, "corr", kF32, {s.b, s.hq, s.nq}, q_int8, true);
  return s;
}

// Vᵀ of the FP8 P·V kernels: vt_fp8 [B, Hkv, d_pad, n_pad] from quant_v_fp8(..., permute_keys=True), n_pad
// >= Nk a multiple of the key permutation group `key_group`, read as `reads` says; and its channel scales
// v_scale [B, Hkv, D] (v_amax / 448), their channels adjacent where `unit_channel_stride`. D, their last
// dim, is the output's head dim: returned, checked.
[[maybe_unused]] int64_t check_vt(const View& vt_fp8, const View& v_scale, const QkSizes& s, const View& like,
                                  Reads reads, int64_t key_group, bool unit_channel_stride) {
  check_operand(vt_fp8, "vt_fp8", kF8E4M3, "[B, Hkv, d_pad, n_pad]", reads);
  SAGE_CHECK(vt_fp8.device == like.device, "q_int8, k_int8 and vt_fp8 must be on one device, got ", DeviceOf{like},
             " and ", DeviceOf{vt_fp8});
  SAGE_CHECK(vt_fp8.size(0) == s.b && vt_fp8.size(1) == s.hkv && vt_fp8.size(2) == s.d_pad,
             "vt_fp8 must be [B, Hkv, d_pad, n_pad] = [", s.b, ", ", s.hkv, ", ", s.d_pad,
             ", n_pad] to match k_int8, got ", SizesOf{vt_fp8});
  const int64_t n_pad = vt_fp8.size(3);
  SAGE_CHECK(n_pad >= s.nk && n_pad % key_group == 0 && n_pad < kSeqLimit,
             "vt_fp8: n_pad (its last dim) must be at least Nk = ", s.nk, ", a multiple of ", key_group,
             " and below 2^31, got ", n_pad);
  SAGE_CHECK(v_scale.defined() && v_scale.dtype == kF32 && v_scale.cuda && v_scale.device == like.device &&
                 v_scale.dim() == 3 && v_scale.size(0) == s.b && v_scale.size(1) == s.hkv &&
                 (!unit_channel_stride || v_scale.stride(2) == 1),
             "v_scale must be a float32 tensor [", s.b, ", ", s.hkv, ", D] on ", DeviceOf{like},
             unit_channel_stride ? " with a contiguous last dimension" : "", ", got ", DtypeOf{v_scale}, " ",
             SizesOf{v_scale}, " strides ", StridesOf{v_scale}, " on ", DeviceOf{v_scale});
  const int64_t head_dim = v_scale.size(2);
  check_head_dim(head_dim, s.d_pad, "v_scale's last dim");
  return head_dim;
}

// The fields every attention kernel's arguments share (sage::MmaAttnArgs, AttnSm90Args): the quantized Q
// and K with their scales, smooth-K's LSE correction (absent: none) and the outputs.
template <typename Args>
[[maybe_unused]] void set_attn_common(Args& args, const View& q_int8, const View& k_int8, const View& q_scale,
                                      const View& k_scale, const View& corr, const View& out, const View& lse) {
  args.q = q_int8.ptr<int8_t>();
  args.q_strides = strides(q_int8);
  args.k = k_int8.ptr<int8_t>();
  args.k_strides = strides(k_int8);
  args.q_scale = q_scale.ptr<float>();
  args.q_scale_strides = strides(q_scale);
  args.k_scale = k_scale.ptr<float>();
  args.k_scale_strides = strides(k_scale);
  if (corr.defined()) {
    args.corr = corr.ptr<float>();
    args.corr_strides = strides(corr);
  }
  args.out = out.data;
  args.out_strides = strides(out);
  args.out_type = half_type(out);
  if (lse.defined()) {
    args.lse = lse.ptr<float>();
    args.lse_strides = strides(lse);
  }
}

#ifdef SAGEATTN_FAMILY_FUSED
// The input of a standalone quantization op, x [B, H, N, D] (check_input) with the d_pad its rows are
// padded to: the launchers' leading arguments.
struct QuantInput {
  const void* data;
  sage::HalfType type;
  sage::Strides3 strides;
  int batch, heads, n, head_dim, d_pad, device;
};

QuantInput quant_input(const View& x, const char* name, int64_t d_pad) {
  check_input(x, name);
  check_d_pad(d_pad, x.size(3));
  return {x.data,
          half_type(x),
          strides(x),
          static_cast<int>(x.size(0)),
          static_cast<int>(x.size(1)),
          static_cast<int>(x.size(2)),
          static_cast<int>(x.size(3)),
          static_cast<int>(d_pad),
          x.device};
}

// `launch` on x's arguments, then the op's own (`rest`, the stream last), on x's device.
template <typename Launch, typename... Rest>
void launch_quant(const char* what, Launch launch, const QuantInput& x, const Rest&... rest) {
  launch_on(x.device, what, launch, x.data, x.type, x.strides, x.batch, x.heads, x.n, x.head_dim, x.d_pad, rest...);
}
#endif

#if defined(SAGEATTN_FAMILY_FUSED) || defined(SAGEATTN_FAMILY_SM90)
// The sizes quant_qkv_sm90 and attn_sm90 take.
void check_qkv_sizes(int64_t b, int64_t hq, int64_t hkv, int64_t nq, int64_t nk, int64_t head_dim, int64_t d_pad) {
  check_kv_heads(hq, hkv);
  check_attn_d_pad(d_pad, "d_pad");
  check_head_dim(head_dim, d_pad, "q's last dim");
  SAGE_CHECK(nk >= 1, "k and v must hold at least one key");
  SAGE_CHECK(nq < kQkvSeqLimit && nk < kQkvSeqLimit, "sequence lengths must be below 2^31 - 1024");
  SAGE_CHECK(b <= 65535 && hkv <= 65535, "B and Hkv must be at most 65535, got ", b, " and ", hkv);
}

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
  check_qkv_sizes(b, hq, hkv, nq, nk, head_dim, d_pad);
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

// quant_qkv_sm90's nine parts, in its output order (the workspace last, not returned by the op): the
// name, element type and shape of each, from the checked arguments; empty where the options leave one
// out (corr without with_corr, k_mean without smooth-K). quant_qkv_sm90's caller allocates them one by
// one, attn_sm90 places them in its one workspace.
enum QkvPart { kQInt8, kQScale, kCorr, kKInt8, kKScale, kVt, kVScale, kKMean, kWorkspace, kQkvParts };
struct QkvLayout {
  static constexpr const char* kNames[kQkvParts] = {"q_int8", "q_scale", "corr",   "k_int8",   "k_scale",
                                                    "vt",     "v_scale", "k_mean", "workspace"};
  static constexpr int64_t kTypes[kQkvParts] = {kI8, kF32, kF32, kI8, kF32, kF8E4M3, kF32, kF32, kF32};
  std::array<Shape, kQkvParts> shape;
  QkvLayout(const sage::QuantQkvArgs& a, bool with_corr) {
    const int64_t b = a.batch, hq = a.heads_q, hkv = a.heads_kv, nq = a.nq, nk = a.nk, d = a.head_dim;
    const int64_t d_pad = a.d_pad;
    shape[kQInt8] = {b, hq, nq, d_pad};
    shape[kQScale] = {b, hq, nq};
    shape[kCorr] = {with_corr ? b : 0, hq, nq};
    shape[kKInt8] = {b, hkv, nk, d_pad};
    shape[kKScale] = {b, hkv, blocks_of(nk, sage::kQkvKeyBlock)};
    shape[kVt] = {b, hkv, d_pad, a.n_pad};
    shape[kVScale] = {b, hkv, d};
    shape[kKMean] = a.smooth_k ? Shape{b, hkv, d} : Shape{0};
    shape[kWorkspace] = {sage::quant_qkv_workspace_floats(a.batch, a.heads_kv, a.nk, a.d_pad)};
  }
  int64_t bytes(int part) const { return element_bytes(kTypes[part]) * shape[part].numel(); }
  // Byte offsets of the parts in one buffer, each 256-byte aligned (TMA needs 16), and the total.
  std::array<int64_t, kQkvParts + 1> offsets() const {
    std::array<int64_t, kQkvParts + 1> at{};
    for (int i = 0; i < kQkvParts; ++i) at[i + 1] = at[i] + round_up(bytes(i), 256);
    return at;
  }
  // The part at `data` as a contiguous tensor on `like`'s device.
  View view(int part, void* data, const View& like) const {
    View x;
    x.data = data;
    x.dtype = kTypes[part];
    x.cuda = like.cuda;
    x.device = like.device;
    x.ndim = shape[part].rank;
    int64_t stride = 1;
    for (int i = x.ndim - 1; i >= 0; --i) {
      x.sizes[i] = shape[part].dims[i];
      x.strides[i] = stride;
      stride *= x.sizes[i];
    }
    return x;
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
QkSizes check_mma_qk(const View& q_int8, const View& k_int8, const View& q_scale, const View& k_scale,
                     const View& corr) {
  return check_qk(q_int8, k_int8, q_scale, k_scale, corr, kWords, kCpAsync, sage::kMmaKeyBlock);
}

// The arguments both kernels take, for checked operands (v: V, or Vᵀ of the FP8 kernel, whose n_pad
// and v_scale are the caller's); corr only with the LSE.
sage::MmaAttnArgs mma_args(const QkSizes& s, int64_t head_dim, bool is_causal, bool return_lse, sage::PvAccum accum,
                           const View& q_int8, const View& k_int8, const View& v, const View& q_scale,
                           const View& k_scale, const View& corr, const View& out, const View& lse) {
  sage::MmaAttnArgs args{};
  set_attn_common(args, q_int8, k_int8, q_scale, k_scale, return_lse ? corr : View{}, out, lse);
  args.v = v.data;
  args.v_strides = strides(v);
  args.accum = accum;
  args.batch = static_cast<int>(s.b);
  args.heads_q = static_cast<int>(s.hq);
  args.kv_group = static_cast<int>(s.hq / s.hkv);
  args.nq = static_cast<int>(s.nq);
  args.nk = static_cast<int>(s.nk);
  args.head_dim = static_cast<int>(head_dim);
  args.d_pad = static_cast<int>(s.d_pad);
  args.causal = is_causal;
  return args;
}
#endif

#ifdef SAGEATTN_FAMILY_SM90
sage::AttnSm90Split split_plan_on(int64_t b, int64_t hq, int64_t nq, int64_t nk, int64_t d_pad, bool causal,
                                  int device) {
  const int sms = device_facts(device).sms;
  return sage::attn_sm90_split_plan(static_cast<int>(b), static_cast<int>(hq), static_cast<int>(nq),
                                    static_cast<int>(nk), static_cast<int>(d_pad), causal, sms);
}

// Bytes of the split tiles' partials a launch of these sizes needs on `device`, 256-byte aligned.
int64_t split_bytes(int64_t b, int64_t hq, int64_t nq, int64_t nk, int64_t d_pad, bool causal, int device) {
  const sage::AttnSm90Split split = split_plan_on(b, hq, nq, nk, d_pad, causal, device);
  return split.parts > 1 ? round_up(split.partials_floats * 4, 256) : 0;
}

// The GPU of an sm_90a launch, which must be an sm_90 one, and its workspace: `fixed` bytes of the op's
// own, then the split's partials for these sizes. Returns where the partials go.
uint8_t* sm90_workspace(const View& workspace, int64_t fixed, int64_t b, int64_t hq, int64_t nq, int64_t nk,
                        int64_t d_pad, bool causal, const View& like) {
  const int cc = compute_capability(like.device);
  SAGE_CHECK(cc == 90, "the sm_90a attention kernel needs an sm_90 GPU (H100, H200, H20), got sm_", cc);
  const int64_t bytes = fixed + split_bytes(b, hq, nq, nk, d_pad, causal, like.device);
  SAGE_CHECK(workspace.defined() && workspace.dtype == kU8 && workspace.cuda && workspace.device == like.device &&
                 workspace.numel() >= bytes,
             "workspace must be a uint8 tensor of at least ", bytes, " bytes on ", DeviceOf{like});
  return workspace.ptr<uint8_t>() + fixed;
}

// The sm_90a kernel's arguments on checked operands: the op's tensors, or attn_sm90's intermediates.
sage::AttnSm90Args sm90_args(const View& q_int8, const View& k_int8, const View& vt_fp8, const View& q_scale,
                             const View& k_scale, const View& v_scale, const View& corr, const View& out,
                             const View& lse, bool causal) {
  sage::AttnSm90Args args{};
  set_attn_common(args, q_int8, k_int8, q_scale, k_scale, corr, out, lse);
  args.vt = vt_fp8.ptr<uint8_t>();
  args.vt_strides = strides(vt_fp8);
  args.n_pad = static_cast<int>(vt_fp8.size(3));
  args.v_scale = v_scale.ptr<float>();
  args.v_scale_strides = strides(v_scale);
  set_sizes(args, q_int8.size(0), q_int8.size(1), k_int8.size(1), q_int8.size(2), k_int8.size(2), v_scale.size(2),
            q_int8.size(3));
  args.causal = causal;
  return args;
}

// Completes `args` with the split's partials (at `partials`, split_bytes of them) and launches the
// sm_90a kernel on `stream`.
void run_attn_sm90(sage::AttnSm90Args& args, void* partials, int device, cudaStream_t stream) {
  // The last wave's tiles split along the keys, where that pays (sm90/attn.h, AttnSm90Split); with key
  // lengths, whose batch entries have keys of their own, none is.
  const sage::AttnSm90Split split =
      split_plan_on(args.batch, args.heads_q, args.nq, args.nk, args.d_pad, args.causal, device);
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
SAGE_CHECKED_OP(quant_q_per_token) {
  const View q = a.tensor(0), k_mean = a.tensor(1), q_int8 = a.tensor(2), q_scale = a.tensor(3),
             corr = a.tensor(4);
  const int64_t d_pad = a.integer(0), kv_group = a.integer(1);
  const bool with_corr = a.flag(2);
  const QuantInput in = quant_input(q, "q", d_pad);
  const int64_t b = in.batch, h = in.heads, n = in.n;
  SAGE_CHECK(kv_group >= 1 && h % kv_group == 0, "kv_group must divide the head count ", h, ", got ", kv_group);
  SAGE_CHECK(!with_corr || k_mean.defined(), "with_corr needs k_mean");
  if (with_corr) check_tensor("", k_mean, "k_mean", kF32, {b, h / kv_group, q.size(3)}, q, false);
  check_output(q_int8, "q_int8", kI8, {b, h, n, d_pad}, q);
  check_output(q_scale, "q_scale", kF32, {b, h, n}, q);
  check_output(corr, "corr", kF32, {with_corr ? b : 0, h, n}, q);
  launch_quant("quant_q_per_token", sage::launch_quant_q_per_token, in, static_cast<float>(a.real(1)),
               q_int8.ptr<int8_t>(), q_scale.ptr<float>(), with_corr ? k_mean.ptr<float>() : nullptr,
               static_cast<int>(kv_group), static_cast<float>(a.real(0)), with_corr ? corr.ptr<float>() : nullptr,
               stream);
}

// tensors: k, k_mean?, k_int8, k_scale, k_residual (present exactly with residual); ints: block, d_pad,
// residual. With residual, k_residual gets the second INT8 digit of two-level K (laid out like k_int8)
// and k_scale is amax * K_RESIDUAL_SCALE (csrc/fused/quant.h).
SAGE_CHECKED_OP(quant_k_per_block) {
  const View k = a.tensor(0), k_mean = a.tensor(1), k_int8 = a.tensor(2), k_scale = a.tensor(3),
             k_residual = a.tensor(4);
  const int64_t block = a.integer(0), d_pad = a.integer(1);
  const bool residual = a.flag(2);
  const QuantInput in = quant_input(k, "k", d_pad);
  const int64_t b = in.batch, h = in.heads, n = in.n;
  SAGE_CHECK(block >= 1, "block must be positive, got ", block);
  if (k_mean.defined()) check_tensor("", k_mean, "k_mean", kF32, {b, h, k.size(3)}, k, false);
  check_output(k_int8, "k_int8", kI8, {b, h, n, d_pad}, k);
  check_output(k_scale, "k_scale", kF32, {b, h, blocks_of(n, block)}, k);
  SAGE_CHECK(k_residual.defined() == residual, "k_residual must be passed exactly when residual is set");
  if (residual) check_output(k_residual, "k_residual", kI8, {b, h, n, d_pad}, k);
  launch_quant("quant_k_per_block", sage::launch_quant_k_per_block, in, static_cast<int>(block),
               k_mean.defined() ? k_mean.ptr<float>() : nullptr, k_int8.ptr<int8_t>(),
               residual ? k_residual.ptr<int8_t>() : nullptr, k_scale.ptr<float>(), stream);
}

// tensors: v, v_amax, vt; ints: d_pad, n_pad, permute_keys. permute_keys: the key order the FP8 P·V
// kernels (sm_90a, sm89) multiply with (csrc/fused/quant.h); needs n_pad to be a multiple of 16.
SAGE_CHECKED_OP(quant_v_fp8) {
  const View v = a.tensor(0), v_amax = a.tensor(1), vt = a.tensor(2);
  const int64_t d_pad = a.integer(0), n_pad = a.integer(1);
  const bool permute_keys = a.flag(2);
  const QuantInput in = quant_input(v, "v", d_pad);
  const int64_t b = in.batch, h = in.heads, n = in.n;
  check_tensor("", v_amax, "v_amax", kF32, {b, h, v.size(3)}, v, false);
  SAGE_CHECK(n_pad >= n, "n_pad must be at least the sequence length ", n, ", got ", n_pad);
  SAGE_CHECK(!permute_keys || n_pad % 16 == 0, "permute_keys needs n_pad to be a multiple of 16, got ", n_pad);
  check_output(vt, "vt", kF8E4M3, {b, h, d_pad, n_pad}, v);
  launch_quant("quant_v_fp8", sage::launch_quant_v_fp8_transposed, in, static_cast<int>(n_pad),
               v_amax.ptr<float>(), vt.ptr<uint8_t>(), permute_keys, stream);
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
SAGE_CHECKED_OP(quant_qkv_sm90) {
  const View q = a.tensor(0), k = a.tensor(1), v = a.tensor(2);
  const bool smooth_k = a.flag(0), with_corr = a.flag(2);
  const int64_t d_pad = a.integer(1);
  sage::QuantQkvArgs args = qkv_inputs(q, k, v, smooth_k, a.real(0), a.real(1), d_pad, with_corr);
  const QkvLayout layout(args, with_corr);
  std::array<void*, kQkvParts> p;
  for (int part = 0; part < kQkvParts; ++part) {
    const View x = a.tensor(3 + part);
    check_output(x, QkvLayout::kNames[part], QkvLayout::kTypes[part], layout.shape[part], q);
    p[part] = x.data;
  }
  set_outputs(args, p, with_corr);
  const DeviceGuard guard(q.device);
  launch_quant_qkv(args, stream, "quant_qkv_sm90");
}
#endif

#ifdef SAGEATTN_FAMILY_SM80
// INT8 Q·Kᵀ, FP16 P·V attention (csrc/sm80). tensors: q_int8, k_int8, v (FP16 [B, Hkv, Nk, D], any
// strides with a unit last one), q_scale, k_scale, corr?, k_residual? (K's second INT8 digit, k_scale then
// being the two-level scale), out, lse (present exactly with return_lse); ints: is_causal, return_lse,
// pv_accum (sage::PvAccum: kFp32 or kFp16ThenFp32).
SAGE_CHECKED_OP(qk_int8_sv_f16_attn) {
  const View q_int8 = a.tensor(0), k_int8 = a.tensor(1), v = a.tensor(2), q_scale = a.tensor(3),
             k_scale = a.tensor(4), corr = a.tensor(5), k_residual = a.tensor(6), out = a.tensor(7),
             lse = a.tensor(8);
  const bool is_causal = a.flag(0), return_lse = a.flag(1);
  const auto accum = static_cast<sage::PvAccum>(a.integer(2));
  SAGE_CHECK(accum == sage::PvAccum::kFp32 || accum == sage::PvAccum::kFp16ThenFp32,
             "pv_accum must be 'fp32' or 'fp16+fp32'");
  const QkSizes s = check_mma_qk(q_int8, k_int8, q_scale, k_scale, corr);
  check_operand(v, "v", kF16, "[B, Hkv, Nk, D]", kCpAsync);
  SAGE_CHECK(v.device == q_int8.device, "q_int8, k_int8 and v must be on one device, got ", DeviceOf{q_int8},
             " and ", DeviceOf{v});
  SAGE_CHECK(v.size(0) == s.b && v.size(1) == s.hkv && v.size(2) == s.nk, "v must be [", s.b, ", ", s.hkv, ", ",
             s.nk, ", D] like k_int8, got ", SizesOf{v});
  check_head_dim(v.size(3), s.d_pad, "v's last dim");
  check_attn_outputs(out, lse, return_lse, s.b, s.hq, s.nq, v.size(3), q_int8);
  sage::AttnSm80Args args = mma_args(s, v.size(3), is_causal, return_lse, accum, q_int8, k_int8, v, q_scale, k_scale,
                                     corr, out, lse);
  if (k_residual.defined()) {
    check_operand(k_residual, "k_residual", kI8, "[B, Hkv, Nk, d_pad]", kCpAsync);
    SAGE_CHECK(k_residual.has_sizes({s.b, s.hkv, s.nk, s.d_pad}) && k_residual.device == k_int8.device,
               "k_residual must have k_int8's shape ", SizesOf{k_int8}, " and device ", DeviceOf{k_int8}, ", got ",
               SizesOf{k_residual}, " on ", DeviceOf{k_residual});
    args.k_residual = k_residual.ptr<int8_t>();
    args.k_residual_strides = strides(k_residual);
  }
  launch_on(q_int8.device, "qk_int8_sv_f16_attn", sage::launch_qk_int8_sv_f16_attn_sm80, args, stream);
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
SAGE_CHECKED_OP(qk_int8_sv_f8_attn_sm89) {
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
  const QkSizes s = check_mma_qk(q_int8, k_int8, q_scale, k_scale, corr);
  const int cc = compute_capability(q_int8.device);
  SAGE_CHECK(cc >= 89, "qk_int8_sv_f8_attn_sm89 needs an sm_89 or newer GPU (FP8 MMA), got sm_", cc);
  // Vᵀ is read with 16-byte cp.async, like K.
  const int64_t head_dim = check_vt(vt_fp8, v_scale, s, q_int8, kCpAsync, sage::kSm89KeyPermuteGroup, false);
  check_attn_outputs(out, lse, return_lse, s.b, s.hq, s.nq, head_dim, q_int8);
  sage::AttnSm89Args args = mma_args(s, head_dim, is_causal, return_lse, accum, q_int8, k_int8, vt_fp8, q_scale,
                                     k_scale, corr, out, lse);
  args.n_pad = static_cast<int>(vt_fp8.size(3));
  args.v_scale = v_scale.ptr<float>();
  args.v_scale_strides = strides(v_scale);
  launch_on(q_int8.device, "qk_int8_sv_f8_attn_sm89", sage::launch_qk_int8_sv_f8_attn_sm89, args, stream);
}
#endif

#ifdef SAGEATTN_FAMILY_SM90
// The split of the last wave's tiles that the sm_90a attention takes for these sizes on `sms` SMs
// (sm90/attn.h). ints: batch, heads_q, nq, nk, d_pad, causal, sms; ret: [first, parts, rows], tiles
// from `first` on run in `parts` parts (1: none), a tile holds `rows` query rows.
SAGE_CHECKED_OP(sm90_split_plan) {
  const int64_t batch = a.integer(0), heads_q = a.integer(1), nq = a.integer(2), nk = a.integer(3),
                d_pad = a.integer(4), sms = a.integer(6);
  SAGE_CHECK(batch >= 0 && heads_q >= 0 && nq >= 0 && nk >= 0 && sms >= 0,
             "sm90_split_plan: batch, heads_q, nq, nk and sms must be non-negative");
  check_attn_d_pad(d_pad, "sm90_split_plan: d_pad");
  const auto narrow = [](int64_t x) { return static_cast<int>(std::min<int64_t>(x, (int64_t{1} << 31) - 1)); };
  const sage::AttnSm90Split split = sage::attn_sm90_split_plan(
      narrow(batch), narrow(heads_q), narrow(nq), narrow(nk), static_cast<int>(d_pad), a.flag(5), narrow(sms));
  ret[0] = split.first;
  ret[1] = split.parts;
  ret[2] = split.rows;
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
SAGE_CHECKED_OP(qk_int8_sv_f8_attn_sm90) {
  const View q_int8 = a.tensor(0), k_int8 = a.tensor(1), vt_fp8 = a.tensor(2), q_scale = a.tensor(3),
             k_scale = a.tensor(4), v_scale = a.tensor(5), corr = a.tensor(6), out = a.tensor(7),
             lse = a.tensor(8), workspace = a.tensor(9);
  const bool is_causal = a.flag(0), return_lse = a.flag(1);
  const QkSizes s = check_qk(q_int8, k_int8, q_scale, k_scale, corr, kTma, kTma, sage::kSm90KeyBlock);
  SAGE_CHECK(s.nk >= 1, "k_int8 must hold at least one key (Nk = 0)");
  const int64_t head_dim = check_vt(vt_fp8, v_scale, s, q_int8, kTma, sage::kSm90KeyPermuteGroup, true);
  check_attn_outputs(out, lse, return_lse, s.b, s.hq, s.nq, head_dim, q_int8);
  uint8_t* partials = sm90_workspace(workspace, kCounterBytes, s.b, s.hq, s.nq, s.nk, s.d_pad, is_causal, q_int8);
  sage::AttnSm90Args args = sm90_args(q_int8, k_int8, vt_fp8, q_scale, k_scale, v_scale,
                                      return_lse ? corr : View{}, out, lse, is_causal);
  const DeviceGuard guard(q_int8.device);
  args.tile_counter = workspace.ptr<int>();
  check_cuda(cudaMemsetAsync(workspace.data, 0, 4 * (1 + sage::kSm90SplitCounters), stream), "cudaMemsetAsync");
  run_attn_sm90(args, partials, q_int8.device, stream);
}

// Bytes of attn_sm90's key order under a key-padding mask, kept in its workspace after the QkvLayout
// parts (every call reserves them: 4 (B Nk + B) bytes): key_order int32 [B, Nk], then kv_len int32 [B].
int64_t key_order_bytes(int64_t b, int64_t nk) { return round_up(4 * b * nk, 256) + round_up(4 * b, 256); }

// Bytes of attn_sm90's workspace for these sizes on `device`: the quantized Q, K, V with their scales
// and the quantization's workspace (QkvLayout), the key order (key_order_bytes), then the split's
// partials (-1 with sage_last_error set when the sizes are not valid or the device cannot be asked).
SAGE_EXPORT int64_t sage_attn_sm90_workspace_bytes(int64_t b, int64_t hq, int64_t hkv, int64_t nq, int64_t nk,
                                                   int64_t head_dim, int64_t d_pad, int64_t smooth_k,
                                                   int64_t with_corr, int64_t causal, int64_t device) {
  int64_t bytes = -1;
  guarded([&] {
    SAGE_CHECK(b >= 1 && nq >= 0, "attn_sm90: B must be at least 1 and Nq at least 0, got ", b, " and ", nq);
    check_qkv_sizes(b, hq, hkv, nq, nk, head_dim, d_pad);
    sage::QuantQkvArgs qa{};
    set_sizes(qa, b, hq, hkv, nq, nk, head_dim, d_pad);
    qa.n_pad = static_cast<int>(round_up(nk, sage::kQkvKeyGroup));
    qa.smooth_k = smooth_k != 0;
    const QkvLayout layout(qa, with_corr != 0);
    bytes = layout.offsets()[kQkvParts] + key_order_bytes(b, nk) +
            split_bytes(b, hq, nq, nk, d_pad, causal != 0, static_cast<int>(device));
  });
  return bytes;
}

// The whole sm_90a call in one op: quant_qkv_sm90 (with_corr = return_lse and smooth_k) with its
// outputs in the workspace, then qk_int8_sv_f8_attn_sm90 on them, out of q's dtype. The same kernels on
// the same data as the two ops, so the same bits, with one allocation for the intermediates and none of
// them handed to Python. tensors: q, k, v, out [B, Hq, Nq, D] of q's dtype (HND or NHD memory), lse?,
// workspace (sage_attn_sm90_workspace_bytes uint8), key_mask? (uint8 [B, Nk], any strides: nonzero
// keeps key t of batch entry b; not with is_causal: the op puts each batch entry's kept keys first, the
// quantization reads K and V in that order and the attention attends to as many keys as the entry
// keeps, QuantQkvArgs::key_mask); ints: is_causal, d_pad, smooth_k, return_lse; floats: sm_scale,
// scale_mul.
SAGE_CHECKED_OP(attn_sm90) {
  const View q = a.tensor(0), k = a.tensor(1), v = a.tensor(2), out = a.tensor(3), lse = a.tensor(4),
             workspace = a.tensor(5), key_mask = a.tensor(6);
  const bool is_causal = a.flag(0), smooth_k = a.flag(2), return_lse = a.flag(3);
  const int64_t d_pad = a.integer(1);
  const bool with_corr = return_lse && smooth_k;
  sage::QuantQkvArgs qa = qkv_inputs(q, k, v, smooth_k, a.real(0), a.real(1), d_pad, with_corr);
  if (key_mask.defined()) {
    check_tensor("", key_mask, "key_mask", kU8, {qa.batch, qa.nk}, q, true);
    SAGE_CHECK(!is_causal, "key_mask (a key-padding mask) cannot be combined with is_causal");
  }
  check_attn_outputs(out, lse, return_lse, qa.batch, qa.heads_q, qa.nq, qa.head_dim, q);
  SAGE_CHECK(out.dtype == q.dtype, "output out must have q's dtype ", DtypeOf{q}, ", got ", DtypeOf{out});
  const QkvLayout layout(qa, with_corr);
  const auto offset = layout.offsets();
  uint8_t* partials = sm90_workspace(workspace, offset[kQkvParts] + key_order_bytes(qa.batch, qa.nk), qa.batch,
                                     qa.heads_q, qa.nq, qa.nk, d_pad, is_causal, q);
  std::array<void*, kQkvParts> p;
  for (int i = 0; i < kQkvParts; ++i) p[i] = workspace.ptr<uint8_t>() + offset[i];
  set_outputs(qa, p, with_corr);
  if (key_mask.defined()) {
    uint8_t* keys = workspace.ptr<uint8_t>() + offset[kQkvParts];
    qa.key_order = reinterpret_cast<int*>(keys);
    qa.kv_len = reinterpret_cast<int*>(keys + round_up(4 * int64_t{qa.batch} * qa.nk, 256));
    qa.key_mask = key_mask.ptr<uint8_t>();
    qa.key_mask_sb = key_mask.strides[0];
    qa.key_mask_sn = key_mask.strides[1];
  }
  const DeviceGuard guard(q.device);
  launch_quant_qkv(qa, stream, "attn_sm90 (quantization)");

  // The attention on the contiguous intermediates.
  const auto part = [&](int i) { return layout.view(i, p[i], q); };
  sage::AttnSm90Args args = sm90_args(part(kQInt8), part(kKInt8), part(kVt), part(kQScale), part(kKScale),
                                      part(kVScale), with_corr ? part(kCorr) : View{}, out, lse, is_causal);
  args.kv_len = qa.kv_len;
  // The tile counter and the split tiles' counters: ints of the quantization's workspace that its launch
  // has zeroed (quant.h).
  args.tile_counter = reinterpret_cast<int*>(
      qa.workspace + sage::quant_qkv_spare_int_offset(qa.batch, qa.heads_kv, qa.nk, static_cast<int>(d_pad)));
  run_attn_sm90(args, partials, q.device, stream);
}
#endif
