// Causal multi-query-position attention over a KvView (GQA), f32 softmax as HF's eager path.
//
// A task takes the query vectors of one kv head (rows x query heads, up to kTaskQueries) and
// walks that head's keys and values in chunks of kChunk rows: each chunk's quantized codes are
// decoded (or its f16 rows converted) once into a per-thread scratch and read by every query of
// the task, so a verification block or a prefill chunk costs little more per row than a decoding
// step. No full-precision copy of the quantized history is ever made. Scores, softmax and the
// weighted sums come from attention_rows.h, whose arithmetic per query does not depend on the
// other queries of the call: a query's output is the same at m = 1 and inside any block.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/attention_rows.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/simd.h"
#include "core/dtype.h"
#include "core/error.h"
#include "quant/kv_quant.h"

namespace qs {

namespace {

constexpr int kTaskQueries = 16;  // query vectors per task
constexpr int kChunk = 64;        // rows decoded or converted at a time

// Per-thread scratch of the tasks (grown, never shrunk).
struct Scratch {
  std::vector<float> scores;    // [queries, max_len] score rows, then probabilities
  std::vector<float> qw;        // [queries, hd] a query times a key group's steps (even | odd)
  std::vector<float> qm;        // [queries] that query's dot with the group's (centred) mins
  std::vector<float> acc;       // [queries, hd] sum p * step * code (even | odd channels)
  std::vector<float> acc_min;   // [queries, value groups] sum p * (centred) min
  std::vector<float> key_meta;  // [2, hd] a key group's steps and mins
  std::vector<float> rows;      // [kChunk, hd] decoded codes or converted rows
  std::vector<float> vmeta;     // [2, kChunk * value groups] value steps, then centred mins
  std::vector<float> coef;      // [queries, kChunk] p * step of one value group
  std::vector<const float*> coef_ptr;  // [queries] axpy_rows_multi's coefficient rows
  std::vector<float*> acc_ptr;         // [queries] and its sums

  static void grow(std::vector<float>& v, size_t n) {
    if (v.size() < n) v.resize(n);
  }
};

// Rows [t0, t0 + n) of kv head `kv_off / hd` of full-precision K or V as f32: the rows in place
// (F32; *stride = the view's row stride) or their exact conversion into `scratch` (F16; *stride =
// hd). Every reader of the rows goes through here, so f16 rows give the same arithmetic as f32
// rows holding the same values.
const float* fp_rows(const KvView& kv, const void* base, int64_t kv_off, int hd, int t0, int n,
                     float* scratch, int64_t* stride) {
  const int64_t first = (t0 - kv.fp_base) * kv.row_stride + kv_off;
  if (kv.row_dtype == DType::F32) {
    *stride = kv.row_stride;
    return static_cast<const float*>(base) + first;
  }
  const uint16_t* src = static_cast<const uint16_t*>(base) + first;
  for (int r = 0; r < n; ++r) cpu::f16_to_f32_n(src + r * kv.row_stride, scratch + r * hd, hd);
  *stride = hd;
  return scratch;
}

// Asks for rows [t0, t0 + n) of kv head `kv_off / hd` of K or V ahead of their use: the rows of
// one head are a fraction of each cache row (2 x 256 bytes of 512 on a 2-kv-head model), a
// stride the hardware prefetcher follows late.
void prefetch_fp_rows(const KvView& kv, const void* base, int64_t kv_off, int hd, int t0, int n) {
  const int64_t elem = kv.row_elem_bytes();
  const char* first =
      static_cast<const char*>(base) + ((t0 - kv.fp_base) * kv.row_stride + kv_off) * elem;
  for (int r = 0; r < n; ++r) {
    const char* row = first + r * kv.row_stride * elem;
    for (int64_t b = 0; b < hd * elem; b += 64) __builtin_prefetch(row + b);
  }
}

// The query vectors of one task and the chunked passes over their kv head.
class AttentionTask {
 public:
  AttentionTask(const float* q, int pos, const AttentionShape& shape, const KvView& kv, float* out,
                int i0, int rows, int h0, int nh, int heads_stride, Scratch& sc)
      : q_(q),
        out_(out),
        pos_(pos),
        shape_(shape),
        kv_(kv),
        seg_(kv.quantized),
        i0_(i0),
        rows_(rows),
        h0_(h0),
        nh_(nh),
        hs_(heads_stride),
        hd_(shape.head_dim),
        kvh_(h0 / (shape.num_heads / shape.num_kv_heads)),
        max_len_(pos + i0 + rows),
        sc_(sc) {}

