// The sm_90a call's kernels on the GPU alone, without torch: the fused quantization of random
// bfloat16 Q, K and V (csrc/fused/quant_qkv.cu), the attention on its outputs (csrc/sm90), and the two
// in sequence as the attn_sm90 op launches them (the attention a programmatic dependent of the
// quantization). The gap between the call and the sum of its parts is what the kernels' hand-over
// costs; building csrc/sm90 with its grid_dependency_wait() taken out (wrong results, same work)
// bounds what an earlier start of the attention could save.
//
//   nvcc -std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr --use_fast_math -Icsrc/include -Icsrc -Ibench \
//     bench/call_sm90.cu csrc/fused/quant_qkv.cu csrc/sm90/attn_int8_fp8.cu -o /tmp/call
//   /tmp/call n batch heads [causal (0/1)] [passes]
// Prints µs per call (the median of `passes` passes of 20 calls each), the attention's TOPS and a hash
// of the call's output: two builds that should agree bit for bit print the same hash. The flushed call
// is the call timed as the DESIGN protocol times it (triton.testing.do_bench): after 256 MiB of zeros
// written to flush the L2, from the end of those writes; CALL_FLUSHED_PARTS=1 times the quantization
// and the attention that way too. CALL_COMPARE=<file> compares the output with another build's (see
// compare_output). CALL_NO_SPLIT=1 in the environment runs whole tiles only (no split plan for the last
// wave); -DCALL_HEAD_DIM=64 builds it for head dim 64. -DSAGE_QUANT_TIMES also prints the
// quantization's timeline (quant_timeline), back to back and after the flush: each item kind's life,
// the CTAs running over the launch, and its tail (how long the SMs idle at its end, and which items are
// still running then).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_cuda.cuh"
#include "fused/quant.h"
#include "sm90/attn.h"

#ifndef CALL_HEAD_DIM  // the head dim of Q, K and V: 128, or 64 (see the top of the file)
#define CALL_HEAD_DIM 128
#endif

