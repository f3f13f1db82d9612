// How often would the lean kernel's lazy leaf max (bench/NOTES.md v57, branch v56-chains) rescale on a real model's
// attention? Runs a model on the CPU over a held-out text, keeps every layer's post-RoPE queries and keys, and for
// sampled decode positions walks the keys as the lean kernel does (512-token chunks, 128-token leaves, 32-token
// steps; the sink tokens skipped): for each leaf step after the first, whether any query head of the kv head's group
// passes the leaf's reference max by more than SLACK log2 units (the warp-uniform rescale), against the every-step
// rescale of main's kernel. Also the same walk on N(0, 1) queries and keys (kvpack bench's data).
//
//   g++ -std=c++20 -O2 -I include -I src bench/tools/lazy_max_stats.cpp build/libkvpack.a -lfmt -lopenblas \
//       -licuuc -licui18n -lpthread -o /tmp/lazy_max_stats
//   /tmp/lazy_max_stats models/smollm2-135m-instruct.gguf data/eval-a.txt [TOKENS=4096] [SLACK=4] [EVERY=97]
// (the model and the texts: scripts/setup.sh)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kvpack/kv_codec.h"
#include "kvpack/llama.h"
#include "kvpack/tokenizer.h"

namespace {

constexpr int kSinks = 4, kStep = 32, kLeafSteps = 4;

struct Capture final : kvpack::ForwardObserver {
  int layers, hq, hk, d;
  std::vector<std::vector<float>> q, k;  // [layer][pos][heads][d]
  Capture(int l, int hq_, int hk_, int d_) : layers(l), hq(hq_), hk(hk_), d(d_), q(l), k(l) {}
  void on_attention_inputs(int layer, int n, const int*, const float* qs, const float* ks, const float*) override {
    q[layer].insert(q[layer].end(), qs, qs + size_t(n) * hq * d);
    k[layer].insert(k[layer].end(), ks, ks + size_t(n) * hk * d);
  }
};

struct Count {
  long steps = 0, fired = 0;  // leaf steps after the first, and those where the warp rescales
};

// The walk for one (query position t, kv head): scores of the group's heads in log2 units, leaf by leaf.
void walk(const float* q, int hq_stride, int group, const float* k, int hk_stride, int d, int t, float slack,
          Count& c) {
  const float scale = 1.4426950408889634f / std::sqrt(float(d));
  std::vector<float> s(size_t(group) * (t + 1));
  for (int h = 0; h < group; ++h)
    for (int j = 0; j <= t; ++j) {
      float a = 0.f;
      for (int i = 0; i < d; ++i) a += q[h * hq_stride + i] * k[size_t(j) * hk_stride + i];
      s[size_t(h) * (t + 1) + j] = a * scale;
    }
  const int leaf = kStep * kLeafSteps;
  for (int l0 = 0; l0 <= t; l0 += leaf) {
    std::vector<float> m(group, -INFINITY);
    for (int st = 0; st < kLeafSteps; ++st) {
      const int a = l0 + st * kStep, b = std::min(a + kStep, t + 1);
      if (a > t) break;
      bool any = false;
      for (int h = 0; h < group; ++h) {
        float mx = -INFINITY;
        for (int j = std::max(a, kSinks); j < b; ++j) mx = std::max(mx, s[size_t(h) * (t + 1) + j]);
        if (st == 0) m[h] = mx;
        else if (mx > m[h] + slack) any = true, m[h] = mx;
      }
      if (st > 0) c.steps++, c.fired += any;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL TEXT [TOKENS] [SLACK] [EVERY]\n", argv[0]);
    return 2;
  }
  const int tokens = argc > 3 ? std::atoi(argv[3]) : 4096;
  const float slack = argc > 4 ? std::atof(argv[4]) : 4.f;
  const int every = argc > 5 ? std::atoi(argv[5]) : 97;
  kvpack::LlamaModel model = kvpack::LlamaModel::load(argv[1]);
  const auto& cfg = model.config();
  std::ifstream in(argv[2]);
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<int32_t> ids = model.tokenizer().encode(ss.str(), model.add_bos());
  if (int(ids.size()) > tokens) ids.resize(tokens);
  const int n = static_cast<int>(ids.size());
  Capture cap(cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim);
  auto codec = kvpack::make_fp32_codec();
  kvpack::LlamaSession session(model, n, codec.get(), &cap);
  session.forward(ids, {});
  const int g = cfg.group_size(), d = cfg.head_dim;
  Count total;
  std::printf("layer  steps  rescaled (warp: any of %d heads passes its leaf max by > %.1f log2 units)\n", g, slack);
  for (int l = 0; l < cfg.n_layers; ++l) {
    Count c;
    for (int t = 1024; t < n; t += every)
      for (int h = 0; h < cfg.n_kv_heads; ++h)
        walk(cap.q[l].data() + (size_t(t) * cfg.n_heads + h * g) * d, d, g, cap.k[l].data() + size_t(h) * d,
             cfg.n_kv_heads * d, d, t, slack, c);
    std::printf("%5d %6ld  %5.1f%%\n", l, c.steps, 100.0 * c.fired / std::max(1L, c.steps));
    total.steps += c.steps, total.fired += c.fired;
  }
  std::printf("all   %6ld  %5.1f%%  (main's kernel rescales on 100%% of these steps)\n", total.steps,
              100.0 * total.fired / std::max(1L, total.steps));
  // kvpack bench's data: N(0, 1) queries and keys.
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  Count r;
  const int tr = 8192;
  std::vector<float> qr(size_t(g) * d), kr(size_t(tr) * d);
  for (auto& x : kr) x = nd(rng);
  for (int rep = 0; rep < 8; ++rep) {
    for (auto& x : qr) x = nd(rng);
    walk(qr.data(), d, g, kr.data(), d, d, tr - 1, slack, r);
  }
  std::printf("N(0,1) %6ld  %5.1f%%\n", r.steps, 100.0 * r.fired / std::max(1L, r.steps));
  return 0;
}