  void run() {
    const int nq = rows_ * hs_, hd = hd_;
    Scratch::grow(sc_.scores, size_t(nq) * max_len_);
    Scratch::grow(sc_.rows, size_t(kChunk) * hd);
    if (seg_ != nullptr) {
      vgroups_ = hd / seg_->value_group_size;
      Scratch::grow(sc_.qw, size_t(nq) * hd);
      Scratch::grow(sc_.qm, nq);
      Scratch::grow(sc_.acc, size_t(nq) * hd);
      Scratch::grow(sc_.acc_min, size_t(nq) * vgroups_);
      Scratch::grow(sc_.key_meta, size_t(2) * hd);
      Scratch::grow(sc_.vmeta, size_t(kChunk) * 2 * vgroups_);
      Scratch::grow(sc_.coef, size_t(nq) * kChunk);
    }
    if (sc_.coef_ptr.size() < size_t(nq)) {
      sc_.coef_ptr.resize(nq);
      sc_.acc_ptr.resize(nq);
    }
    if (bq(rows_ - 1) > 0) quantized_keys();
    fp_keys();
    for (int i = 0; i < rows_; ++i) {
      for (int j = 0; j < nh_; ++j) cpu::softmax_row(srow(i, j), len(i));
    }
    if (bq(rows_ - 1) > 0) quantized_values();
    for (int i = 0; i < rows_; ++i) {
      for (int j = 0; j < nh_; ++j) quantized_output(i, j);
    }
    fp_values();
  }

 private:
  // Row i of the task sees positions [0, len(i)), the first bq(i) through the quantized view.
  int len(int i) const { return pos_ + i0_ + i + 1; }
  int bq(int i) const { return seg_ ? quant_boundary(pos_ + i0_ + i, seg_->group_size) : 0; }
  int qi(int i, int j) const { return i * hs_ + j; }  // query index in the scratch
  float* srow(int i, int j) const { return sc_.scores.data() + size_t(qi(i, j)) * max_len_; }
  const float* qhead(int i, int j) const {
    return q_ + (i0_ + i) * row_elems() + static_cast<int64_t>(h0_ + j) * hd_;
  }
  float* ohead(int i, int j) const {
    return out_ + (i0_ + i) * row_elems() + static_cast<int64_t>(h0_ + j) * hd_;
  }
  int64_t row_elems() const { return static_cast<int64_t>(shape_.num_heads) * hd_; }
  float center() const { return seg_->int8 ? cpu::kCodeCenter8 : cpu::kCodeCenter4; }
  int64_t plane_row(int t) const { return (kvh_ * seg_->capacity + t) * (hd_ / 2); }

  // q.(code * step + min) = (q * step).code + q.min, one key group at a time, the codes of each
  // chunk decoded once for every query.
  void quantized_keys() {
    const int G = seg_->group_size, bq_max = bq(rows_ - 1);
    for (int t0 = 0; t0 < bq_max; t0 += G) {
      fold_queries(t0);
      const int t1 = std::min(t0 + G, bq_max);
      for (int c0 = t0; c0 < t1; c0 += kChunk) {
        const int n = std::min(kChunk, t1 - c0);
        decode_rows(seg_->key_upper, seg_->int8 ? seg_->key_lower : nullptr, c0, n);
        for (int i = 0; i < rows_; ++i) {
          const int nr = std::min(c0 + n, bq(i)) - c0;
          for (int j = 0; j < nh_ && nr > 0; ++j) {
            float* s = srow(i, j) + c0;
            cpu::dot_rows(sc_.qw.data() + size_t(qi(i, j)) * hd_, sc_.rows.data(), hd_, hd_, nr, s);
            const float qm = sc_.qm[qi(i, j)];
            for (int r = 0; r < nr; ++r) s[r] = (s[r] + qm) * shape_.scale;
          }
        }
      }
    }
  }

