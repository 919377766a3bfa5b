// Sampling on the GPU (sampling.cu: Backend::sample_rows / speculative_verdict) against
// core/sampling.h on the host: the same processed distributions up to float rounding (the same
// support), the same draws wherever u * total is not within rounding of a cumulative boundary,
// and the same speculative verdicts on the same inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "core/sampling.h"
#include "cuda_test_util.h"

namespace qs::testing {
namespace {

struct Case {
  float temperature;
  int top_k;
  float top_p;
  float min_p;
};

std::string describe(const Case& c, int n, int kind) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "n %d kind %d T %.2f top_k %d top_p %.3f min_p %.3f", n, kind,
                c.temperature, c.top_k, c.top_p, c.min_p);
  return buf;
}

SamplingParams params_of(const Case& c) {
  SamplingParams p;
  p.temperature = c.temperature;
  p.top_k = c.top_k;
  p.top_p = c.top_p;
  p.min_p = c.min_p;
  return p;
}

// Logit rows of several kinds: plain normal (scale 3), ties (small integers), a peaked row with
// -inf entries, a flat row (all equal).
std::vector<float> logit_row(int n, int kind, uint64_t seed) {
  std::vector<float> x = random_normal(static_cast<size_t>(n), seed, 3.0f);
  switch (kind) {
    case 1:
      for (float& v : x) v = std::round(v);
      break;
    case 2:
      for (int i = 0; i < n; i += 7) x[i] = -std::numeric_limits<float>::infinity();
      x[n / 2] = 25.0f;
      break;
    case 3:
      for (float& v : x) v = 0.5f;
      break;
    default:
      break;
  }
  return x;
}

// Whether the host's draw at u and the GPU's token differ only through rounding: u * total
// within 1e-9 (relative) of the cumulative sum at the boundary between the two tokens.
bool near_boundary(const std::vector<float>& probs, double u, int32_t a, int32_t b) {
  double total = 0.0;
  for (float p : probs) total += p;
  const double target = u * total;
  double cum = 0.0;
  const int32_t lo = std::min(a, b);
  for (int32_t i = 0; i < lo + 1; ++i) cum += probs[i];
  return std::fabs(cum - target) <= 1e-9 * total || target >= total * (1 - 1e-12);
}

const Case kCases[] = {
    {1.0f, 0, 1.0f, 0.0f}, {0.7f, 0, 0.9f, 0.0f},  {1.3f, 50, 1.0f, 0.0f}, {0.8f, 40, 0.95f, 0.05f},
    {1.0f, 1, 1.0f, 0.0f}, {1.0f, 0, 0.5f, 0.0f},  {2.0f, 0, 0.99f, 0.0f}, {1.0f, 0, 1.0f, 0.3f},
    {0.0f, 0, 1.0f, 0.0f}, {0.5f, 3, 0.01f, 0.0f},
};

TEST_F(CudaOpsTest, SampleRowsMatchTheHost) {
  uint64_t seed = 500;
  double worst = 0.0;
  int draws = 0, boundary = 0;
  for (int n : {1, 7, 1000, 32000, 128256}) {
    for (int kind = 0; kind < 4; ++kind) {
      for (const Case& c : kCases) {
        const SamplingParams params = params_of(c);
        const int rows = 3;
        std::vector<float> logits;
        for (int r = 0; r < rows; ++r) {
          const std::vector<float> row = logit_row(n, kind, ++seed);
          logits.insert(logits.end(), row.begin(), row.end());
        }
        DeviceArray ld(gpu(), logits);
        DeviceArray probs(gpu(), logits.size());
        probs.poison();
        const double us[][3] = {{0.0, 0.5, 0.999999}, {0.25, 0.75, 0.1}, {0.9, 0.01, 0.6}};
        for (const auto& u : us) {
          std::vector<int32_t> got(rows, -1);
          gpu().sample_rows(ld.data(), rows, n, params, u, probs.data(), got.data());
          const std::vector<float> gp = probs.to_host();
          for (int r = 0; r < rows; ++r) {
            std::vector<float> want;
            token_probabilities(logits.data() + static_cast<size_t>(r) * n, n, params, want);
            const float* g = gp.data() + static_cast<size_t>(r) * n;
            int support_diff = 0;
            double err = 0.0;
            for (int i = 0; i < n; ++i) {
              support_diff += (g[i] > 0.0f) != (want[i] > 0.0f);
              err = std::max(err,
                             std::fabs(double(g[i]) - want[i]) / std::max(1e-30, double(want[i])));
              if (std::isnan(g[i])) err = INFINITY;
            }
            worst = std::max(worst, err);
            ASSERT_EQ(support_diff, 0) << describe(c, n, kind) << " row " << r;
            ASSERT_LT(err, 2e-6) << describe(c, n, kind) << " row " << r;
            const int32_t host = sample_at(want.data(), n, u[r]);
            ++draws;
            if (got[r] != host) {
              ++boundary;
              EXPECT_TRUE(near_boundary(want, u[r], host, got[r]))
                  << describe(c, n, kind) << " row " << r << " u " << u[r] << ": gpu " << got[r]
                  << " host " << host;
            }
            ASSERT_GT(want[got[r]], 0.0f) << "a zero-probability token was drawn";
          }
        }
      }
    }
  }
  std::printf(
      "[ max rel error ] sample_rows probabilities: %.3g; %d of %d draws differ "
      "(rounding at a boundary)\n",
      worst, boundary, draws);
}

