// The package-neutral half of the plain C ABI of the compiled modules: sageattention's
// (csrc/bindings.cpp) and sageattn3's (sageattention3_blackwell/csrc/bindings.cpp) include this one
// header, and sageattention/_cabi.py is its Python mirror (sageattn3's build copies both into its own
// tree, so neither package needs the other at run time). What is here: the tensor descriptors and
// their element type codes, the error state behind sage_last_error(), the one C signature of every
// op (SAGE_OP), the version exports, and the empty abi3 Python module that keeps the wheels' file
// names and Windows' link of PyInit_ working.
//
// Include it from the one translation unit of a module that talks to the framework: it defines the
// exported functions, so a second translation unit of the same module must not include it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <exception>
#include <initializer_list>
#include <sstream>
#include <string>
#include <utility>

// The module is also an importable abi3 Python extension (an empty module: the functions are reached
// through ctypes), so that the wheel's file names and Windows' link of PyInit_ hold.
#include <Python.h>

#if defined(_WIN32)
#define SAGE_EXPORT extern "C" __declspec(dllexport)
#else
#define SAGE_EXPORT extern "C" __attribute__((visibility("default")))
#endif

#define SAGE_CONCAT_(a, b) a##b
#define SAGE_CONCAT(a, b) SAGE_CONCAT_(a, b)
#define SAGE_STR_(a) #a
#define SAGE_STR(a) SAGE_STR_(a)

// PyInit_<name> of the empty Python module (name: the module's, TORCH_EXTENSION_NAME).
#define SAGE_PYTHON_MODULE(name)                                                                       \
  PyMODINIT_FUNC SAGE_CONCAT(PyInit_, name)(void) {                                                    \
    static PyModuleDef def = {PyModuleDef_HEAD_INIT, SAGE_STR(name), nullptr, -1, nullptr,             \
                              nullptr, nullptr, nullptr, nullptr};                                     \
    return PyModule_Create(&def);                                                                      \
  }

namespace {

// ---------------------------------------------------------------------------------------------------
// Tensor descriptors (sageattention/_cabi.py writes them): data pointer, element type (DType), device
// type (1: CUDA), device index, number of dims (-1: an absent optional tensor), four sizes, four
// strides in elements.
constexpr int kDescWords = 13;
enum DType : int64_t { kF16 = 0, kBF16 = 1, kF32 = 2, kI8 = 3, kU8 = 4, kF8E4M3 = 5, kI32 = 6 };

[[maybe_unused]] const char* dtype_name(int64_t t) {
  switch (t) {
    case kF16: return "float16";
    case kBF16: return "bfloat16";
    case kF32: return "float32";
    case kI8: return "int8";
    case kU8: return "uint8";
    case kF8E4M3: return "float8_e4m3fn";
    case kI32: return "int32";
    default: return "another dtype";
  }
}

struct View {
  void* data = nullptr;
  int64_t dtype = -1;
  bool cuda = false;
  int device = -1;
  int ndim = -1;
  int64_t sizes[4] = {0, 0, 0, 0};
  int64_t strides[4] = {0, 0, 0, 0};

  bool defined() const { return ndim >= 0; }
  int dim() const { return ndim; }
  int64_t size(int i) const { return sizes[i]; }
  int64_t stride(int i) const { return strides[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= sizes[i];
    return n;
  }
  bool has_sizes(std::initializer_list<int64_t> want) const {
    if (static_cast<int>(want.size()) != ndim) return false;
    int i = 0;
    for (const int64_t w : want) {
      if (sizes[i++] != w) return false;
    }
    return true;
  }
  bool contiguous() const {
    int64_t expect = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (sizes[i] != 1 && strides[i] != expect) return false;
      expect *= sizes[i];
    }
    return true;
  }
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

[[maybe_unused]] View view_at(const int64_t* t, int index) {
  const int64_t* w = t + static_cast<int64_t>(index) * kDescWords;
  View v;
  v.data = reinterpret_cast<void*>(static_cast<uintptr_t>(w[0]));
  v.dtype = w[1];
  v.cuda = w[2] == 1;
  v.device = static_cast<int>(w[3]);
  v.ndim = static_cast<int>(w[4]);
  for (int i = 0; i < 4; ++i) {
    v.sizes[i] = w[5 + i];
    v.strides[i] = w[9 + i];
  }
  return v;
}

// Printable facts of a view, for messages: its sizes, strides and device.
struct SizesOf {
  const View& v;
};
struct StridesOf {
  const View& v;
};
struct DeviceOf {
  const View& v;
};
struct DtypeOf {
  const View& v;
};
[[maybe_unused]] std::ostream& operator<<(std::ostream& os, SizesOf s) {
  os << "[";
  for (int i = 0; i < s.v.ndim; ++i) os << (i ? ", " : "") << s.v.sizes[i];
  return os << "]";
}
[[maybe_unused]] std::ostream& operator<<(std::ostream& os, StridesOf s) {
  os << "[";
  for (int i = 0; i < s.v.ndim; ++i) os << (i ? ", " : "") << s.v.strides[i];
  return os << "]";
}
[[maybe_unused]] std::ostream& operator<<(std::ostream& os, DeviceOf d) {
  return d.v.cuda ? os << "cuda:" << d.v.device : os << "cpu";
}
[[maybe_unused]] std::ostream& operator<<(std::ostream& os, DtypeOf d) { return os << dtype_name(d.v.dtype); }

// ---------------------------------------------------------------------------------------------------
// Errors: a failed check throws; the exported entry catches it and keeps the message for
// sage_last_error().
thread_local std::string g_last_error;

struct Failure : std::exception {
  std::string message;
  explicit Failure(std::string m) : message(std::move(m)) {}
  const char* what() const noexcept override { return message.c_str(); }
};

template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  throw Failure(os.str());
}

#define SAGE_CHECK(cond, ...) \
  do {                        \
    if (!(cond)) fail(__VA_ARGS__); \
  } while (0)

[[maybe_unused]] void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) fail(what, " failed: ", cudaGetErrorString(err));
}