  // The key group at t0's steps and (centred) mins, and every query that reads the group scaled
  // by them (even channels, then odd: the layout of decode_rows).
  void fold_queries(int t0) {
    const int hd = hd_, half = hd / 2;
    const int64_t meta = (kvh_ * (seg_->capacity / seg_->group_size) + t0 / seg_->group_size) * hd;
    float* step = sc_.key_meta.data();
    float* kmin = step + hd;
    cpu::f16_to_f32_n(seg_->key_scale + meta, step, hd);
    cpu::f16_to_f32_n(seg_->key_min + meta, kmin, hd);
    const float step_mul = seg_->int8 ? 0.0625f : 1.0f, c = center();
    for (int d = 0; d < hd; ++d) {
      step[d] *= step_mul;
      kmin[d] += c * step[d];
    }
    for (int i = 0; i < rows_; ++i) {
      if (bq(i) <= t0) continue;
      for (int j = 0; j < nh_; ++j) {
        const float* qv = qhead(i, j);
        float* w = sc_.qw.data() + size_t(qi(i, j)) * hd;
        for (int c = 0; c < half; ++c) {
          w[c] = qv[2 * c] * step[2 * c];
          w[half + c] = qv[2 * c + 1] * step[2 * c + 1];
        }
        float dot_min = 0.0f;
        for (int d = 0; d < hd; ++d) dot_min += qv[d] * kmin[d];
        sc_.qm[qi(i, j)] = dot_min;
      }
    }
  }

  // Rows [t0, t0 + n) of a code plane pair as centred f32 codes, [even | odd] channels per row.
  void decode_rows(const uint8_t* upper, const uint8_t* lower, int t0, int n) {
    const int half = hd_ / 2;
    for (int r = 0; r < n; ++r) {
      const int64_t at = plane_row(t0 + r);
      float* row = sc_.rows.data() + size_t(r) * hd_;
      cpu::decode_code_row(upper + at, lower ? lower + at : nullptr, half, row, row + half);
    }
  }

  // Scores of the full-precision rows: row i reads [bq(i), len(i)).
  void fp_keys() {
    for_each_fp_span(kv_.k, [&](int i, const float* rows, int64_t stride, int a, int n) {
      for (int j = 0; j < nh_; ++j) {
        float* s = srow(i, j) + a;
        cpu::dot_rows(qhead(i, j), rows, stride, hd_, n, s);
        for (int r = 0; r < n; ++r) s[r] *= shape_.scale;
      }
    });
  }

  // The full-precision rows of K or V (base) a chunk at a time (the next one prefetched), each
  // chunk handed to fn(i, rows, stride, a, n) for every query row i whose queries read part of
  // it: its rows [a, a + n) at `rows`.
  template <class Fn>
  void for_each_fp_span(const void* base, const Fn& fn) {
    const int64_t kv_off = static_cast<int64_t>(kvh_) * hd_;
    for (int c0 = bq(0); c0 < max_len_; c0 += kChunk) {
      const int n = std::min(kChunk, max_len_ - c0);
      if (c0 + n < max_len_) {
        prefetch_fp_rows(kv_, base, kv_off, hd_, c0 + n, std::min(kChunk, max_len_ - c0 - n));
      }
      int64_t stride = 0;
      const float* rows = fp_rows(kv_, base, kv_off, hd_, c0, n, sc_.rows.data(), &stride);
      for (int i = 0; i < rows_; ++i) {
        const int a = std::max(c0, bq(i)), b = std::min(c0 + n, len(i));
        if (a < b) fn(i, rows + (a - c0) * stride, stride, a, b - a);
      }
    }
  }

