// Causal multi-query-position attention over a KvView (GQA), f32 softmax as HF's eager path.
// The quantized history, when present, is dequantized a block of rows at a time into a small
// per-thread scratch: no full-precision copy of the history is ever made.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/simd.h"
#include "core/dtype.h"
#include "core/error.h"
#include "quant/kv_quant.h"

namespace qs {

namespace {

// Query rows up to which one task serves all queries of a call (shares dequantized blocks).
constexpr int kShareQueries = 16;

// Elements [offset, offset + n) of full-precision K or V rows as f32: the rows themselves (F32),
// or their exact conversion into `scratch` (F16; n floats). Every reader of the rows goes through
// here, so f16 rows give the same arithmetic as f32 rows holding the same values.
inline const float* fp_row(const void* rows, DType type, int64_t offset, int n, float* scratch) {
  if (type == DType::F32) return static_cast<const float*>(rows) + offset;
  to_f32(DType::F16, static_cast<const uint16_t*>(rows) + offset, scratch, static_cast<size_t>(n));
  return scratch;
}

// A sparse-KV draft: per (query, query head), the selected positions of its kv head, then the
// dense tail [dense_from, t]; the same f32 dot / softmax / axpy as the dense path.
void sparse_attention(ThreadPool& pool_, const float* q, int m, int pos, const AttentionShape& shape,
                      const KvView& kv, float* out) {
  const KvSelection& sel = *kv.selection;
  const int hd = shape.head_dim;
  QS_CHECK_MSG(kv.quantized == nullptr, "attention: a KV selection over a quantized history");
  QS_CHECK(sel.count >= 0 && sel.dense_from >= kv.fp_base && sel.dense_from <= pos);
  const int group = shape.num_heads / shape.num_kv_heads;
  const int64_t q_row = static_cast<int64_t>(shape.num_heads) * hd;
  const int64_t tasks = static_cast<int64_t>(m) * shape.num_heads;
  QS_CHECK_MSG(kv_row_dtype_supported(kv.row_dtype), "attention: KV rows are F32 or F16");
  pool_.parallel_for(tasks, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;  // [count + pos + m - dense_from] softmax row
    thread_local std::vector<float> row;     // [hd] an f16 row as f32
    if (row.size() < static_cast<size_t>(hd)) row.resize(static_cast<size_t>(hd));
    for (int64_t task = begin; task < end; ++task) {
      const int i = static_cast<int>(task / shape.num_heads);
      const int h = static_cast<int>(task % shape.num_heads);
      const int kvh = h / group;
      const int t_end = pos + i + 1;
      const int32_t* sp = sel.positions + static_cast<int64_t>(kvh) * sel.count;
      const int n = sel.count + (t_end - sel.dense_from);
      if (scores.size() < static_cast<size_t>(n)) scores.resize(static_cast<size_t>(n));
      const float* qh = q + i * q_row + static_cast<int64_t>(h) * hd;
      float* oh = out + i * q_row + static_cast<int64_t>(h) * hd;
      const int64_t kv_off = static_cast<int64_t>(kvh) * hd;
      auto position = [&](int j) { return j < sel.count ? sp[j] : sel.dense_from + j - sel.count; };
      for (int j = 0; j < n; ++j) {
        const float* k_row =
            fp_row(kv.k, kv.row_dtype, (position(j) - kv.fp_base) * kv.row_stride + kv_off, hd,
                   row.data());
        scores[j] = cpu::dot_f32(qh, k_row, hd) * shape.scale;
      }
      const float mx = *std::max_element(scores.begin(), scores.begin() + n);
      float sum = 0.0f;
      for (int j = 0; j < n; ++j) {
        scores[j] = std::exp(scores[j] - mx);
        sum += scores[j];
      }
      const float inv_sum = 1.0f / sum;
      std::fill(oh, oh + hd, 0.0f);
      for (int j = 0; j < n; ++j) {
        const float* v_row =
            fp_row(kv.v, kv.row_dtype, (position(j) - kv.fp_base) * kv.row_stride + kv_off, hd,
                   row.data());
        cpu::axpy_f32(scores[j] * inv_sum, v_row, oh, hd);
      }
    }
  });
  if (kv.read_bytes) {
    const int64_t rows = sel.count + (pos + m - sel.dense_from);
    kv.read_bytes->fp +=
        static_cast<int64_t>(shape.num_kv_heads) * 2 * rows * hd * kv.row_elem_bytes();
  }
}

}  // namespace

