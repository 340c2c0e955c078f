// Where the time of the sm_90a attention kernel goes, step by step: builds the kernel with its phase
// timestamps (SAGE_SM90_TRACE, see csrc/sm90/attn_int8_fp8.cu), runs it on random INT8 Q/K and FP8
// Vᵀ, and prints per consumer warpgroup the mean cycles of each phase of a steady-state step, the
// prologue and epilogue of a CTA, the SM clock, and the kernel's TOPS from CUDA events (untraced
// timing is bench_attention.py's job: the timestamps cost a few instructions per phase).
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -Icsrc/include -Icsrc bench/trace_sm90.cu -o /tmp/trace
//   /tmp/trace [n=4096] [batch=4] [heads=32] [causal=0] [--json FILE]
// With -DSAGE_SM90_NO_TRACE it times the kernel as built for the wheel (first line only), so kernel
// variants (an experiment's #ifndef knobs in attn_int8_fp8.cu, set with -D) can be compared without
// building a wheel each (bench/variants_sm90.sh). With -DSAGE_SM90_NO_TRACE -DSAGE_SM90_CTA_TIMES it also
// prints the tiles' timeline (as consumer warpgroup 0 sees them): start, Q landed, loop and epilogue per
// tile, the gaps between tiles on an SM. (The kernel's CTAs are persistent: "CTA" below means a tile.)
// Head dim 128; -DSAGE_TRACE_D=64 builds and runs the d=64 kernel instead. SAGE_TRACE_DATA picks the
// data (see main).
#ifndef SAGE_SM90_NO_TRACE
#define SAGE_SM90_TRACE 1
#endif
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <vector>

#include "bench_cuda.cuh"
#include "sm90/attn_int8_fp8.cu"