  // sum_t p * (code * step + min) per value group = sum_t (p * step) * code + sum_t p * min
  // (centred codes and mins, simd.h), the even / odd channels apart (together when one group
  // spans the head). The queries of consecutive rows that read the same rows of a chunk share
  // its loads (axpy_rows_multi; each query's sums are those of its own axpy_rows).
  void quantized_values() {
    const int nq = rows_ * hs_, hd = hd_, bq_max = bq(rows_ - 1);
    std::fill(sc_.acc.begin(), sc_.acc.begin() + size_t(nq) * hd, 0.0f);
    std::fill(sc_.acc_min.begin(), sc_.acc_min.begin() + size_t(nq) * vgroups_, 0.0f);
    for (int c0 = 0; c0 < bq_max; c0 += kChunk) {
      const int n = std::min(kChunk, bq_max - c0);
      decode_rows(seg_->value_upper, seg_->int8 ? seg_->value_lower : nullptr, c0, n);
      value_meta(c0, n);
      for (int i0 = 0; i0 < rows_;) {
        const int nr = std::min(c0 + n, bq(i0)) - c0;
        int i1 = i0 + 1;
        while (i1 < rows_ && std::min(c0 + n, bq(i1)) - c0 == nr) ++i1;
        if (nr > 0) chunk_values(c0, i0, i1, nr);
        i0 = i1;
      }
    }
  }

  // The decoded chunk at c0's first nr rows into the sums of every query of rows [i0, i1).
  void chunk_values(int c0, int i0, int i1, int nr) {
    const int hd = hd_, half = hd / 2, gh = seg_->value_group_size / 2, nqr = (i1 - i0) * nh_;
    for (int g = 0; g < vgroups_; ++g) {
      const float* steps = sc_.vmeta.data() + g;
      const float* mids = steps + kChunk * vgroups_;
      for (int i = i0, k = 0; i < i1; ++i) {
        for (int j = 0; j < nh_; ++j, ++k) {
          const float* p = srow(i, j) + c0;
          float* coef = sc_.coef.data() + size_t(k) * kChunk;
          float* am = sc_.acc_min.data() + size_t(qi(i, j)) * vgroups_;
          float sum_min = am[g];
          for (int r = 0; r < nr; ++r) {
            coef[r] = p[r] * steps[r * vgroups_];
            sum_min += p[r] * mids[r * vgroups_];
          }
          am[g] = sum_min;
          sc_.coef_ptr[k] = coef;
          sc_.acc_ptr[k] = sc_.acc.data() + size_t(qi(i, j)) * hd + g * gh;
        }
      }
      const float* rows = sc_.rows.data() + g * gh;
      if (vgroups_ == 1) {  // even | odd channels of the whole head, one coefficient per row
        cpu::axpy_rows_multi(sc_.coef_ptr.data(), rows, hd, nr, sc_.acc_ptr.data(), hd, nqr);
        continue;
      }
      cpu::axpy_rows_multi(sc_.coef_ptr.data(), rows, hd, nr, sc_.acc_ptr.data(), gh, nqr);
      for (int k = 0; k < nqr; ++k) sc_.acc_ptr[k] += half;
      cpu::axpy_rows_multi(sc_.coef_ptr.data(), rows + half, hd, nr, sc_.acc_ptr.data(), gh, nqr);
    }
  }

  // Rows [t0, t0 + n)'s value steps and centred mins (min + center * step), [r][g] each.
  void value_meta(int t0, int n) {
    const int64_t first = (kvh_ * seg_->capacity + t0) * vgroups_;
    const int count = n * vgroups_;
    float* steps = sc_.vmeta.data();
    float* mids = steps + kChunk * vgroups_;
    cpu::f16_to_f32_n(seg_->value_scale + first, steps, count);
    cpu::f16_to_f32_n(seg_->value_min + first, mids, count);
    const float step_mul = seg_->int8 ? 0.0625f : 1.0f, c = center();
    for (int i = 0; i < count; ++i) {
      steps[i] *= step_mul;
      mids[i] += c * steps[i];
    }
  }

