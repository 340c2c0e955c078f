// The fused quantization's work items on the host (csrc/fused/quant_qkv.cu: plan_grid, item_of), for
// tests/unit/test_quant_qkv_items.py: for each call shape on the command line, every item of the grid
// decoded as its CTA decodes it, and checked:
//   - every stats item, V tile, K block and Q tile of the call exactly once, nothing else;
//   - an item that waits for its (b, hkv)'s statistics (V tiles, K blocks; Q tiles with the
//     correction) comes after all of that head's stats items: the order the kernel's freedom from
//     deadlock rests on (the GPU starts a grid's CTAs in increasing blockIdx.x);
//   - with two launches (g.waits false), the first holds exactly the stats items;
//   - the last item quantizes head 0 (b = 0, hkv = 0): the heads go from the last to the first, so
//     the attention kernel, which draws the first heads first, finds their outputs in L2.
// Usage: quant_qkv_items "batch heads_q heads_kv nq nk head_dim corr" ...; prints one line per shape
// ("ok ..." or "FAIL ...") and exits 1 if any failed.
#include <cstdio>
#include <vector>

#include "fused/quant_qkv.cu"
#include "shape_args.h"

namespace {

using namespace sage;

bool check(int batch, int heads_q, int heads_kv, int nq, int nk, int head_dim, bool corr) {
  QuantQkvArgs a{};
  set_shape(a, batch, heads_q, heads_kv, nq, nk, head_dim);
  a.n_pad = (nk + kQkvKeyGroup - 1) / kQkvKeyGroup * kQkvKeyGroup;
  a.smooth_k = true;
  static float dummy;
  a.corr = corr ? &dummy : nullptr;
  QkvGrid g;
  const bool planned = a.d_pad == 64 ? plan_grid<64>(a, 2, &g) : plan_grid<128>(a, 2, &g);
  std::printf("b=%d hq=%d hkv=%d nq=%d nk=%d d=%d corr=%d: ", batch, heads_q, heads_kv, nq, nk, head_dim, corr);
  if (!planned) {
    std::printf("FAIL: no grid\n");
    return false;
  }
  const int64_t items = grid_items(g), stats_items = grid_stats_items(g);
  const int64_t kv_heads = int64_t{batch} * heads_kv, q_heads = int64_t{batch} * heads_q;
  // Per kind (ItemKind's order: stats, V, K, Q): its name, heads, items per head, and where each item
  // was seen (-1: not yet), [head][index].
  const char* const names[4] = {"stats item", "V tile", "K block", "Q tile"};
  const int64_t heads[4] = {kv_heads, kv_heads, kv_heads, q_heads};
  const int per_head[4] = {g.chunks, g.v_tiles, g.k_blocks, g.q_tiles};
  std::vector<int64_t> seen[4];
  for (int k = 0; k < 4; ++k) seen[k].assign(heads[k] * per_head[k], -1);
  std::vector<int64_t> last_stats(kv_heads, -1), first_waiting(kv_heads, items);
  const auto fail = [&](const char* what, int64_t t) {
    std::printf("FAIL: %s at item %lld\n", what, static_cast<long long>(t));
    return false;
  };
  for (int64_t t = 0; t < items; ++t) {
    const Item it = item_of(g, static_cast<int>(t));
    const int k = static_cast<int>(it.kind);
    if (it.head < 0 || it.head >= heads[k] || it.index < 0 || it.index >= per_head[k]) return fail(names[k], t);
    int64_t& slot = seen[k][int64_t{it.head} * per_head[k] + it.index];
    if (slot >= 0) return fail("item decoded twice", t);
    slot = t;
    const bool stats = it.kind == ItemKind::kStats;
    if (!g.waits && stats != (t < stats_items)) return fail("item in the wrong one of two launches", t);
    if (stats) {
      last_stats[it.head] = t;
      continue;
    }
    // V tiles and K blocks wait for their head's statistics; Q tiles only with the correction.
    const int64_t kv_head = it.kind == ItemKind::kQ ? it.head / g.kv_group : it.head;
    const bool waits = it.kind != ItemKind::kQ || corr;
    if (waits && t < first_waiting[kv_head]) first_waiting[kv_head] = t;
  }
  for (int k = 0; k < 4; ++k) {
    for (const int64_t t : seen[k]) {
      if (t < 0) return fail("item never decoded", items);
    }
  }
  const Item last = item_of(g, static_cast<int>(items - 1));
  if ((last.kind == ItemKind::kQ ? last.head / g.kv_group : last.head) != 0) {
    return fail("the last item is not head 0's", items - 1);
  }
  for (int64_t h = 0; h < kv_heads; ++h) {
    if (first_waiting[h] < items && first_waiting[h] < last_stats[h]) {
      return fail("an item waits for a later stats item", first_waiting[h]);
    }
  }
  std::printf("ok: %lld items, %d groups of %d heads, %s\n", static_cast<long long>(items), g.groups,
              g.group_heads, g.waits ? "one launch" : "two launches");
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  return check_shapes<7>(argc, argv, [](const std::array<int, 7>& s) {
    return check(s[0], s[1], s[2], s[3], s[4], s[5], s[6] != 0);
  });
}