void CpuBackend::attention(const float* q, int m, int pos, const AttentionShape& shape,
                           const KvView& kv, float* out) {
  const int hd = shape.head_dim;
  QS_CHECK(shape.num_kv_heads > 0 && shape.num_heads % shape.num_kv_heads == 0);
  QS_CHECK_MSG(kv.length >= pos + m, "attention: the KV view does not cover the queries");
  QS_CHECK_MSG(kv_row_dtype_supported(kv.row_dtype), "attention: KV rows are F32 or F16");
  if (kv.selection) {
    sparse_attention(pool_, q, m, pos, shape, kv, out);
    return;
  }
  const QuantizedKvSegment* qseg = kv.quantized;
  const int G = qseg ? qseg->group_size : 0;
  auto boundary = [&](int t) { return qseg ? quant_boundary(t, G) : 0; };
  QS_CHECK_MSG(boundary(pos) >= kv.fp_base,
               "attention: full-precision rows start after the quantization boundary");
  if (qseg) {
    QS_CHECK(G > 0 && qseg->value_group_size > 0 && hd % qseg->value_group_size == 0);
    QS_CHECK(boundary(pos + m - 1) <= qseg->capacity);
  }
  const int group = shape.num_heads / shape.num_kv_heads;
  const int64_t q_row = static_cast<int64_t>(shape.num_heads) * hd;

  // A task is a run of query heads sharing one kv head, over one query row or, when the rows
  // read a quantized history and are few (a verification block, a decode step), over all of
  // them: each K/V row (and each dequantized block) is then read once for every query of the
  // task. Per query the arithmetic is the same either way (same order of every sum), so a
  // query's output does not depend on how many queries share its call. Groups are split only
  // when there would be too few tasks to keep every thread busy (decode with few kv heads).
  const bool share_rows = qseg != nullptr && m <= kShareQueries;
  const int rows_per_task = share_rows ? m : 1;
  const int64_t base_tasks = static_cast<int64_t>(m / rows_per_task) * shape.num_kv_heads;
  const int64_t want_tasks = 2 * static_cast<int64_t>(num_threads());
  const int splits =
      static_cast<int>(std::clamp<int64_t>((want_tasks + base_tasks - 1) / base_tasks, 1, group));
  const int heads_per_task = (group + splits - 1) / splits;
  const int64_t tasks = base_tasks * splits;
  const int max_len = pos + m;

  const int half = hd / 2;
  const int gv = qseg ? qseg->value_group_size : hd;
  const int vgroups = hd / gv;

  pool_.parallel_for(
      tasks,
      [&](int64_t begin, int64_t end) {
        // [rows_per_task, heads_per_task, max_len] f32 softmax rows.
        thread_local std::vector<float> scores;
        // Quantized history, per (query, head) of the task: the query scaled by a key group's
        // steps, even channels then odd ([hd]), its dot with the group's mins, and the value
        // accumulators: even / odd channels of sum p*s*code ([hd]) and sum p*min per value group.
        thread_local std::vector<float> qw, qm, acc, acc_min;
        thread_local std::vector<float> key_meta;  // [2, hd] a key group's step and min (f32)
        thread_local std::vector<float> row;       // [hd] an f16 full-precision row as f32
        if (row.size() < static_cast<size_t>(hd)) row.resize(static_cast<size_t>(hd));
        const size_t qh_count = size_t(rows_per_task) * heads_per_task;
        const size_t need = qh_count * max_len;
        if (scores.size() < need) scores.resize(need);
        if (qseg) {
          if (qw.size() < qh_count * hd) qw.resize(qh_count * hd);
          if (acc.size() < qh_count * hd) acc.resize(qh_count * hd);
          if (qm.size() < qh_count) qm.resize(qh_count);
          if (acc_min.size() < qh_count * vgroups) acc_min.resize(qh_count * vgroups);
          if (key_meta.size() < size_t(2) * hd) key_meta.resize(size_t(2) * hd);
        }
        for (int64_t task = begin; task < end; ++task) {
          const int split = static_cast<int>(task % splits);
          const int kvh = static_cast<int>(task / splits % shape.num_kv_heads);
          const int i0 = static_cast<int>(task / splits / shape.num_kv_heads) * rows_per_task;
          const int h0 = kvh * group + split * heads_per_task;
          const int nh = std::min(heads_per_task, (kvh + 1) * group - h0);
          if (nh <= 0) continue;
          const int64_t kv_off = static_cast<int64_t>(kvh) * hd;
          // Query i (of this task) sees positions [0, pos + i0 + i], the first bq(i) quantized.
          auto len_of = [&](int i) { return pos + i0 + i + 1; };
          auto bq_of = [&](int i) { return boundary(pos + i0 + i); };
          auto srow = [&](int i, int j) {
            return scores.data() + (size_t(i) * heads_per_task + j) * max_len;
          };
          auto qhead = [&](int i, int j) {
            return q + (i0 + i) * q_row + static_cast<int64_t>(h0 + j) * hd;
          };
          auto ohead = [&](int i, int j) {
            return out + (i0 + i) * q_row + static_cast<int64_t>(h0 + j) * hd;
          };
          const int bq_max = bq_of(rows_per_task - 1);

          // Keys of the quantized history, one key group at a time:
          // q.(code*step + min) = (q*step).code + q.min, codes read from the planes.
          for (int t0 = 0; t0 < bq_max; t0 += G) {
            const int64_t meta = (kvh * (qseg->capacity / G) + t0 / G) * hd;
            float* step = key_meta.data();
            float* kmin = step + hd;
            // Codes come centred (simd.h): the min moves to the middle of the range.
            const float center = qseg->int8 ? cpu::kCodeCenter8 : cpu::kCodeCenter4;
            for (int d = 0; d < hd; ++d) {
              const float sc = f16_to_f32(qseg->key_scale[meta + d]);
              step[d] = qseg->int8 ? sc * 0.0625f : sc;
              kmin[d] = f16_to_f32(qseg->key_min[meta + d]) + center * step[d];
            }
            for (int i = 0; i < rows_per_task; ++i) {
              if (bq_of(i) <= t0) continue;
              for (int j = 0; j < nh; ++j) {
                const float* qv = qhead(i, j);
                float* w = qw.data() + (size_t(i) * heads_per_task + j) * hd;
                float dot_min = 0.0f;
                for (int c = 0; c < half; ++c) {
                  w[c] = qv[2 * c] * step[2 * c];
                  w[half + c] = qv[2 * c + 1] * step[2 * c + 1];
                }
                for (int d = 0; d < hd; ++d) dot_min += qv[d] * kmin[d];
                qm[size_t(i) * heads_per_task + j] = dot_min;
              }
            }
            for (int t = t0; t < std::min(t0 + G, bq_max); ++t) {
              const int64_t codes = (kvh * qseg->capacity + t) * half;
              const uint8_t* up = qseg->key_upper + codes;
              const uint8_t* lo = qseg->int8 ? qseg->key_lower + codes : nullptr;
              for (int i = 0; i < rows_per_task; ++i) {
                if (t >= bq_of(i)) continue;
                for (int j = 0; j < nh; ++j) {
                  const size_t k = size_t(i) * heads_per_task + j;
                  const float* w = qw.data() + k * hd;
                  srow(i, j)[t] = (cpu::dot_codes(up, lo, w, w + half, half) + qm[k]) * shape.scale;
                }
              }
            }
          }
          for (int i = 0; i < rows_per_task; ++i) {
            for (int t = bq_of(i); t < len_of(i); ++t) {
              const float* k_row = fp_row(
                  kv.k, kv.row_dtype, (t - kv.fp_base) * kv.row_stride + kv_off, hd, row.data());
              for (int j = 0; j < nh; ++j) {
                srow(i, j)[t] = cpu::dot_f32(qhead(i, j), k_row, hd) * shape.scale;
              }
            }
            for (int j = 0; j < nh; ++j) {
              const int len = len_of(i);
              float* sr = srow(i, j);
              const float mx = *std::max_element(sr, sr + len);
              float sum = 0.0f;
              for (int t = 0; t < len; ++t) {
                sr[t] = std::exp(sr[t] - mx);
                sum += sr[t];
              }
              const float inv_sum = 1.0f / sum;
              for (int t = 0; t < len; ++t) sr[t] *= inv_sum;
            }
          }

          // Values of the quantized history: sum_t p*(code*s + min) per value group
          // = sum_t (p*s)*code + sum_t p*min (centred codes and mins, simd.h), accumulated even /
          // odd channels apart.
          if (bq_max > 0) {
            std::fill(acc.begin(), acc.begin() + qh_count * hd, 0.0f);
            std::fill(acc_min.begin(), acc_min.begin() + qh_count * vgroups, 0.0f);
          }
          for (int t = 0; t < bq_max; ++t) {
            const int64_t codes = (kvh * qseg->capacity + t) * half;
            const int64_t meta = (kvh * qseg->capacity + t) * vgroups;
            const uint8_t* up = qseg->value_upper + codes;
            const uint8_t* lo = qseg->int8 ? qseg->value_lower + codes : nullptr;
            for (int g = 0; g < vgroups; ++g) {
              const float sc = f16_to_f32(qseg->value_scale[meta + g]);
              const float vs = qseg->int8 ? sc * 0.0625f : sc;
              const float vmin = f16_to_f32(qseg->value_min[meta + g]) +
                                 (qseg->int8 ? cpu::kCodeCenter8 : cpu::kCodeCenter4) * vs;
              const int c0 = g * gv / 2;
              for (int i = 0; i < rows_per_task; ++i) {
                if (t >= bq_of(i)) continue;
                for (int j = 0; j < nh; ++j) {
                  const size_t k = size_t(i) * heads_per_task + j;
                  const float p = srow(i, j)[t];
                  float* a = acc.data() + k * hd;
                  cpu::axpy_codes(p * vs, up + c0, lo ? lo + c0 : nullptr, a + c0, a + half + c0,
                                  gv / 2);
                  acc_min[k * vgroups + g] += p * vmin;
                }
              }
            }
          }
          for (int i = 0; i < rows_per_task; ++i) {
            const bool quantized = bq_of(i) > 0;
            for (int j = 0; j < nh; ++j) {
              float* oh = ohead(i, j);
              if (!quantized) {
                std::fill(oh, oh + hd, 0.0f);
                continue;
              }
              const size_t k = size_t(i) * heads_per_task + j;
              const float* a = acc.data() + k * hd;
              for (int c = 0; c < half; ++c) {
                oh[2 * c] = a[c] + acc_min[k * vgroups + (2 * c) / gv];
                oh[2 * c + 1] = a[half + c] + acc_min[k * vgroups + (2 * c + 1) / gv];
              }
            }
            for (int t = bq_of(i); t < len_of(i); ++t) {
              const float* v_row = fp_row(
                  kv.v, kv.row_dtype, (t - kv.fp_base) * kv.row_stride + kv_off, hd, row.data());
              for (int j = 0; j < nh; ++j) cpu::axpy_f32(srow(i, j)[t], v_row, ohead(i, j), hd);
            }
          }
        }
      },
      std::min<int64_t>(tasks, static_cast<int64_t>(num_threads()) * 8));

  if (kv.read_bytes) {
    // What the last (longest) query streams, per kv head: the reads above, counted once.
    const int64_t t_last = pos + m - 1;
    const int64_t bq = boundary(static_cast<int>(t_last));
    const int64_t heads = shape.num_kv_heads;
    KvReadBytes& rb = *kv.read_bytes;
    if (qseg) {
      const int64_t codes = heads * 2 * bq * (hd / 2);  // K and V rows of one plane
      rb.upper += codes;
      if (qseg->int8) rb.lower += codes;
      const int64_t key_groups = (bq + G - 1) / G;
      rb.meta += heads * (key_groups * 2 * 2 * hd + bq * 2 * 2 * (hd / qseg->value_group_size));
    }
    rb.fp += heads * 2 * (t_last + 1 - bq) * hd * kv.row_elem_bytes();
  }
}

}  // namespace qs