  // The output of query (i, j) before the full-precision rows: the quantized sums, or zeros.
  void quantized_output(int i, int j) {
    float* oh = ohead(i, j);
    if (bq(i) == 0) {
      std::fill(oh, oh + hd_, 0.0f);
      return;
    }
    const int half = hd_ / 2, gv = seg_->value_group_size;
    const float* a = sc_.acc.data() + size_t(qi(i, j)) * hd_;
    const float* am = sc_.acc_min.data() + size_t(qi(i, j)) * vgroups_;
    for (int c = 0; c < half; ++c) {
      oh[2 * c] = a[c] + am[(2 * c) / gv];
      oh[2 * c + 1] = a[half + c] + am[(2 * c + 1) / gv];
    }
  }

  // The full-precision rows' p-weighted sum, added to the outputs.
  void fp_values() {
    for_each_fp_span(kv_.v, [&](int i, const float* rows, int64_t stride, int a, int n) {
      for (int j = 0; j < nh_; ++j) {
        sc_.coef_ptr[j] = srow(i, j) + a;
        sc_.acc_ptr[j] = ohead(i, j);
      }
      cpu::axpy_rows_multi(sc_.coef_ptr.data(), rows, stride, n, sc_.acc_ptr.data(), hd_, nh_);
    });
  }