template <typename Body>
int guarded(Body&& body) {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    g_last_error = e.what();
  } catch (...) {
    g_last_error = "unknown error";
  }
  return 1;
}

// Makes `device` current for the launch (the stream belongs to it) and restores the caller's.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ == device) {
      previous_ = -1;
    } else {
      check_cuda(cudaSetDevice(device), "cudaSetDevice");
    }
  }
  ~DeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// An attention input: q, k or v [B, H, N, D] of float16 or bfloat16 on a GPU, its last dimension dense.
[[maybe_unused]] bool is_half(const View& x) { return x.dtype == kF16 || x.dtype == kBF16; }

[[maybe_unused]] void check_input(const View& x, const char* name) {
  SAGE_CHECK(x.defined() && x.cuda, name, " must be a CUDA tensor, got one on ", DeviceOf{x});
  SAGE_CHECK(x.dim() == 4, name, " must be [B, H, N, D], got ", x.dim(), " dimensions");
  SAGE_CHECK(is_half(x), name, " must be float16 or bfloat16, got ", DtypeOf{x});
  SAGE_CHECK(x.stride(3) == 1, name, " must have a contiguous last dimension");
}

// The op's view of its arguments: tensors, ints and floats in its schema's order.
struct Args {
  const int64_t* t;
  const int64_t* i;
  const double* f;
  View tensor(int k) const { return view_at(t, k); }
  int64_t integer(int k) const { return i[k]; }
  bool flag(int k) const { return i[k] != 0; }
  double real(int k) const { return f[k]; }
};

}  // namespace

// ---------------------------------------------------------------------------------------------------
// The exported ABI. sage_abi_version() changes whenever a signature or a descriptor does;
// sageattention/_cabi.py (ABI_VERSION) refuses a module of another version.
SAGE_EXPORT int sage_abi_version() { return 3; }
SAGE_EXPORT const char* sage_last_error() { return g_last_error.c_str(); }
SAGE_EXPORT int sage_cuda_runtime_version() {
  return CUDART_VERSION;  // the toolkit the module was compiled with (its runtime is linked statically)
}
SAGE_EXPORT int sage_cuda_driver_version() {
  int version = 0;
  return cudaDriverGetVersion(&version) == cudaSuccess ? version : -1;
}

#define SAGE_OP(name) \
  SAGE_EXPORT int sage_##name(const int64_t* t, const int64_t* i, const double* f, void* stream_ptr, int64_t* ret)
#define SAGE_OP_BODY                                \
  const Args a{t, i, f};                            \
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr); \
  (void)a;                                          \
  (void)stream;                                     \
  (void)ret

// An op whose body runs guarded: SAGE_CHECKED_OP(name) { ... } is SAGE_OP(name) { return guarded([&] {
// SAGE_OP_BODY; ... }); }, the body seeing the op's arguments as `a`, its stream as `stream` and its
// int64 return words as `ret`.
#define SAGE_CHECKED_OP(name)                                                                                \
  static void sage_checked_##name(const Args& a, cudaStream_t stream, int64_t* ret);                         \
  SAGE_OP(name) {                                                                                            \
    return guarded([&] { sage_checked_##name(Args{t, i, f}, static_cast<cudaStream_t>(stream_ptr), ret); }); \
  }                                                                                                          \
  static void sage_checked_##name(const Args& a, cudaStream_t stream, int64_t* ret)
