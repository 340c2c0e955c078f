// Shared-memory barriers (mbarrier, sm_90 and newer) for producer/consumer pipelines, and the named
// CTA barriers (bar.sync with an id) that gather a subset of a CTA's warps.
//
// An mbarrier completes a phase when its pending arrival count reaches zero AND its pending
// transaction count (bytes announced with expect_tx and delivered by TMA with complete_tx) reaches
// zero. Waiters name the phase they wait for by its parity (0, 1, 0, ...), so a barrier can be
// reused round after round without being re-initialised.
#pragma once

#include <cstdint>

namespace sage {

// One thread initialises; `count` arrivals complete each phase.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(addr), "r"(count));
}

// Orders this thread's earlier shared-memory writes before later accesses of the async proxy (TMA,
// wgmma operands read from shared memory); the readers still need a barrier after it.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Makes the initialisations visible to the other threads and to the async proxy (TMA completes
// transactions on these barriers): call once after the mbar_init calls, before a block-wide sync.
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  fence_proxy_async_shared();
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n"
      ".reg .b64 state;\n"
      "mbarrier.arrive.shared::cta.b64 state, [%0];\n"
      "}\n" ::"r"(addr)
      : "memory");
}

// Arrive and announce `bytes` of incoming TMA transactions for the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n"
      ".reg .b64 state;\n"
      "mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n"
      "}\n" ::"r"(addr),
      "r"(bytes)
      : "memory");
}

// Block until the phase of parity `parity` has completed. try_wait suspends the thread for a
// system-dependent time inside the instruction, so the loop does not spin hot. (A label inside a
// { } block is local to it, so every inlined copy may use the same name.)
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "SAGE_MBAR_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra SAGE_MBAR_WAIT;\n"
      "}\n" ::"r"(addr),
      "r"(parity)
      : "memory");
}

// Whether the phase of parity `parity` has completed; may suspend the thread for a while first, as
// mbar_wait's tries do.
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(addr), "r"(parity)
      : "memory");
  return done != 0;
}

// Named barriers: 16 per CTA, id 0 is __syncthreads'. A phase completes when `count` threads (a
// multiple of 32, counted by whole warps) have reached it; bar.sync blocks until then. A warpgroup
// gathers its own threads on one without holding up the rest of the CTA.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

}  // namespace sage
