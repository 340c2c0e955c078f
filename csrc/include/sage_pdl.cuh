// Programmatic dependent launch (sm_90 and newer): a kernel launched with programmatic stream
// serialization may start while the kernel before it in the stream is still running. It starts once
// every CTA of that kernel has called allow_dependent_grid() (or ended), and grid_dependency_wait()
// holds it, where it is called, until that kernel has completed and its writes are visible.
//
// Used by the fused quantization (csrc/fused/quant_qkv.cu: the clearing kernel, then the quantization)
// and by the attention kernel behind it (csrc/sm90/attn_int8_fp8.cu).
#pragma once

#include <cuda_runtime.h>

namespace sage {

// ------------------------------------------------------------------------------------------------
// Device

// Waits until the kernel before this one in the stream has completed and its writes are visible;
// returns at once where the launch has no such dependency (or below sm_90).
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the kernel launched behind this one with programmatic stream serialization start once every
// CTA of this launch has called it (or ended).
__device__ __forceinline__ void allow_dependent_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// ------------------------------------------------------------------------------------------------
// Host

// Launches kernel<<<grid, block, smem, stream>>>(args...); with `overlap`, with programmatic stream
// serialization (the kernel may start before the one ahead of it in the stream has ended, see above).
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                          bool overlap, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = overlap ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Args&&>(args)...);
}

}  // namespace sage