namespace {

using bench::fill_bytes;
using bench::fill_float;

#ifdef SAGE_SM90_TRACE
// Phase names of the events SAGE_TRACE records in a step (event e ends phase e).
const char* const kPhase[sage::kTraceEvents] = {
    "loop top, K scale",  "K ready (mbarrier)", "issue + wait Q.K", "softmax + pack",
    "V ready (mbarrier)", "issue + wait P.V",   "release, promote"};

#endif

#ifdef SAGE_SM90_CTA_TIMES
// One more launch (err is its launch status), then per CTA: entry -> Q landed -> last promotion -> exit
// in SM cycles, and per SM the gaps between one CTA's exit and the next one's entry (globaltimer), the
// share of the kernel's span the SMs spend inside a CTA, and the idle tail after an SM's last CTA.
// light(c): whether work item c is a head's last row block of fewer rows than the CTA's (its
// warpgroups past Nq idle), whose loop is reported apart from the others'.
template <typename Light>
void cta_timeline(cudaError_t err, int64_t ctas, Light light) {
  using namespace sage;
  CHECK(err);
  CHECK(cudaDeviceSynchronize());
  ctas = std::min<int64_t>(ctas, kCtaTimesMax);
  std::vector<long long> t(ctas * kCtaTimeFields);
  CHECK(cudaMemcpyFromSymbol(t.data(), g_sm90_cta_times, t.size() * sizeof(long long)));
  const auto F = [&](int64_t c, int f) { return t[c * kCtaTimeFields + f]; };
  long long begin = F(0, 1), end = F(0, 7);
  double pro = 0, body = 0, epi = 0, wg_skew = 0, light_body = 0;
  int64_t n_light = 0;
  int sms = 0;
  for (int64_t c = 0; c < ctas; ++c) {
    begin = std::min(begin, F(c, 1));
    end = std::max(end, F(c, 7));
    pro += F(c, 3) - F(c, 2);
    body += F(c, 4) - F(c, 3);
    if (light(c)) light_body += F(c, 4) - F(c, 3), ++n_light;
    epi += F(c, 5) - F(c, 4);
    wg_skew += F(c, 6) - F(c, 5);
    sms = std::max(sms, int(F(c, 0)) + 1);
  }
  std::vector<std::vector<int64_t>> per_sm(sms);
  for (int64_t c = 0; c < ctas; ++c) per_sm[F(c, 0)].push_back(c);
  double busy = 0, gaps = 0, tail = 0;
  int64_t n_gaps = 0;
  for (auto& list : per_sm) {
    std::sort(list.begin(), list.end(), [&](int64_t x, int64_t y) { return F(x, 1) < F(y, 1); });
    for (size_t i = 0; i < list.size(); ++i) {
      busy += F(list[i], 7) - F(list[i], 1);
      if (i + 1 < list.size()) gaps += F(list[i + 1], 1) - F(list[i], 7), ++n_gaps;
    }
    if (!list.empty()) tail += end - F(list.back(), 7);
  }
  std::printf("timeline: %lld CTAs on %d SMs (%.2f per SM), span %.1f us\n", static_cast<long long>(ctas), sms,
              double(ctas) / sms, (end - begin) * 1e-3);
  std::printf("  per CTA, cycles: entry -> Q landed %.0f, loop %.0f, epilogue %.0f, last warpgroup exits %.0f later\n",
              pro / ctas, body / ctas, epi / ctas, wg_skew / ctas);
  std::printf("  SMs inside a CTA %.1f%% of the span; exit -> next entry on an SM %.0f ns; idle tail %.1f us per SM\n",
              100.0 * busy / (double(sms) * (end - begin)), n_gaps ? gaps / n_gaps : 0.0, tail / sms * 1e-3);
  if (n_light > 0 && n_light < ctas) {
    std::printf("  loop cycles: %lld light tiles (a head's last row block) %.0f, the others %.0f\n",
                static_cast<long long>(n_light), light_body / n_light, (body - light_body) / (ctas - n_light));
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  using namespace sage;
  const bench::Shape shape = bench::shape_args(argc, argv);
  const int n = shape.n, batch = shape.batch, heads = shape.heads;
  const bool causal = argc > 4 && std::atoi(argv[4]) != 0;
  const char* json = (argc > 6 && std::strcmp(argv[5], "--json") == 0) ? argv[6] : nullptr;
#ifndef SAGE_TRACE_D
#define SAGE_TRACE_D 128
#endif
  constexpr int D = SAGE_TRACE_D;  // head dim (= d_pad): 128, or 64 with -DSAGE_TRACE_D=64
  const int n_pad = (n + 127) / 128 * 128;
  const int64_t qk_elems = int64_t(batch) * heads * n * D, vt_elems = int64_t(batch) * heads * D * n_pad;
  int8_t *q, *k;
  uint8_t* vt;
  float *qs, *ks, *vs;
  void* out;
  CHECK(cudaMalloc(&q, qk_elems));
  CHECK(cudaMalloc(&k, qk_elems));
  CHECK(cudaMalloc(&vt, vt_elems));
  CHECK(cudaMalloc(&qs, sizeof(float) * batch * heads * n));
  CHECK(cudaMalloc(&ks, sizeof(float) * batch * heads * (n_pad / 128)));
  CHECK(cudaMalloc(&vs, sizeof(float) * batch * heads * D));
  CHECK(cudaMalloc(&out, qk_elems * 2));
  // The data (SAGE_TRACE_DATA): "flat" (default) uniform INT8 Q and K with scores so small that every P
  // is about 448, V in [0.5, 2); "spread": scores with a standard deviation of about 3 in the log2
  // domain (P spread over e4m3's range, many zeros), V of both signs over e4m3's exponents; "small":
  // "spread" with Q and K in [-32, 31]; "p" / "v": only P / only V spread; "qlow" / "klow": "flat"
  // with Q / K in [0, 15] (their upper four bits never toggle). The instructions are the same; the power
  // drawn is not.
  const char* data = std::getenv("SAGE_TRACE_DATA");
  const auto is = [&](const char* name) { return data != nullptr && std::strcmp(data, name) == 0; };
  const bool spread_p = is("spread") || is("small") || is("p"), spread_v = is("spread") || is("small") || is("v");
  const uint32_t qk_mask = is("small") ? 0x3fu : 0xffu, qk_add = is("small") ? 0xe0u : 0u;
  fill_bytes<<<1024, 256>>>(reinterpret_cast<uint8_t*>(q), qk_elems, 1u, is("qlow") ? 0x0fu : qk_mask, qk_add);
  fill_bytes<<<1024, 256>>>(reinterpret_cast<uint8_t*>(k), qk_elems, 2u, is("klow") ? 0x0fu : qk_mask, qk_add);
  // e4m3 without NaN patterns: [0.5, 2), or any sign and exponent with the mantissa's top bit clear.
  fill_bytes<<<1024, 256>>>(vt, vt_elems, 3u, spread_v ? 0xf7u : 0x0fu, spread_v ? 0u : 0x30u);
  fill_float<<<256, 256>>>(qs, int64_t(batch) * heads * n, 1e-4f);
  fill_float<<<256, 256>>>(ks, int64_t(batch) * heads * (n_pad / 128), spread_p ? (is("small") ? 8.0f : 0.5f) : 1e-3f);
  fill_float<<<256, 256>>>(vs, int64_t(batch) * heads * D, 1.0f / 448.0f);

  AttnSm90Args a = bench::dense_attn_args({q, k, vt, qs, ks, vs, out}, batch, heads, n, n, n_pad, D, causal);
  // The last wave's tiles split as the wheel's op splits them.
  const AttnSm90Split split = bench::apply_split_plan(a);
  std::fprintf(stderr, "split: tiles from %d in %d parts\n", split.first, split.parts);
  // Each launch draws its tiles from counters of its own, zero at the start.
  constexpr int kLaunches = 64, kCounters = 1 + kSm90SplitCounters;
  int* counters;
  CHECK(cudaMalloc(&counters, kLaunches * kCounters * sizeof(int)));
  CHECK(cudaMemset(counters, 0, kLaunches * kCounters * sizeof(int)));
  int launches = 0;
  const auto launch = [&]() {
    if (launches == kLaunches) std::abort();
    a.tile_counter = counters + kCounters * launches++;
    return launch_qk_int8_sv_f8_attn_sm90(a, 0);
  };

  for (int i = 0; i < 3; ++i) CHECK(launch());
  CHECK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  constexpr int kReps = 20;  // with the 3 above and the timeline's, within kLaunches
  CHECK(cudaEventRecord(e0));
  for (int i = 0; i < kReps; ++i) CHECK(launch());
  CHECK(cudaEventRecord(e1));
  CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  ms /= kReps;
  const double flops = 4.0 * batch * heads * double(n) * n * D * (causal ? 0.5 : 1.0);

#ifdef SAGE_SM90_TRACE
  std::vector<long long> tr(sizeof(g_sm90_trace) / sizeof(long long)), cta(sizeof(g_sm90_trace_cta) / sizeof(long long));
  CHECK(cudaMemcpyFromSymbol(tr.data(), g_sm90_trace, sizeof(g_sm90_trace)));
  CHECK(cudaMemcpyFromSymbol(cta.data(), g_sm90_trace_cta, sizeof(g_sm90_trace_cta)));
  const auto T = [&](int c, int w, int blk, int ev) {
    return tr[((c * kMaxConsumerWgs + w) * kTraceBlocks + blk) * kTraceEvents + ev];
  };
  const auto C = [&](int c, int w, int ev) { return cta[(c * kMaxConsumerWgs + w) * 5 + ev]; };
  const double ghz = double(C(0, 0, 2) - C(0, 0, 0)) / double(C(0, 0, 4) - C(0, 0, 3));
  std::printf("n=%d b=%d h=%d d=%d causal=%d: kernel %.1f us, %.0f TOPS; SM clock %.3f GHz (CTA 0)\n", n, batch,
              heads, D, causal, ms * 1e3, flops / (ms * 1e-3) / 1e12, ghz);
  // Causal CTA 0 is the heaviest row block; its step count is that of the full key range.
#else
  std::printf("n=%d b=%d h=%d d=%d causal=%d: kernel %.1f us, %.0f TOPS\n", n, batch, heads, D, causal, ms * 1e3,
              flops / (ms * 1e-3) / 1e12);
#ifdef SAGE_SM90_CTA_TIMES
  constexpr int kRows = Cta<consumer_wgs(D)>::kBlockM;  // query rows per CTA
  // One entry per work item: the tiles, with the parts of the split ones (AttnSm90Split).
  const int blocks_m = (n + kRows - 1) / kRows;
  const int64_t tiles = int64_t{blocks_m} * heads * batch;
  // A head's last row block, where it holds fewer rows than a CTA: item % blocks_m is blocks_m - 1
  // (causal: 0, the heaviest first; causal items are recorded by their tile), among the whole tiles
  // (items before split.first).
  const auto light = [&](int64_t c) {
    return n % kRows != 0 && c < split.first && c % blocks_m == (causal ? 0 : blocks_m - 1);
  };
  cta_timeline(launch(), sm90_work_items(tiles, split.first, split.parts), light);
#endif
  return 0;
#endif
#ifdef SAGE_SM90_TRACE
  const int n_blocks = (n + 127) / 128;
  const int steps = n_blocks;  // one per key block, the last one masked
  const int lo = steps > 8 ? 2 : 0, hi = std::min(steps - 1, kTraceBlocks - 1);  // steady steps [lo, hi)
  FILE* js = json ? std::fopen(json, "w") : nullptr;
  if (js) std::fprintf(js, "{\"n\": %d, \"batch\": %d, \"heads\": %d, \"causal\": %d, \"ms\": %.5f, \"ghz\": %.4f, \"ctas\": [", n, batch, heads, causal, ms, ghz);
  for (int c = 0; c < kTraceCtas; ++c) {
    for (int w = 0; w < consumer_wgs(D); ++w) {
      std::printf("CTA %d warpgroup %d: entry -> loop %lld, loop -> end %lld cycles; steady steps %d..%d:\n", c, w,
                  C(c, w, 1) - C(c, w, 0), C(c, w, 2) - C(c, w, 1), lo, hi - 1);
      double total = 0;
      if (js) std::fprintf(js, "%s{\"cta\": %d, \"wg\": %d, \"prologue\": %lld, \"body\": %lld, \"phases\": {", (c || w) ? ", " : "", c, w, C(c, w, 1) - C(c, w, 0), C(c, w, 2) - C(c, w, 1));
      for (int ev = 0; ev < kTraceEvents; ++ev) {
        double sum = 0;
        for (int blk = lo; blk < hi; ++blk) {
          const long long start = ev == 0 ? T(c, w, blk - (blk > 0), kTraceEvents - 1) : T(c, w, blk, ev - 1);
          sum += blk > 0 || ev > 0 ? double(T(c, w, blk, ev) - start) : 0.0;
        }
        const double mean = hi > lo ? sum / (hi - lo) : 0.0;
        total += mean;
        std::printf("  %-28s %8.1f\n", kPhase[ev], mean);
        if (js) std::fprintf(js, "%s\"%s\": %.1f", ev ? ", " : "", kPhase[ev], mean);
      }
      std::printf("  %-28s %8.1f cycles per step\n", "total", total);
      if (js) std::fprintf(js, "}, \"step\": %.1f}", total);
    }
    // How far apart the warpgroups run: when warpgroup w's Q.K of a step completes, after warpgroup 0's.
    for (int w = 1; w < consumer_wgs(D); ++w) {
      double lag = 0;
      for (int blk = lo; blk < hi; ++blk) lag += double(T(c, w, blk, 2) - T(c, 0, blk, 2));
      std::printf("CTA %d: warpgroup %d's Q.K completes %.1f cycles after warpgroup 0's\n", c, w,
                  hi > lo ? lag / (hi - lo) : 0.0);
    }
  }
  if (js) {
    std::fprintf(js, "]}\n");
    std::fclose(js);
  }
  return 0;
#endif
}