namespace {

using bench::dev;

constexpr int kCalls = 20;  // calls per timed pass

// FNV-1a over the output's 16-bit elements: builds that should agree bit for bit print the same hash.
unsigned long long output_hash(const std::vector<uint16_t>& host) {
  unsigned long long h = 1469598103934665603ull;
  for (const uint16_t x : host) h = (h ^ x) * 1099511628211ull;
  return h;
}

float bf16_value(uint16_t x) {
  uint32_t bits = uint32_t{x} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// CALL_COMPARE=<file>: the output written there when the file does not exist, else compared with it
// (a build against another's output: relative L1 sum|o - r| / sum|r|, the largest difference, the
// cosine). Returns the printed line, empty without CALL_COMPARE.
std::string compare_output(const std::vector<uint16_t>& host) {
  const char* path = std::getenv("CALL_COMPARE");
  if (path == nullptr) return "";
  std::FILE* f = std::fopen(path, "rb");
  if (f == nullptr) {
    f = std::fopen(path, "wb");
    if (f == nullptr || std::fwrite(host.data(), sizeof(uint16_t), host.size(), f) != host.size()) {
      std::fprintf(stderr, "CALL_COMPARE: cannot write %s\n", path);
      std::exit(1);
    }
    std::fclose(f);
    return "compare: reference written\n";
  }
  std::vector<uint16_t> ref(host.size());
  const size_t got = std::fread(ref.data(), sizeof(uint16_t), ref.size(), f);
  std::fclose(f);
  if (got != ref.size()) return "compare: the reference has another size\n";
  double diff = 0, mag = 0, dot = 0, oo = 0, rr = 0, top = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double o = bf16_value(host[i]), r = bf16_value(ref[i]);
    diff += std::fabs(o - r), mag += std::fabs(r), dot += o * r, oo += o * o, rr += r * r;
    top = std::max(top, std::fabs(o - r));
  }
  char line[160];
  std::snprintf(line, sizeof line, "compare: relative L1 %.3e, max |diff| %.3e, cosine %.8f\n", diff / mag, top,
                dot / std::sqrt(oo * rr));
  return line;
}

#ifdef SAGE_QUANT_TIMES
// -DSAGE_QUANT_TIMES (built into csrc/fused/quant_qkv.cu as well): one more quantization, then per item
// kind its CTAs' mean life and statistics wait, the CTAs running over the launch's span in twelve bins,
// and the launch's tail.
void quant_timeline(const std::function<void()>& quant) {
  using namespace sage;
  constexpr int kMax = kQuantTimesMax, kF = kQuantTimeFields;
  std::vector<long long> t(size_t(kMax) * kF);
  CHECK(quant_qkv_times(t.data(), kMax));  // zeroes them
  quant();
  CHECK(cudaDeviceSynchronize());
  CHECK(quant_qkv_times(t.data(), kMax));
  const char* names[4] = {"stats", "V tile", "K block", "Q tile"};
  std::vector<const long long*> recorded;  // the records of the launch's CTAs
  for (int c = 0; c < kMax; ++c) {
    if (t[size_t(c) * kF + kQtStart] != 0) recorded.push_back(&t[size_t(c) * kF]);
  }
  long long begin = -1, end = 0;
  const int ctas = static_cast<int>(recorded.size());
  double life[4] = {}, wait[4] = {};
  int count[4] = {}, waited[4] = {};
  std::vector<long long> sm_end;  // per SM, its last CTA's end
  for (const long long* f : recorded) {
    const size_t sm = static_cast<size_t>(f[kQtSm]);
    if (sm_end.size() <= sm) sm_end.resize(sm + 1, 0);
    sm_end[sm] = std::max(sm_end[sm], f[kQtEnd]);
    begin = begin < 0 ? f[kQtStart] : std::min(begin, f[kQtStart]);
    end = std::max(end, f[kQtEnd]);
    const int k = int(f[kQtKind]);
    life[k] += f[kQtEnd] - f[kQtStart];
    ++count[k];
    if (f[kQtStatsDone] > 0) wait[k] += f[kQtStatsDone] - f[kQtStart], ++waited[k];
  }
  std::printf("quantization timeline: %d CTAs, span %.1f us\n", ctas, (end - begin) * 1e-3);
  for (int k = 0; k < 4; ++k) {
    if (count[k] == 0) continue;
    std::printf("  %-8s %5d CTAs, life %.2f us", names[k], count[k], life[k] / count[k] * 1e-3);
    if (waited[k]) std::printf(", start -> statistics in %.2f us", wait[k] / waited[k] * 1e-3);
    std::printf("\n");
  }
  constexpr int kBins = 12;
  std::printf("  CTAs running (mean over each twelfth of the span), by kind stats/V/K/Q:\n ");
  for (int bin = 0; bin < kBins; ++bin) {
    const double b0 = begin + double(end - begin) * bin / kBins, b1 = begin + double(end - begin) * (bin + 1) / kBins;
    double run[4] = {};
    for (const long long* f : recorded) {
      const double o = std::min<double>(f[kQtEnd], b1) - std::max<double>(f[kQtStart], b0);
      if (o > 0) run[f[kQtKind]] += o / (b1 - b0);
    }
    std::printf(" %.0f/%.0f/%.0f/%.0f", run[0], run[1], run[2], run[3]);
  }
  std::printf("\n");
  // The launch's tail: how long each SM idles between its last CTA's end and the launch's, and what
  // the CTAs still running in the last microseconds are.
  std::vector<double> idle;
  for (const long long e : sm_end) {
    if (e > 0) idle.push_back((end - e) * 1e-3);
  }
  std::sort(idle.begin(), idle.end());
  if (!idle.empty()) {
    double sum = 0;
    for (const double x : idle) sum += x;
    const auto pct = [&](double q) { return idle[static_cast<size_t>(q * (idle.size() - 1))]; };
    std::printf("  tail: %zu SMs idle at the end for %.2f us on average (p10 %.2f, p50 %.2f, p90 %.2f, max %.2f)\n",
                idle.size(), sum / idle.size(), pct(0.1), pct(0.5), pct(0.9), idle.back());
  }
  for (const double last_us : {1.0, 2.0, 4.0}) {
    int running[4] = {};
    for (const long long* f : recorded) {
      if (f[kQtEnd] > end - static_cast<long long>(last_us * 1e3)) ++running[f[kQtKind]];
    }
    std::printf("  CTAs running in the last %.0f us, stats/V/K/Q: %d/%d/%d/%d\n", last_us, running[0], running[1],
                running[2], running[3]);
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  using namespace sage;
  const bench::Shape shape = bench::shape_args(argc, argv);
  const int n = shape.n, batch = shape.batch, heads = shape.heads;
  const bool causal = argc > 4 && std::atoi(argv[4]) != 0;
  const int passes = argc > 5 ? std::max(1, std::atoi(argv[5])) : 5;
  constexpr int D = CALL_HEAD_DIM;
  const int64_t elems = int64_t(batch) * heads * n * D;

  QuantQkvArgs a = bench::random_qkv(n, batch, heads, D);
  const bench::DenseAttn in{a.q_int8, a.k_int8, a.vt, a.q_scale, a.k_scale, a.v_scale, dev<uint16_t>(elems)};
  AttnSm90Args b = bench::dense_attn_args(in, batch, heads, n, n, a.n_pad, D, causal);
  // CALL_NO_SPLIT=1: whole tiles only (the last wave not split along the keys).
  if (std::getenv("CALL_NO_SPLIT") == nullptr) bench::apply_split_plan(b);
  // The call's tile counter: a spare int of the quantization's workspace, zeroed by its launch. The
  // attention alone draws from counters of its own, one zeroed block per call.
  int* call_counter = reinterpret_cast<int*>(a.workspace + quant_qkv_spare_int_offset(batch, heads, n, D));
  int* alone_counters = dev<int>(int64_t(kCalls) * kQkvSpareInts);

  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // The quantization clears its counters itself, as the op launches it; CALL_CLEAR_KERNEL=1: by the
  // clearing kernel before it, as in a CUDA graph.
  const bool clear_kernel = std::getenv("CALL_CLEAR_KERNEL") != nullptr;
  const auto quant = [&]() {
    a.clear_nonce = clear_kernel ? 0 : quant_qkv_clear_nonce(s);
    CHECK(launch_quant_qkv_sm90(a, s));
  };
  const auto attention = [&](int* counter) {
    b.tile_counter = counter;
    CHECK(launch_qk_int8_sv_f8_attn_sm90(b, s));
  };
  // The protocol's L2 flush (triton.testing.do_bench zeroes 256 MiB before each call), for the flushed
  // passes, which time each call alone, from the flush's end, as do_bench does.
  constexpr size_t kFlushBytes = size_t{256} << 20;
  uint8_t* flush = dev<uint8_t>(kFlushBytes);
  // Event pairs around what a pass times: the whole pass (back to back), or each call (flushed).
  std::vector<cudaEvent_t> marks(2 * kCalls);
  for (cudaEvent_t& e : marks) CHECK(cudaEventCreate(&e));
  // One pass of kCalls: what = 0 quantization, 1 attention, 2 both (the call); `flushed`: each after a
  // flush of the L2. µs per call.
  const auto pass = [&](int what, bool flushed) {
    if (what == 1) CHECK(cudaMemsetAsync(alone_counters, 0, sizeof(int) * kCalls * kQkvSpareInts, s));
    const int pairs = flushed ? kCalls : 1;
    for (int i = 0; i < kCalls; ++i) {
      if (flushed) CHECK(cudaMemsetAsync(flush, 0, kFlushBytes, s));
      if (flushed || i == 0) CHECK(cudaEventRecord(marks[2 * (i % pairs)], s));
      if (what != 1) quant();
      if (what != 0) attention(what == 1 ? alone_counters + int64_t(i) * kQkvSpareInts : call_counter);
      if (flushed || i == kCalls - 1) CHECK(cudaEventRecord(marks[2 * (i % pairs) + 1], s));
    }
    CHECK(cudaStreamSynchronize(s));
    float sum = 0;
    for (int i = 0; i < pairs; ++i) {
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, marks[2 * i], marks[2 * i + 1]));
      sum += ms;
    }
    return sum * 1e3f / kCalls;
  };
  // Back to back, then flushed: the call always, the quantization and the attention alone with
  // CALL_FLUSHED_PARTS=1.
  const bool flushed_parts = std::getenv("CALL_FLUSHED_PARTS") != nullptr;
  const auto timed = [&](int what, bool flushed) { return !flushed || what == 2 || flushed_parts; };
  for (int f = 0; f < 2; ++f) {
    for (int what = 0; what < 3; ++what) {
      if (timed(what, f)) pass(what, f);  // warm-up
    }
  }
  std::vector<float> t[2][3];
  for (int p = 0; p < passes; ++p) {
    for (int f = 0; f < 2; ++f) {
      for (int what = 0; what < 3; ++what) t[f][what].push_back(timed(what, f) ? pass(what, f) : 0.0f);
    }
  }
  float med[2][3];
  for (int f = 0; f < 2; ++f) {
    for (int what = 0; what < 3; ++what) {
      std::sort(t[f][what].begin(), t[f][what].end());
      med[f][what] = t[f][what][t[f][what].size() / 2];
    }
  }
#ifdef SAGE_QUANT_TIMES
  std::printf("back to back: ");
  quant_timeline(quant);
  std::printf("after the flush: ");
  quant_timeline([&]() {
    CHECK(cudaMemsetAsync(flush, 0, kFlushBytes, s));
    quant();
  });
#endif
  std::vector<uint16_t> host(static_cast<size_t>(elems));
  CHECK(cudaMemcpy(host.data(), in.out, sizeof(uint16_t) * host.size(), cudaMemcpyDeviceToHost));
  const double flops = 4.0 * batch * heads * double(n) * n * D * (causal ? 0.5 : 1.0);
  std::printf("n=%d b=%d h=%d %s: quantization %.1f us, attention %.1f us (%.0f TOPS), call %.1f us (%.0f TOPS), "
              "call - parts %.1f us, flushed call %.1f us (%.0f TOPS), output hash %016llx\n",
              n, batch, heads, causal ? "causal" : "non-causal", med[0][0], med[0][1], flops / med[0][1] * 1e-6,
              med[0][2], flops / med[0][2] * 1e-6, med[0][2] - med[0][0] - med[0][1], med[1][2],
              flops / med[1][2] * 1e-6, output_hash(host));
  std::printf("%s", compare_output(host).c_str());
  if (flushed_parts) std::printf("flushed: quantization %.1f us, attention %.1f us\n", med[1][0], med[1][1]);
  return 0;
}
