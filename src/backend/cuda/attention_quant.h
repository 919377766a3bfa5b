// Attention over the hierarchical quantized KV cache (DESIGN.md §2-3, docs/kv-format.md) on
// CUDA: fused split-KV flash-decoding for m <= 16 query rows (a draft step, a verification
// block). Internal to the CUDA backend: CudaBackend::attention calls it for a KvView with a
// quantized segment; docs/cuda.md ("Quantized-KV attention") describes the kernels.
//
// Semantics are backend.h's (the CPU reference, backend/cpu/attention.cpp): query i at
// t = pos + i reads positions [0, b(t)) through the quantized view (INT8: both planes; INT4
// draft view: the upper plane only, no lower-plane byte is ever touched) and [b(t), t] from the
// full-precision rows (f32 or f16, converted to f32 on load), b = quant_boundary(t, G).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/cuda_ops.h"

namespace qs::cuda {

// One call of at most kQuantAttentionMaxRows query rows, as the kernels see it (device
// pointers). Query vector qv of kv head h is (row qv / group, head h * group + qv % group).
struct QuantAttentionArgs {
  const float* q = nullptr;  // [m, num_heads * head_dim] f32
  float* out = nullptr;      // [m, num_heads * head_dim] f32
  const void* k = nullptr;   // full-precision rows: row r = position fp_base + r, post-RoPE
  const void* v = nullptr;
  DType kv_dtype = DType::F32;  // of k and v: F32 or F16
  int64_t row_stride = 0;       // elements between rows (multiple of 4)
  int fp_base = 0;         // <= every query's boundary
  QuantizedKvSegment seg;  // device pointers; key_lower / value_lower unused when !seg.int8
  int m = 0;
  int pos = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float scale_log2 = 0.0f;  // softmax scale * log2(e)
  bool exact_draft = false;  // the INT4 view with f16 hi + lo operands even when draft_f16 is on
  bool f16_int8 = false;     // the INT8 view with f16 operands alone even when int8_f16 is off
};

constexpr int kQuantAttentionMaxRows = 16;

// The args of queries [pos, pos + m) of a backend.h attention call (m <= 16) over a KvView with
// a quantized segment; checks the view (QS_CHECK: these are programming errors).
QuantAttentionArgs make_quant_attention_args(const float* q, int m, int pos,
                                             const AttentionShape& shape, const KvView& kv,
                                             float* out);

// Which query vectors the register-direct path's one-tile warp keeps in its 8 MMA columns
// (attention_quant_direct.cuh, DirectPath):
//  - kPairCols: up to 8, query j in column j; lane (r, c) computes columns 2c and 2c + 1;
//  - kEvenCols: up to 4, query j in column 2j (its B fragments folded by lanes r = 2j, 2j + 1,
//    so column 2j + 1 repeats it); each lane computes column 2c alone (a GQA draft step: 2..4
//    query heads per kv head, e.g. Llama-3.1-8B's 4);
//  - kOneCol: one, folded by the whole warp and repeated in every column; lanes compute column
//    2c alone and column 0 is stored (an MHA draft step).
// kEvenCols and kOneCol leave every odd column out of the scores, the softmax, the min terms and
// the rescale; each computed column's arithmetic is the 8-column loop's for the same query.
enum TileCols : int { kPairCols = 0, kEvenCols = 1, kOneCol = 2 };

// How one call is cut into blocks (chosen by plan_attention_quant; pure data). Grid: x = split,
// y = kv head, z = query group. Split x reads quantized positions [x * q_split_len, +q_split_len)
// and full-precision rows [b(pos) + x * fp_split_len, +fp_split_len) (either may be empty).
struct QuantAttentionPlan {
  bool tensor_cores = false;  // quantized part on mma.sync (head_dim 64/128, Gv % 32 == 0)
  bool direct = false;  // tensor cores, fragments loaded straight into registers (head_dim 128, Gv
                        // = head_dim): attention_quant_direct.cuh
  int direct_regs = 192;   // its register cap: 128, 168 or 192 (one tile per warp)
  int direct_tiles = 1;    // its 8-query MMA tiles per warp (several: the INT8 view, GQA)
  // The view's operands in f16 alone, one MMA per product (the INT4 view on the tensor-core
  // paths: tuning draft_f16; the INT8 view on the direct path: tuning int8_f16).
  bool f16_operands = false;
  bool draft_reg_prefetch = true;  // its register prefetch of the next sub-chunk (tuning)
  bool direct_ring = false;        // its sub-chunks through a per-warp cp.async ring (tuning)
  // Its tile's query columns (TileCols): kOneCol, the one-query kernel (one query vector per kv
  // head; tuning single_query); kEvenCols, the even-column kernel (<= 4; tuning even_columns).
  int tile_cols = kPairCols;
  int queries_per_warp = 8;   // query vectors per warp tile (8 * direct_tiles on the direct path)
  int query_tiles = 1;        // warp tiles per block (QT)
  int token_slices = 1;       // warps per query tile, each on its own part of the split (TS)
  int query_groups = 1;       // blocks along grid z (query tiles beyond one block)
  int splits = 1;             // blocks along grid x
  int fp_split_len = 1;
  int q_split_len = 0;  // a multiple of 32 * token_slices; 0 without a quantized history
  int threads = 32;
  size_t smem_bytes = 0;
  int64_t partial_floats = 0;  // scratch for the split partials (o, then (max, sum))
  int chunk = 1;   // 32-token sub-chunks per warp per pipeline stage (tensor-core path)
  int stages = 3;  // cp.async pipeline stages (tensor-core path)
  unsigned long long* timeline = nullptr;  // QuantAttentionTuning::timeline
};

QuantAttentionPlan plan_attention_quant(const QuantAttentionArgs& a, int num_sms);

// Runs the plan: the split kernel, then attention.cu's combine. partials: plan.partial_floats.
void launch_attention_quant(const QuantAttentionArgs& a, const QuantAttentionPlan& plan,
                            float* partials, cudaStream_t stream);

// Adds what an attention call over `kv` reads to kv.read_bytes exactly as the CPU backend
// counts it (the last query of the call, all kv heads). No-op without read_bytes.
void add_quant_attention_read_bytes(int m, int pos, const AttentionShape& shape, const KvView& kv);

// Defaults of the tuning below (one constant each to switch back to the previous kernel:
// chunk 1, stages 3).
// The register-direct tensor-core path where it applies (false: the cp.async ring everywhere).
constexpr bool kQuantAttentionDirect = true;
constexpr int kQuantAttentionDirectRegs = 0;
constexpr bool kQuantAttentionDraftF16 = true;
constexpr bool kQuantAttentionDraftRegPrefetch = false;
// 8-query MMA tiles per warp on the direct path's INT8 view (0: automatic, by query vectors per kv
// head; 1: one warp per 8 query vectors, the session-5 kernel).
constexpr int kQuantAttentionDirectTiles = 0;
constexpr int kQuantAttentionMaxDirectTiles = 2;
// The quantized history (positions) from which more than 16 query vectors per kv head take two
// tiles per warp (QuantAttentionTuning::long_history_two_tiles).
constexpr int kLongHistoryTwoTiles = 32768;
// The direct path's sub-chunks through a per-warp cp.async ring in shared memory (one tile per
// warp: the INT8 view and the f16-operand draft without register prefetch) instead of each
// sub-chunk's loads straight into registers just before use: 1 on, 0 off, -1 automatic = on
// where a block has one query tile (two warps) (bench_ops quantkv on the H200, session 12:
// Llama-2-7B verify m = 4 at 32K / 128K 107 -> 95 / 352 -> 314 us, Llama-3.1-8B draft at 128K
// 76.8 -> 69.3; Llama-3.1-8B verify m = 5, three tiles per block, 104 -> 113 with). The MHA draft
// joined in session 14 (at 192 registers, 4 blocks per SM: Llama-2-7B draft 4K / 32K / 128K 19.5
// / 59.6 / 191.2 us vs 21.2 / 63.4 / 193.1 without the ring at 168). Where the block's shared
// memory cannot hold the rings the launch goes without. Session 27: two tiles per warp too (one
// slot per warp refilled in key and value halves, the full-precision rows after the loop in the
// rings' memory: 42.7 KB per two-warp block, four blocks per SM): Llama-3.1-8B verify m = 4 at 4K
// / 32K / 128K 29.0 / 53.3 / 130.3 -> 28.0 / 50.7 / 126.8 us, Llama-2-7B m = 9 35.8 / 129.1 /
// 443.8 -> 35.1 / 121.0 / 425.4. The GQA draft keeps it although bench_ops times it slower there
// (Llama-3.1-8B 16.2 / 31.4 / 79.3 us with, 15.9 / 27.3 / 67.1 without): inside the decode graph
// the draft step ran 2.95 / 3.40 / 4.22 ms without it at 32K / 64K / 128K vs 2.93 / 3.26 / 3.92
// with (quantspec bench, 2048 tokens; docs/perf.md, Session 27).
constexpr int kQuantAttentionDirectRing = -1;
// The one-query form of the f16 draft's ring kernel (at 192 registers) where a call has one query
// vector per kv head (an MHA draft step): the loop leaves the tile's other query columns out and
// the whole warp folds the query with each key group (DirectPath::kOne; the 8-column loop's
// fragments, q . min summed in another order).
constexpr bool kQuantAttentionSingleQuery = true;
// The same loop for 2..4 query vectors per kv head (a GQA draft step: Llama-3.1-8B's 4 query heads
// per kv head), query j in the tile's column 2j (DirectPath's kEvenCols): each lane computes one
// column instead of two; every computed column's arithmetic is the 8-column loop's (the outputs
// are the same bits). H200, session 38: Llama-3.1-8B draft attention at 4K / 32K / 128K 15.9 /
// 30.5 / 77.5 -> 14.3 / 26.9 / 68.6 us (bench_ops quantkv), the draft step at 128K 3.656 -> 3.455
// ms (-5.5%, two rounds per arm).
constexpr bool kQuantAttentionEvenColumns = true;
// The even-column form of the INT8 view's one-tile ring kernel (up to 4 query vectors per kv head:
// AR INT8, an MHA verification of up to 4 rows, a GQA-4 AR INT8 step; the same bits). On since
// session 41: H200, Llama-3.1-8B at 128K, AR INT8 7.593 -> 7.490 ms/token (-1.36%, two rounds per
// arm; QuantSpec unchanged, its GQA verification takes the two-tile kernel); H100, session 38,
// Llama-2-7B at 128K, AR INT8 -0.6% and the verification -0.8% (one round per arm).
constexpr bool kQuantAttentionInt8EvenColumns = true;
constexpr int kQuantAttentionDefaultChunk = 1;
constexpr int kQuantAttentionDefaultStages = 3;
constexpr int kQuantAttentionMaxStages = 6;
constexpr int kQuantAttentionMaxChunk = 4;

// Process-wide switches for tests and benchmarks (every variant computes the same function).
struct QuantAttentionTuning {
  bool tensor_cores = true;  // false: the CUDA-core path for every head_dim
  int splits = 0;            // > 0: force the number of splits (clamped to the positions)
  int split_factor = 1;      // >= 1: the heuristic aims at this many waves of blocks (benchmarks)
  // > 0: 32-token sub-chunks per warp per pipeline stage (0: kQuantAttentionDefaultChunk).
  int chunk_subs = 0;
  // > 0: cp.async pipeline stages, 2..kQuantAttentionMaxStages (0: kQuantAttentionDefaultStages).
  int stages = 0;
  // The register-direct path for head_dim 128 / Gv = head_dim (kQuantAttentionDirect).
  bool direct = kQuantAttentionDirect;
  // Its register cap per thread: 168 (6 two-warp blocks per SM, a few spilled words) or 192 (4
  // blocks), and 128 for the f16-operand draft without register prefetch (8 blocks, spills; other
  // views then take the automatic cap); 0: 192 for a single query tile per block, 168 for more
  // (plan_attention_quant). For one 8-query tile per warp only: several (direct_tiles) always run
  // at 255. QS_DIRECT_REGS sets it for the whole process.
  int direct_regs = kQuantAttentionDirectRegs;
  // The draft (INT4) view on the tensor-core paths (register-direct and ring) with its operands
  // in f16 alone: one MMA per product instead of the f16 hi + lo pair that gives f32-level
  // accuracy (the folded query and the value weights rounded to f16, ~2^-12 relative, far below
  // the INT4 view's own error of up to s/2 per element). false: the draft view as exact as the
  // INT8 one. Default kQuantAttentionDraftF16.
  bool draft_f16 = kQuantAttentionDraftF16;
  // The f16-operand draft view on the direct path loads each sub-chunk just before use like the
  // INT8 view (false, the default since session 6: 36 fewer live registers, no spill at 168;
  // Llama-2-7B shape 32K 77.6 vs 85.6 us, Llama-3.1-8B 37.1 vs 38.1), or the next sub-chunk into
  // registers while the current one is computed (true). QS_DRAFT_REG_PREFETCH=0|1 sets it for the
  // whole process.
  bool draft_reg_prefetch = kQuantAttentionDraftRegPrefetch;
  // The direct path's INT8 view: 8-query MMA tiles per warp that share one unpacking of the codes
  // (1..kQuantAttentionMaxDirectTiles; 0: automatic). A GQA verification block has 4-8 query
  // heads x (gamma + 1) rows per kv head: with one tile per warp, every warp unpacks the same
  // codes. QS_DIRECT_TILES=0..2 sets it for the whole process.
  int direct_tiles = kQuantAttentionDirectTiles;
  // Automatic tiles (direct_tiles 0) for more than 16 query vectors per kv head (GQA 4 at
  // m >= 5, GQA 8 at m >= 3) over the INT8 view's history of >= kLongHistoryTwoTiles positions: two
  // tiles per warp with the per-warp ring (as for 9..16) instead of one tile per warp, whose
  // warps each unpack the same codes. H200, session 37 (bench_ops quantkv, Llama-3.1-8B
  // verification): 128K m = 5 / 7 / 9 227 / 298 / 403 -> 211 / 215 / 379 us; 32K 75 / 93 / 117
  // -> 75 / 77 / 120; at 4K slower (28 / 34 / 32 -> 36 / 34 / 36), so short histories keep one
  // tile. QS_GQA_TWO_TILES=0 turns it off for the whole process.
  bool long_history_two_tiles = true;
  // The direct path's per-warp cp.async ring (kQuantAttentionDirectRing: -1 automatic, 0 off, 1
  // on). QS_DIRECT_RING=0|1 sets it for the whole process.
  int direct_ring = kQuantAttentionDirectRing;
  // The one-query kernel where it applies (kQuantAttentionSingleQuery); false: the 8-column loop.
  bool single_query = kQuantAttentionSingleQuery;
  // The INT4 view's even-column kernel where it applies (kQuantAttentionEvenColumns); false: the
  // 8-column loop. QS_EVEN_COLUMNS=0|1 sets it for the whole process.
  bool even_columns = kQuantAttentionEvenColumns;
  // The INT8 view's (kQuantAttentionInt8EvenColumns). QS_INT8_EVEN_COLUMNS=0|1 sets it.
  bool int8_even_columns = kQuantAttentionInt8EvenColumns;
  // Diagnostics (bench_ops --sections qtime): non-null, a device buffer of kQuantTimelineSlots
  // words per block of the largest grid launched, into which every block of every launch writes
  // when its phases end (the last launch's stamps remain). Null: no stamp is taken.
  unsigned long long* timeline = nullptr;
  // The INT8 view (verification, AR with the INT8 cache) on the register-direct path with its
  // operands in f16 alone, as draft_f16 for the INT4 view: one MMA per product instead of the
  // f16 hi + lo pair. The folded query and the value weights are rounded to f16 (~2^-12
  // relative): the score's error ~20x below the INT8 view's own (an element's error up to s/2,
  // s = range / 255). Fewer instructions where the kernel is issue-bound (the GQA verification:
  // 2058 -> 1722 per 32-token sub-chunk with two tiles, sass_loops.py). H200, session 36:
  // Llama-3.1-8B verification attention at 32K 7-11% faster, the step 2%; Llama-2-7B unchanged;
  // errors up to 1.9e-3 of the exact view's output; session 37 at 128K: AR INT8 -1.1% / -3.4%,
  // QuantSpec -1.7% / -0.8% (Llama-3.1-8B / Llama-2-7B). The engine's default since then, per
  // backend (--target-attention f16, QuantAttentionArgs::f16_int8); this process-wide switch
  // (QS_INT8_F16=1) is for tests and benchmarks.
  bool int8_f16 = false;
  // More than kQuantAttentionMaxRows queries (a prefill that reads the history through the view:
  // --prefill-kv quantized, the prompt cache's rest of a prompt, evaluation) as the prefill
  // attention over the view written out as full-precision rows (CudaBackend::
  // attention_quantized_prefill) instead of slices of 16 queries, each of which reads the whole
  // history. H200, Llama-2-7B, a 32K prompt with --prefill-kv quantized: 6.05 s of prefill with
  // the slices, 2.34 s with this (session 36). QS_QUANT_PREFILL=0 turns it off for the whole
  // process.
  bool hybrid_prefill = true;
};
// Per block: [0] %globaltimer (ns) at entry, [1] at exit, [2 + i] clock64 at the end of phase i:
// 0 entry, 1 the previous kernel awaited (PDL), 2 the queries in shared memory, 3 the
// full-precision rows (direct path), 4 the quantized positions (direct path), 5 the block's
// barrier before the merge, 6 the partials written; [9] the SM the block ran on. Blocks in grid
// order (x fastest).
constexpr int kQuantTimelineSlots = 10;
void set_quant_attention_tuning(const QuantAttentionTuning& tuning);
QuantAttentionTuning quant_attention_tuning();

}  // namespace qs::cuda
