// The sm_90a attention's work items on the host (csrc/sm90/attn_int8_fp8.cu: attn_sm90_split_plan,
// plan_tile_order, drawn_tile, Work), for tests/unit/test_sm90_tile_order.py: for
// each launch shape on the command line, every item the CTAs draw decoded as the producer decodes it,
// and checked:
//   - every whole tile exactly once, every part of a split tile exactly once, its parts covering the
//     tile's key blocks in order, nothing else;
//   - non-causal with light_heads > 0, the items just before the split are the light_heads light last
//     row blocks, and no item before them is one of those.
// Usage: sm90_tile_order "batch heads_q heads_kv nq nk head_dim causal sms" ...; prints one line per
// shape ("ok ..." with the launch's light_heads and causal_tail_heads, or "FAIL ...") and exits 1 if any
// failed.
#include <cstdio>
#include <vector>

#include "shape_args.h"
#include "sm90/attn_int8_fp8.cu"

namespace {

using namespace sage;

template <bool kCausal>
bool check(int batch, int heads_q, int heads_kv, int nq, int nk, int head_dim, int sms) {
  AttnSm90Args a{};
  set_shape(a, batch, heads_q, heads_kv, nq, nk, head_dim);
  a.causal = kCausal;
  std::printf("b=%d hq=%d hkv=%d nq=%d nk=%d d=%d causal=%d sms=%d: ", batch, heads_q, heads_kv, nq, nk, head_dim,
              kCausal, sms);
  const int rows = consumer_wgs(a.d_pad) * kWgRows, blocks_m = (nq + rows - 1) / rows;
  const int blocks = (nk + kBlockN - 1) / kBlockN;
  const int64_t tiles = int64_t{blocks_m} * heads_q * batch;
  // The split as the bindings plan it and the launcher takes it.
  const AttnSm90Split plan = attn_sm90_split_plan(batch, heads_q, nq, nk, a.d_pad, kCausal, sms);
  a.split_parts = plan.parts > 1 ? plan.parts : 1;
  a.split_first = plan.parts > 1 ? plan.first : static_cast<int>(tiles);
  const int64_t items = sm90_work_items(tiles, a.split_first, a.split_parts);
  plan_tile_order(a, rows, kCausal, items < sms ? items : sms);
  const auto fail = [&](const char* what, int64_t item) {
    std::printf("FAIL: %s at item %lld\n", what, static_cast<long long>(item));
    return false;
  };
  // Per tile: the key block where its next part must start (0: none seen), or -1 once whole.
  std::vector<int> next(tiles, 0);
  const int64_t light0 = a.split_first - a.light_heads;
  for (int64_t item = 0; item < items; ++item) {
    const int i = static_cast<int>(item);
    const Work w = Work::of<kCausal>(a, drawn_tile<kCausal>(a, i, blocks_m));
    if (w.tile < 0 || w.tile >= tiles) return fail("tile out of range", item);
    const bool light = w.tile % blocks_m == blocks_m - 1 && w.tile / blocks_m < a.light_heads;
    if (!kCausal && light != (item >= light0 && item < a.split_first)) return fail("light tile out of place", item);
    int& at = next[w.tile];
    if (w.slot < 0) {
      if (at != 0) return fail("tile drawn twice", item);
      at = -1;
    } else {
      if (at < 0 || w.kb0 != at || w.kb1 <= w.kb0 || w.kb1 > blocks) return fail("part out of order", item);
      at = w.kb1 == blocks ? -1 : w.kb1;
    }
  }
  for (int64_t t = 0; t < tiles; ++t) {
    if (next[t] != -1) return fail("tile never drawn whole", items);
  }
  std::printf("ok: %lld tiles, %lld items, light_heads=%d causal_tail_heads=%d\n", static_cast<long long>(tiles),
              static_cast<long long>(items), a.light_heads, a.causal_tail_heads);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return check_shapes<8>(argc, argv, [](const std::array<int, 8>& s) {
    return s[6] != 0 ? check<true>(s[0], s[1], s[2], s[3], s[4], s[5], s[7])
                     : check<false>(s[0], s[1], s[2], s[3], s[4], s[5], s[7]);
  });
}