  const float* q_;
  float* out_;
  int pos_;
  const AttentionShape& shape_;
  const KvView& kv_;
  const QuantizedKvSegment* seg_;
  int i0_, rows_, h0_, nh_, hs_, hd_, kvh_, max_len_;
  int vgroups_ = 1;
  Scratch& sc_;
};

// A sparse-KV draft: per (query, query head), the selected positions of its kv head, then the
// dense tail [dense_from, t], gathered kChunk rows at a time into the scratch; the same row
// kernels as the dense path.
void sparse_attention(ThreadPool& pool_, const float* q, int m, int pos,
                      const AttentionShape& shape, const KvView& kv, float* out) {
  const KvSelection& sel = *kv.selection;
  const int hd = shape.head_dim;
  QS_CHECK_MSG(kv.quantized == nullptr, "attention: a KV selection over a quantized history");
  QS_CHECK(sel.count >= 0 && sel.dense_from >= kv.fp_base && sel.dense_from <= pos);
  const int group = shape.num_heads / shape.num_kv_heads;
  const int64_t q_row = static_cast<int64_t>(shape.num_heads) * hd;
  const int64_t tasks = static_cast<int64_t>(m) * shape.num_heads;
  pool_.parallel_for(tasks, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;  // [count + pos + m - dense_from] softmax row
    thread_local std::vector<float> rows;    // [kChunk, hd] gathered rows
    Scratch::grow(rows, size_t(kChunk) * hd);
    for (int64_t task = begin; task < end; ++task) {
      const int i = static_cast<int>(task / shape.num_heads);
      const int h = static_cast<int>(task % shape.num_heads);
      const int kvh = h / group;
      const int t_end = pos + i + 1;
      const int32_t* sp = sel.positions + static_cast<int64_t>(kvh) * sel.count;
      const int n = sel.count + (t_end - sel.dense_from);
      Scratch::grow(scores, n);
      const float* qh = q + i * q_row + static_cast<int64_t>(h) * hd;
      float* oh = out + i * q_row + static_cast<int64_t>(h) * hd;
      const int64_t kv_off = static_cast<int64_t>(kvh) * hd;
      auto position = [&](int j) { return j < sel.count ? sp[j] : sel.dense_from + j - sel.count; };
      auto gather = [&](const void* base, int j0, int nr) {
        for (int r = 0; r < nr; ++r) {
          int64_t stride = 0;
          const float* row =
              fp_rows(kv, base, kv_off, hd, position(j0 + r), 1, rows.data() + r * hd, &stride);
          if (row != rows.data() + r * hd) std::copy(row, row + hd, rows.data() + r * hd);
        }
      };
      for (int j0 = 0; j0 < n; j0 += kChunk) {
        const int nr = std::min(kChunk, n - j0);
        gather(kv.k, j0, nr);
        cpu::dot_rows(qh, rows.data(), hd, hd, nr, scores.data() + j0);
        for (int r = 0; r < nr; ++r) scores[j0 + r] *= shape.scale;
      }
      cpu::softmax_row(scores.data(), n);
      std::fill(oh, oh + hd, 0.0f);
      for (int j0 = 0; j0 < n; j0 += kChunk) {
        const int nr = std::min(kChunk, n - j0);
        gather(kv.v, j0, nr);
        cpu::axpy_rows(scores.data() + j0, rows.data(), hd, nr, oh, hd);
      }
    }
  });
  if (kv.read_bytes) {
    const int64_t rows = sel.count + (pos + m - sel.dense_from);
    kv.read_bytes->fp +=
        static_cast<int64_t>(shape.num_kv_heads) * 2 * rows * hd * kv.row_elem_bytes();
  }
}

// What the call streams, per kv head: the last (longest) query's reads, counted once.
void count_reads(int m, int pos, const AttentionShape& shape, const KvView& kv) {
  const QuantizedKvSegment* seg = kv.quantized;
  const int hd = shape.head_dim;
  const int64_t t_last = pos + m - 1;
  const int64_t bq = seg ? quant_boundary(static_cast<int>(t_last), seg->group_size) : 0;
  const int64_t heads = shape.num_kv_heads;
  KvReadBytes& rb = *kv.read_bytes;
  if (seg) {
    const int64_t codes = heads * 2 * bq * (hd / 2);  // K and V rows of one plane
    rb.upper += codes;
    if (seg->int8) rb.lower += codes;
    const int64_t key_groups = (bq + seg->group_size - 1) / seg->group_size;
    rb.meta += heads * (key_groups * 2 * 2 * hd + bq * 2 * 2 * (hd / seg->value_group_size));
  }
  rb.fp += heads * 2 * (t_last + 1 - bq) * hd * kv.row_elem_bytes();
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
  QS_CHECK_MSG((qseg ? quant_boundary(pos, G) : 0) >= kv.fp_base,
               "attention: full-precision rows start after the quantization boundary");
  if (qseg) {
    QS_CHECK(G > 0 && qseg->value_group_size > 0 && hd % qseg->value_group_size == 0);
    QS_CHECK(hd % 2 == 0 && qseg->value_group_size % 2 == 0);
    QS_CHECK(quant_boundary(pos + m - 1, G) <= qseg->capacity);
  }
  // A task: a block of query rows x a run of the query heads of one kv head. Heads are split
  // only when there would be fewer tasks than threads (decoding with few kv heads).
  const int group = shape.num_heads / shape.num_kv_heads;
  const int rows_per_task = std::clamp(kTaskQueries / group, 1, m);
  const int row_blocks = (m + rows_per_task - 1) / rows_per_task;
  const int64_t base_tasks = static_cast<int64_t>(row_blocks) * shape.num_kv_heads;
  const int splits = static_cast<int>(
      std::clamp<int64_t>((num_threads() + base_tasks - 1) / base_tasks, 1, group));
  const int heads_per_task = (group + splits - 1) / splits;
  const int64_t tasks = base_tasks * splits;

  pool_.parallel_for(
      tasks,
      [&](int64_t begin, int64_t end) {
        thread_local Scratch scratch;
        for (int64_t task = begin; task < end; ++task) {
          const int split = static_cast<int>(task % splits);
          const int kvh = static_cast<int>(task / splits % shape.num_kv_heads);
          const int i0 = static_cast<int>(task / splits / shape.num_kv_heads) * rows_per_task;
          const int h0 = kvh * group + split * heads_per_task;
          const int nh = std::min(heads_per_task, (kvh + 1) * group - h0);
          if (nh <= 0) continue;
          AttentionTask(q, pos, shape, kv, out, i0, std::min(rows_per_task, m - i0), h0, nh,
                        heads_per_task, scratch)
              .run();
        }
      },
      std::min<int64_t>(tasks, static_cast<int64_t>(num_threads()) * 8));

  if (kv.read_bytes) count_reads(m, pos, shape, kv);
}

}  // namespace qs
