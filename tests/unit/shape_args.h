// What the host check programs in this folder (quant_qkv_items.cu, sm90_tile_order.cu) share: their
// command line and the call shape of their launch arguments.
#pragma once

#include <array>
#include <cstdio>
#include <cstdlib>

// Each argument is one shape of kN integers ("4 32 32 1024 ..."), handed to check. Returns main's exit
// code: 0 when every shape passed, 1 when one failed, 2 for an argument that is not kN integers.
template <int kN, typename Check>
int check_shapes(int argc, char** argv, Check check) {
  bool ok = true;
  for (int i = 1; i < argc; ++i) {
    std::array<int, kN> shape{};
    const char* at = argv[i];
    for (int j = 0; j < kN; ++j) {
      char* end = nullptr;
      shape[j] = static_cast<int>(std::strtol(at, &end, 10));
      if (end == at) {
        std::printf("bad shape argument: %s\n", argv[i]);
        return 2;
      }
      at = end;
    }
    ok = check(shape) && ok;
  }
  return ok ? 0 : 1;
}

// The call shape of a kernel's launch arguments (QuantQkvArgs, AttnSm90Args): sizes, and the head dim
// padded to the sm_90a kernels' 64 (up to 64 channels) or 128.
template <typename Args>
void set_shape(Args& a, int batch, int heads_q, int heads_kv, int nq, int nk, int head_dim) {
  a.batch = batch;
  a.heads_q = heads_q;
  a.heads_kv = heads_kv;
  a.nq = nq;
  a.nk = nk;
  a.head_dim = head_dim;
  a.d_pad = head_dim <= 64 ? 64 : 128;
}
