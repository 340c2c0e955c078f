// Tensor Memory Accelerator (TMA, sm_90 and newer): tiled global->shared copies described by a
// CUtensorMap, completing on an mbarrier (sage_mbarrier.cuh), and shared->global stores of a box.
//
// Host side: make_tensor_map_4d() encodes a map with cuTensorMapEncodeTiled, looked up through
// the runtime's driver entry point so the extension does not link against libcuda (the driver
// library comes with the GPU driver, not with the toolkit the wheel is built with).
// Device side: the map is a `const __grid_constant__ CUtensorMap` kernel parameter (it must live
// in parameter/constant space for the TMA unit to read it) and tma_load_4d() issues one box.
//
// Elements of the box that fall outside the tensor's extents are zero-filled and still count
// towards the transaction bytes, so a tile at the end of a sequence arrives as a full box whose
// missing rows are zeros, never rows of the next head.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>

namespace sage {

// ------------------------------------------------------------------------------------------------
// Host

// cuTensorMapEncodeTiled from the driver, resolved once (thread-safe static initialisation);
// nullptr when the driver does not provide it (a driver older than CUDA 12.0).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = []() -> PFN_cuTensorMapEncodeTiled_v12000 {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &ptr, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) return nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

// A 4-d map over bytes (UINT8 elements: INT8 and FP8 tensors alike). dims[0] is the contiguous
// dimension; strides_bytes[i] is the stride of dims[i + 1] (TMA needs multiples of 16 bytes and a
// 16-byte aligned base). box[i] <= 256, and with a swizzle box[0] must not exceed the swizzle span.
// Returns cudaErrorInvalidValue when the driver rejects the description.
inline cudaError_t make_tensor_map_4d(CUtensorMap* map, const void* base, const uint64_t (&dims)[4],
                                      const uint64_t (&strides_bytes)[3], const uint32_t (&box)[4],
                                      CUtensorMapSwizzle swizzle) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult res = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, const_cast<void*>(base), dims, strides_bytes,
                              box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return res == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// ------------------------------------------------------------------------------------------------
// Device

// Pull the map into the TMA unit's descriptor cache before the first copy needs it.
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Copy the box at coordinates (c0 innermost .. c3) into shared memory at `dst`; the bytes complete
// on `bar` (announce them first with mbar_arrive_expect_tx). `dst` must be aligned to the swizzle
// pattern's repeat (1024 bytes for 128B swizzle, 512 for 64B).
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2,
                                            int c3) {
  const uint32_t dst_addr = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  const uint32_t bar_addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst_addr),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar_addr)
      : "memory");
}

// Bring the box at coordinates (c0 innermost .. c3) into L2, with no destination and no barrier.
__device__ __forceinline__ void tma_prefetch_l2_4d(const CUtensorMap* map, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

// Copy the box at `src` (shared memory, laid out as the map's swizzle says) to the tensor at coordinates
// (c0 innermost .. c3), as one bulk group of this thread; elements outside the tensor's extents are not
// written. The shared memory must not change until tma_store_wait_read() has returned after the group's
// tma_store_commit(); write it, then fence_proxy_async_shared() and a barrier, before the issuing thread
// calls this.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* src, int c0, int c1, int c2, int c3) {
  const uint32_t src_addr = static_cast<uint32_t>(__cvta_generic_to_shared(src));
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src_addr), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

// Closes this thread's bulk group of stores.
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until every bulk group this thread committed has read its shared memory (the writes to global
// memory complete on their own, visible once the grid has ended).
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

}  // namespace sage
