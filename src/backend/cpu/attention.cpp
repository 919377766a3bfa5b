// Causal multi-query-position attention over a KvView (GQA), f32 softmax as HF's eager path.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/simd.h"
#include "core/error.h"

namespace qs {

void CpuBackend::attention(const float* q, int m, int pos, const AttentionShape& shape,
                           const KvView& kv, float* out) {
  const int hd = shape.head_dim;
  QS_CHECK(shape.num_kv_heads > 0 && shape.num_heads % shape.num_kv_heads == 0);
  QS_CHECK_MSG(kv.length >= pos + m, "attention: the KV view does not cover the queries");
  const int group = shape.num_heads / shape.num_kv_heads;
  const int64_t q_row = static_cast<int64_t>(shape.num_heads) * hd;

  // A task is one query row and a run of query heads sharing one kv head, so each K/V row is
  // read once for all of them. Groups are split only when there would be too few tasks to keep
  // every thread busy (decode with few kv heads).
  const int64_t base_tasks = static_cast<int64_t>(m) * shape.num_kv_heads;
  const int64_t want_tasks = 2 * static_cast<int64_t>(num_threads());
  const int splits =
      static_cast<int>(std::clamp<int64_t>((want_tasks + base_tasks - 1) / base_tasks, 1, group));
  const int heads_per_task = (group + splits - 1) / splits;
  const int64_t tasks = base_tasks * splits;

  pool_.parallel_for(
      tasks,
      [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> scores;  // [heads_per_task, context] f32
        for (int64_t task = begin; task < end; ++task) {
          const int split = static_cast<int>(task % splits);
          const int kvh = static_cast<int>(task / splits % shape.num_kv_heads);
          const int i = static_cast<int>(task / splits / shape.num_kv_heads);
          const int h0 = kvh * group + split * heads_per_task;
          const int nh = std::min(heads_per_task, (kvh + 1) * group - h0);
          if (nh <= 0) continue;
          const int len = pos + i + 1;  // query i sees positions [0, pos + i]
          const int64_t kv_off = static_cast<int64_t>(kvh) * hd;
          if (scores.size() < static_cast<size_t>(nh) * len) scores.resize(size_t(nh) * len);

          for (int t = 0; t < len; ++t) {
            const float* k_row = kv.k + t * kv.row_stride + kv_off;
            for (int j = 0; j < nh; ++j) {
              const float* qh = q + i * q_row + static_cast<int64_t>(h0 + j) * hd;
              scores[size_t(j) * len + t] = cpu::dot_f32(qh, k_row, hd) * shape.scale;
            }
          }
          for (int j = 0; j < nh; ++j) {
            float* s = scores.data() + size_t(j) * len;
            const float mx = *std::max_element(s, s + len);
            float sum = 0.0f;
            for (int t = 0; t < len; ++t) {
              s[t] = std::exp(s[t] - mx);
              sum += s[t];
            }
            const float inv_sum = 1.0f / sum;
            for (int t = 0; t < len; ++t) s[t] *= inv_sum;
            float* oh = out + i * q_row + static_cast<int64_t>(h0 + j) * hd;
            std::fill(oh, oh + hd, 0.0f);
          }
          for (int t = 0; t < len; ++t) {
            const float* v_row = kv.v + t * kv.row_stride + kv_off;
            for (int j = 0; j < nh; ++j) {
              float* oh = out + i * q_row + static_cast<int64_t>(h0 + j) * hd;
              cpu::axpy_f32(scores[size_t(j) * len + t], v_row, oh, hd);
            }
          }
        }
      },
      std::min<int64_t>(tasks, static_cast<int64_t>(num_threads()) * 8));
}

}  // namespace qs
