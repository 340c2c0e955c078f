// The command line of the host check programs in this folder (quant_qkv_items.cu, sm90_tile_order.cu):
// each argument is one shape of kN integers ("4 32 32 1024 ..."), handed to check. Returns main's exit
// code: 0 when every shape passed, 1 when one failed, 2 for an argument that is not kN integers.
#pragma once

#include <array>
#include <cstdio>
#include <cstdlib>

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