// Without a probs buffer (the AR decoder's call): the same tokens.
TEST_F(CudaOpsTest, SampleRowsWithoutProbsBuffer) {
  const int n = 32000;
  const std::vector<float> logits = logit_row(n, 0, 77);
  DeviceArray ld(gpu(), logits);
  DeviceArray probs(gpu(), logits.size());
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.9f;
  for (double u : {0.0, 0.3, 0.7, 0.99}) {
    int32_t a = -1, b = -1;
    gpu().sample_rows(ld.data(), 1, n, p, &u, probs.data(), &a);
    gpu().sample_rows(ld.data(), 1, n, p, &u, nullptr, &b);
    EXPECT_EQ(a, b) << u;
  }
}

TEST_F(CudaOpsTest, SpeculativeVerdictMatchesTheHost) {
  uint64_t seed = 900;
  int verdicts = 0, rejections = 0;
  for (int n : {7, 1000, 32000}) {
    for (int gamma : {0, 1, 3, 7, 15, 16, 40, 255}) {  // 255: the longest round (G = 256)
      for (float noise : {0.0f, 0.3f, 3.0f}) {
        for (const Case& c :
             {Case{1.0f, 0, 1.0f, 0.0f}, Case{0.8f, 40, 0.95f, 0.05f}, Case{1.2f, 0, 0.9f, 0.0f}}) {
          for (bool residual : {true, false}) {
            const SamplingParams params = params_of(c);
            std::vector<float> target, draft;
            for (int r = 0; r <= gamma; ++r) {
              const std::vector<float> t = logit_row(n, 0, ++seed);
              const std::vector<float> e = random_normal(static_cast<size_t>(n), ++seed, noise);
              target.insert(target.end(), t.begin(), t.end());
              if (r < gamma) {
                for (int i = 0; i < n; ++i) draft.push_back(t[i] + e[i]);
              }
            }
            // The draft's distributions and candidates, drawn on the GPU as a round does.
            DeviceArray td(gpu(), target);
            DeviceArray dd(gpu(), draft.empty() ? std::vector<float>(n) : draft);
            DeviceArray q(gpu(), std::max<size_t>(draft.size(), n));
            std::vector<int32_t> g(gamma);
            std::vector<double> ud(gamma);
            for (int i = 0; i < gamma; ++i) ud[i] = (i + 0.5) / (gamma + 1);
            if (gamma > 0) {
              gpu().sample_rows(dd.data(), gamma, n, params, ud.data(), q.data(), g.data());
            }
            const std::vector<float> qh = q.to_host();
            std::vector<double> u(gamma + 1);
            for (int i = 0; i <= gamma; ++i) u[i] = std::fmod(0.37 * (i + 1) + 0.11 * seed, 1.0);
            const SpecVerdict got = gpu().speculative_verdict(td.data(), q.data(), gamma, n, params,
                                                              g.data(), u.data(), residual);
            std::vector<float> qwant = qh, row;
            auto p = [&](int r) {
              token_probabilities(target.data() + static_cast<size_t>(r) * n, n, params, row);
              return row.data();
            };
            const SpecVerdict want =
                speculative_verdict(p, qwant.data(), gamma, n, g.data(), u.data(), residual);
            const std::string what = describe(c, n, 0) + " gamma " + std::to_string(gamma) +
                                     " noise " + std::to_string(noise) +
                                     (residual ? "" : " no residual");
            ++verdicts;
            rejections += want.accepted < gamma;
            EXPECT_EQ(got.accepted, want.accepted) << what;
            EXPECT_EQ(got.token, want.token) << what;
            if (residual && want.accepted < gamma && got.accepted == want.accepted) {
              // The residual written over q's rejected row.
              const std::vector<float> qg = q.to_host();
              const size_t off = static_cast<size_t>(want.accepted) * n;
              double err = 0.0;
              for (int i = 0; i < n; ++i)
                err = std::max(err, double(std::fabs(qg[off + i] - qwant[off + i])));
              EXPECT_LT(err, 1e-6) << what;
            }
          }
        }
      }
    }
  }
  std::printf("[ speculative ] %d verdicts, %d with a rejection: GPU == host\n", verdicts,
              rejections);
  EXPECT_GT(rejections, verdicts / 4);
  EXPECT_LT(rejections, verdicts);
}

}  // namespace
}  // namespace qs::testing
