// The register-direct tensor-core path of attention_quant.cu (included there, after its device
// helpers): head_dim 128, one value group per token (Gv = head_dim), key groups of whole 32-token
// sub-chunks. Same arithmetic as MmaPath (centred codes, queries folded with the key group's step
// and split into f16 hi + lo, p * value step split likewise, q . min and p . min in f32), but the
// code fragments come straight from global memory into registers, one sub-chunk ahead, instead of
// through a cp.async ring in shared memory and ldmatrix. ncu on the ring version (2026-11-29,
// Llama-2-7B shape, 32K, draft): 47 warp instructions per (token, kv head), issue-latency-bound
// with 41-66 KB of shared memory per 2-warp block (6-10 warps per SM). Here every warp runs on its
// own (no block barrier in the loop), the block needs shared memory only for the queries and the
// states, and the same draft call executes 36 instructions per (token, kv head) (37.5 M instead
// of 49.1 M; 93 vs 118 us, docs/perf.md).
//
// Fragment maps (lane = (r, c) = (lane / 4, lane % 4)); the order of channels inside a dot product
// is free as long as both operands agree:
//  - keys, S^T = K Q'^T, m-tile = 16 tokens (rows r, r + 8), k-step ks = 2w + h (w, h < 4, 2):
//    the lane loads 16 bytes of each of its two token rows at byte 16c (channels [32c, 32c + 32)),
//    k-slots 2c, 2c+1, 2c+8, 2c+9 are channels 32c + 8w + 4h + {0, 2, 1, 3};
//  - values, O^T += V^T P^T, m-tile u < 8 (rows r, r + 8 are channels 16r + 8(u / 4) + 2(u % 4)
//    and that + 1), k-step = 16 tokens (k-slots 2c, 2c+1, 2c+8, 2c+9 in natural order): the lane
//    loads 8 bytes (channels [16r, 16r + 16)) of each of its four tokens.
#pragma once

namespace direct_path {

constexpr int kHD = 128;
constexpr int kTok = 32;  // tokens per sub-chunk (two 16-token steps)

// One sub-chunk's codes and value metadata as this lane needs them.
template <bool INT8>
struct Chunk {
  uint4 ku[2][2];  // keys: [step][row r / r + 8], 16 bytes at 16c
  uint4 kl[INT8 ? 2 : 1][2];
  uint2 vu[2][4];  // values: [step][token 2c, 2c+1, 2c+8, 2c+9], 8 bytes at 8r
  uint2 vl[INT8 ? 2 : 1][4];
  uint16_t vs[2][2];  // value scale / min (fp16) of tokens 16 st + 8 jb + r
  uint16_t vm[2][2];
};

// Pointers of one kv head (token 0) for Chunk loads.
struct Head {
  const uint8_t* ku;
  const uint8_t* kl;
  const uint8_t* vu;
  const uint8_t* vl;
  const uint16_t* vs;
  const uint16_t* vm;
};

template <bool INT8>
__device__ __forceinline__ void load_chunk(const Head& hd, int t_sub, Chunk<INT8>& ch) {
  const int lane = threadIdx.x & 31, r = lane >> 2, c = lane & 3;
  constexpr int RB = kHD / 2;
#pragma unroll
  for (int st = 0; st < 2; ++st) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int64_t off = static_cast<int64_t>(t_sub + 16 * st + 8 * j + r) * RB + 16 * c;
      ch.ku[st][j] = load_stream_16(reinterpret_cast<const uint4*>(hd.ku + off));
      if constexpr (INT8) ch.kl[st][j] = load_stream_16(reinterpret_cast<const uint4*>(hd.kl + off));
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int tok = t_sub + 16 * st + 2 * c + (i & 1) + 8 * (i >> 1);
      const int64_t off = static_cast<int64_t>(tok) * RB + 8 * r;
      ch.vu[st][i] = __ldg(reinterpret_cast<const uint2*>(hd.vu + off));
      if constexpr (INT8) ch.vl[st][i] = __ldg(reinterpret_cast<const uint2*>(hd.vl + off));
    }
#pragma unroll
    for (int jb = 0; jb < 2; ++jb) {
      const int tok = t_sub + 16 * st + 8 * jb + r;
      ch.vs[st][jb] = __ldg(hd.vs + tok);
      ch.vm[st][jb] = __ldg(hd.vm + tok);
    }
  }
}

__device__ __forceinline__ uint32_t word_at(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
__device__ __forceinline__ uint32_t word_at(const uint2& v, int i) {
  return i == 0 ? v.x : v.y;
}

// The online-softmax state of a warp's tile (8 query vectors x head_dim 128) in the O^T
// fragment layout: o[u][i] is channel ch(u) + (i >> 1) of query 2c + (i & 1), with ch(u) =
// 16r + 8 (u / 4) + 2 (u % 4) (the f16 path) or 16r + 2u (the integer path), both covering
// channels 16r .. 16r + 15.
struct DirectTile {
  float o[8][4];
  float m_run[2], l_part[2], acc_min[2];  // of queries 2c, 2c+1 (l and min: this lane's share)
  int bq[2];  // quantized positions [0, bq) visible to queries 2c, 2c+1

  __device__ void init_tile(int b0, int b1) {
#pragma unroll
    for (int u = 0; u < 8; ++u) {
#pragma unroll
      for (int i = 0; i < 4; ++i) o[u][i] = 0.0f;
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      m_run[k] = kNegInf;
      l_part[k] = 0.0f;
      acc_min[k] = 0.0f;
    }
    bq[0] = b0;
    bq[1] = b1;
  }

  // o_s: [8][HD], ml_s: [8][2] of this warp's tile; O^T = o * scale + the min term.
  template <bool kPairedChannels>
  __device__ void store_tile(float* o_s, float* ml_s, float scale) {
    const int lane = threadIdx.x & 31, r = lane >> 2, c = lane & 3;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
#pragma unroll
      for (int off = 4; off < 32; off *= 2) {
        l_part[k] += __shfl_xor_sync(kFullMask, l_part[k], off);
        acc_min[k] += __shfl_xor_sync(kFullMask, acc_min[k], off);
      }
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int ch = kPairedChannels ? 16 * r + 2 * u : 16 * r + 8 * (u >> 2) + 2 * (u & 3);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int q = 2 * c + (i & 1);
        o_s[q * kHD + ch + (i >> 1)] = o[u][i] * scale + acc_min[i & 1];
      }
    }
    if (r == 0) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        ml_s[2 * (2 * c + k)] = m_run[k];
        ml_s[2 * (2 * c + k) + 1] = l_part[k];
      }
    }
  }
};

template <bool INT8>
struct DirectPath : DirectTile {
  static constexpr int HD = kHD;
  static constexpr float kStepMul = INT8 ? 0.0625f : 1.0f;
  static constexpr float kCenter = INT8 ? 120.0f : 8.0f;  // as MmaPath: centred codes
  static constexpr uint32_t kBias = INT8 ? 0x64806480u : 0x64086408u;
  static constexpr int kQStride = HD + kQPad;

  uint32_t bq_hi[4][2][2], bq_lo[4][2][2];  // folded query r's B fragments, k-step (w, h)
  float inv_f[2], qm[2];                    // 2^-F and q.mid of queries 2c, 2c+1
  int e_run;                                // o is scaled by 2^e_run

  __device__ void init(int b0, int b1) {
    init_tile(b0, b1);
    e_run = 64;
  }

  // Query r (q_row: its pre-scaled [HD] row) folded with the key group's scale/min (global):
  // block w holds channels 32c + 8w .. +7 (k-steps 2w, 2w + 1).
  __device__ void fold_queries(const float* q_row, const uint16_t* k_scale, const uint16_t* k_min) {
    const int c = threadIdx.x & 3;
    int d0[4];
    uint4 sr[4], mr[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      d0[w] = 32 * c + 8 * w;
      sr[w] = __ldg(reinterpret_cast<const uint4*>(k_scale + d0[w]));
      mr[w] = __ldg(reinterpret_cast<const uint4*>(k_min + d0[w]));
    }
    fold_query<4>(q_row, d0, sr, mr, kStepMul, kCenter, bq_hi, bq_lo, inv_f, qm);
  }

  __device__ void process(const Chunk<INT8>& ch, int t_sub) {
    const int lane = threadIdx.x & 31, r = lane >> 2;

    // Scores: s[st][i], i = (token r | 8 + r) x (query 2c | 2c + 1).
    float s[2][4];
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      float acc_hi[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc_lo[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const uint32_t up[2] = {word_at(ch.ku[st][0], w), word_at(ch.ku[st][1], w)};
        const uint32_t lo[2] = {INT8 ? word_at(ch.kl[INT8 ? st : 0][0], w) : 0u,
                                INT8 ? word_at(ch.kl[INT8 ? st : 0][1], w) : 0u};
        score_block<INT8>(up, lo, bq_hi[w], bq_lo[w], kBias, acc_hi, acc_lo);
      }
      finish_scores(acc_hi, acc_lo, t_sub + 16 * st + r, bq, inv_f, qm, s[st]);
    }

    float corr[2], p[2][4];
    online_softmax_sub(s, m_run, l_part, corr, p);
    acc_min[0] *= corr[0];
    acc_min[1] *= corr[1];

    // Value steps of this lane's tokens 16 st + 8 jb + r; the min terms in f32.
    float vstep[2][2];
    float vmax = 0.0f;
#pragma unroll
    for (int st = 0; st < 2; ++st) {
#pragma unroll
      for (int jb = 0; jb < 2; ++jb) {
        vstep[st][jb] = __half2float(__ushort_as_half(ch.vs[st][jb])) * kStepMul;
        vmax = fmaxf(vmax, vstep[st][jb]);
        const float vmid = fmaf(kCenter, vstep[st][jb], __half2float(__ushort_as_half(ch.vm[st][jb])));
#pragma unroll
        for (int k = 0; k < 2; ++k) acc_min[k] = fmaf(p[st][2 * jb + k], vmid, acc_min[k]);
      }
    }
    float fe;
    const float se = value_scale_step(vmax, e_run, fe);
    const float c0 = corr[0] * fe, c1 = corr[1] * fe;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      o[u][0] *= c0;
      o[u][1] *= c1;
      o[u][2] *= c0;
      o[u][3] *= c1;
    }

    // O^T += V^T P^T, 16 tokens per k-step.
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      uint32_t bh[2], bl[2];
#pragma unroll
      for (int jb = 0; jb < 2; ++jb) {
        const float w = vstep[st][jb] * se;
        uint32_t h, l;
        split_f16x2(p[st][2 * jb] * w, p[st][2 * jb + 1] * w, h, l);
        bh[jb] = movmatrix_trans(h);
        bl[jb] = movmatrix_trans(l);
      }
#pragma unroll
      for (int wi = 0; wi < 2; ++wi) {
        // Even / odd channel codes of tokens 2c, 2c+1, 2c+8, 2c+9 (word wi: channels 16r + 8wi..).
        uint32_t ev[4], od[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          codes_even_odd<INT8>(word_at(ch.vu[st][i], wi),
                               INT8 ? word_at(ch.vl[INT8 ? st : 0][i], wi) : 0u, ev[i], od[i]);
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // bytes {0, 1} or {2, 3} of each word
          const uint32_t pair_sel = half ? 0x7362u : 0x5140u;
          // [t0.b, t1.b, t0.b+1, t1.b+1] for tokens (2c, 2c+1) and (2c+8, 2c+9).
          const uint32_t e01 = __byte_perm(ev[0], ev[1], pair_sel);
          const uint32_t e89 = __byte_perm(ev[2], ev[3], pair_sel);
          const uint32_t o01 = __byte_perm(od[0], od[1], pair_sel);
          const uint32_t o89 = __byte_perm(od[2], od[3], pair_sel);
#pragma unroll
          for (int bb = 0; bb < 2; ++bb) {
            const int u = 4 * wi + 2 * half + bb;
            const uint32_t sel = bb ? 0x4342u : 0x4140u;
            const uint32_t a0 = codes_to_f16x2(e01, sel, kBias);  // row r: channel, tokens 2c, 2c+1
            const uint32_t a1 = codes_to_f16x2(o01, sel, kBias);  // row r + 8: channel + 1
            const uint32_t a2 = codes_to_f16x2(e89, sel, kBias);
            const uint32_t a3 = codes_to_f16x2(o89, sel, kBias);
            mma_f16(o[u], a0, a1, a2, a3, bh[0], bh[1]);
            mma_f16(o[u], a0, a1, a2, a3, bl[0], bl[1]);
          }
        }
      }
    }
  }

  __device__ void store(float* o_s, float* ml_s) {
    store_tile<false>(o_s, ml_s, exp2i(-e_run));
  }
};

// ---- integer tensor cores for the draft (INT4) view ----------------------------------------
//
// QuantAttentionTuning::int_mma (off by default until measured on the GPU): the INT4 view's codes
// go to mma.m16n8k32 as unsigned bytes with no conversion to f16 (an even / odd nibble mask is a
// byte vector already), 32 channels (keys) or 32 tokens (values) per MMA. The other operand is
// rounded to 8 bits: the query folded with the key group's scale, per (query, key group), to
// s8 in [-127, 127]; the value weights p * value step, per (query, sub-chunk), to u8 in [0, 255].
// Scores and O are exact integer sums of those; q . min and p . min stay f32, so do the running
// max, the sum l (from the f32 p) and O across sub-chunks. The rounding (2^-8 relative to each
// operand's maximum) is far below the INT4 view's own error (s/2 per element), so this path is
// for the draft view only, tested against the exact INT4 view at a draft tolerance.
//
// Fragment maps, lane = (r, c):
//  - keys, S^T = K Q8^T, MMA w < 4 per 16-token step: A rows = tokens r, r + 8; k-slots 4c..4c+3
//    = channels 32c + 8w + {0, 2, 4, 6} (even nibbles of word w of the lane's 16 bytes), 16 + 4c..
//    = channels 32c + 8w + {1, 3, 5, 7}; B = query r's s8 values of the same channels.
//  - values, O^T += V^T W^T, one MMA per m-tile u < 8 per 32-token sub-chunk: A rows = channels
//    16r + 2u (row r) and 16r + 2u + 1 (row r + 8), k-slots 4c..4c+3 = tokens 2c + {0, 8, 16, 24},
//    16 + 4c.. = tokens 2c + 1 + {0, 8, 16, 24} (the 8-byte value loads of load_chunk, transposed
//    4 x 4 bytes at a time); B = query r's u8 weights of those tokens, fetched from the lanes that
//    hold them in the score layout (lanes (2c, r / 2) and (2c + 1, r / 2)).

// d += A B, m16n8k32, A u8 (row-major), B s8 or u8 (column-major), s32 accumulators.
__device__ __forceinline__ void imma_u8s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void imma_u8u8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Byte b of x0..x3 as the bytes of y[b]: a 4 x 4 byte transpose.
__device__ __forceinline__ void transpose_bytes(uint32_t x0, uint32_t x1, uint32_t x2, uint32_t x3,
                                                uint32_t (&y)[4]) {
  const uint32_t t01_lo = __byte_perm(x0, x1, 0x5140u);  // x0.b0 x1.b0 x0.b1 x1.b1
  const uint32_t t01_hi = __byte_perm(x0, x1, 0x7362u);  // x0.b2 x1.b2 x0.b3 x1.b3
  const uint32_t t23_lo = __byte_perm(x2, x3, 0x5140u);
  const uint32_t t23_hi = __byte_perm(x2, x3, 0x7362u);
  y[0] = __byte_perm(t01_lo, t23_lo, 0x5410u);
  y[1] = __byte_perm(t01_lo, t23_lo, 0x7632u);
  y[2] = __byte_perm(t01_hi, t23_hi, 0x5410u);
  y[3] = __byte_perm(t01_hi, t23_hi, 0x7632u);
}

// Four values in [lo, hi] (already rounded integers) as the bytes of a word, v[0] lowest.
__device__ __forceinline__ uint32_t pack_bytes(int v0, int v1, int v2, int v3) {
  return (static_cast<uint32_t>(v0) & 0xffu) | ((static_cast<uint32_t>(v1) & 0xffu) << 8) |
         ((static_cast<uint32_t>(v2) & 0xffu) << 16) | (static_cast<uint32_t>(v3) << 24);
}

struct DirectPathInt : DirectTile {
  static constexpr int HD = kHD;
  static constexpr int kQStride = HD + kQPad;
  static constexpr float kCodeMean = 7.5f;  // of INT4 codes spread over 0..15

  uint32_t bq8[4][2];   // query r's s8 B fragments of key MMA w: even / odd channels
  float qsc[2], qm[2];  // the s8 step and q . min of queries 2c, 2c+1

  __device__ void init(int b0, int b1) { init_tile(b0, b1); }

  // Query r (q_row: its pre-scaled [HD] row) times the key group's scale (global), channels
  // 32c .. 32c + 31, rounded to s8 with one step per query; q . min in f32.
  __device__ void fold_queries(const float* q_row, const uint16_t* k_scale, const uint16_t* k_min) {
    const int c = threadIdx.x & 3;
    float x[4][8];
    float amax = 0.0f, qmp = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int d0 = 32 * c + 8 * w;
      const uint4 sr = __ldg(reinterpret_cast<const uint4*>(k_scale + d0));
      const uint4 mr = __ldg(reinterpret_cast<const uint4*>(k_min + d0));
      const float4 q0 = *reinterpret_cast<const float4*>(q_row + d0);
      const float4 q1 = *reinterpret_cast<const float4*>(q_row + d0 + 4);
      const float qv[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
      const uint32_t sw[4] = {sr.x, sr.y, sr.z, sr.w};
      const uint32_t mw[4] = {mr.x, mr.y, mr.z, mr.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 s2 = __half22float2(*reinterpret_cast<const __half2*>(&sw[i]));
        const float2 m2 = __half22float2(*reinterpret_cast<const __half2*>(&mw[i]));
        x[w][2 * i] = qv[2 * i] * s2.x;
        x[w][2 * i + 1] = qv[2 * i + 1] * s2.y;
        qmp = fmaf(qv[2 * i], m2.x, qmp);
        qmp = fmaf(qv[2 * i + 1], m2.y, qmp);
        amax = fmaxf(amax, fmaxf(fabsf(x[w][2 * i]), fabsf(x[w][2 * i + 1])));
      }
    }
    amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, 2));
    const float step = amax > 0.0f ? amax / 127.0f : 1.0f;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    // The rounding residuals d = x - step * q8 enter the score as sum(d * U): its part
    // kCodeMean * sum(d) is a constant of the (query, key group) and goes into q . min exactly,
    // leaving sum(d * (U - kCodeMean)) (about half the error for codes spread over 0..15).
    float resid = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int v[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          v[e] = min(127, max(-127, __float2int_rn(x[w][2 * e + h] * inv)));
          resid += x[w][2 * e + h] - step * static_cast<float>(v[e]);
        }
        bq8[w][h] = pack_bytes(v[0], v[1], v[2], v[3]);
      }
    }
    qmp = fmaf(kCodeMean, resid, qmp);
    qmp += __shfl_xor_sync(kFullMask, qmp, 1);
    qmp += __shfl_xor_sync(kFullMask, qmp, 2);
    qsc[0] = __shfl_sync(kFullMask, step, 8 * c);
    qsc[1] = __shfl_sync(kFullMask, step, 8 * c + 4);
    qm[0] = __shfl_sync(kFullMask, qmp, 8 * c);
    qm[1] = __shfl_sync(kFullMask, qmp, 8 * c + 4);
  }

  __device__ void process(const Chunk<false>& ch, int t_sub) {
    const int lane = threadIdx.x & 31, r = lane >> 2, c = lane & 3;

    // Scores: s[st][i], i = (token r | r + 8) x (query 2c | 2c + 1).
    float s[2][4];
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      int acc[4] = {0, 0, 0, 0};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const uint32_t u0 = word_at(ch.ku[st][0], w), u1 = word_at(ch.ku[st][1], w);
        imma_u8s8(acc, u0 & 0x0F0F0F0Fu, u1 & 0x0F0F0F0Fu, (u0 >> 4) & 0x0F0F0F0Fu,
                  (u1 >> 4) & 0x0F0F0F0Fu, bq8[w][0], bq8[w][1]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int k = i & 1;
        const int tok = t_sub + 16 * st + r + 8 * (i >> 1);
        s[st][i] = tok < bq[k] ? fmaf(static_cast<float>(acc[i]), qsc[k], qm[k]) : kNegInf;
      }
    }

    float corr[2], p[2][4];
    online_softmax_sub(s, m_run, l_part, corr, p);

    // Value weights w = p * step of this lane's tokens 16 st + 8 jb + r; the min terms in f32.
    float wv[2][4], wmax[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < 2; ++k) acc_min[k] *= corr[k];
#pragma unroll
    for (int st = 0; st < 2; ++st) {
#pragma unroll
      for (int jb = 0; jb < 2; ++jb) {
        const float step = __half2float(__ushort_as_half(ch.vs[st][jb]));
        const float vmin = __half2float(__ushort_as_half(ch.vm[st][jb]));
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const float pk = p[st][2 * jb + k];
          wv[st][2 * jb + k] = pk * step;
          wmax[k] = fmaxf(wmax[k], pk * step);
          acc_min[k] = fmaf(pk, vmin, acc_min[k]);
        }
      }
    }
    // Per query (the 8 lanes of a query column): the sub-chunk's largest weight sets the u8 step.
    uint32_t pk8[2];
    float wsc[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      wmax[k] = fmaxf(wmax[k], __shfl_xor_sync(kFullMask, wmax[k], 4));
      wmax[k] = fmaxf(wmax[k], __shfl_xor_sync(kFullMask, wmax[k], 8));
      wmax[k] = fmaxf(wmax[k], __shfl_xor_sync(kFullMask, wmax[k], 16));
      const float inv = wmax[k] > 0.0f ? 255.0f / wmax[k] : 0.0f;
      wsc[k] = wmax[k] / 255.0f;
      int v[4];            // tokens r, r + 8, 16 + r, 24 + r
      float resid = 0.0f;  // as in fold_queries: kCodeMean * sum of the rounding residuals
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const float wt = wv[t >> 1][2 * (t & 1) + k];
        v[t] = min(255, __float2int_rn(wt * inv));
        resid += wt - wsc[k] * static_cast<float>(v[t]);
      }
      acc_min[k] = fmaf(kCodeMean, resid, acc_min[k]);
      pk8[k] = pack_bytes(v[0], v[1], v[2], v[3]);
    }
    // B fragment of query r: tokens 2c + {0, 8, 16, 24} from lane (2c, r / 2), 2c + 1 + ... from
    // lane (2c + 1, r / 2), each that lane's weights of query r (its 2 (r / 2) + (r & 1)).
    const int src0 = 4 * (2 * c) + (r >> 1), src1 = src0 + 4;
    const uint32_t e0 = __shfl_sync(kFullMask, pk8[0], src0);
    const uint32_t o0 = __shfl_sync(kFullMask, pk8[1], src0);
    const uint32_t e1 = __shfl_sync(kFullMask, pk8[0], src1);
    const uint32_t o1 = __shfl_sync(kFullMask, pk8[1], src1);
    const uint32_t b0 = (r & 1) ? o0 : e0, b1 = (r & 1) ? o1 : e1;

    // Earlier contributions follow a new running max; once the max settles (corr == 1 exactly
    // for every query of the warp) the rescale is skipped.
    if (__any_sync(kFullMask, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
      for (int u = 0; u < 8; ++u) {
#pragma unroll
        for (int i = 0; i < 4; ++i) o[u][i] *= corr[i & 1];
      }
    }

    // A fragments: the value code bytes of tokens T0 = 2c + {0, 8, 16, 24} (vu[st][0], vu[st][2])
    // and T1 = 2c + 1 + {0, 8, 16, 24} (vu[st][1], vu[st][3]), transposed per 4-byte word.
#pragma unroll
    for (int wd = 0; wd < 2; ++wd) {
      uint32_t y0[4], y1[4];
      transpose_bytes(word_at(ch.vu[0][0], wd), word_at(ch.vu[0][2], wd), word_at(ch.vu[1][0], wd),
                      word_at(ch.vu[1][2], wd), y0);
      transpose_bytes(word_at(ch.vu[0][1], wd), word_at(ch.vu[0][3], wd), word_at(ch.vu[1][1], wd),
                      word_at(ch.vu[1][3], wd), y1);
#pragma unroll
      for (int bb = 0; bb < 4; ++bb) {
        const int u = 4 * wd + bb;  // channels 16r + 2u (low nibbles), + 1 (high nibbles)
        int acc[4] = {0, 0, 0, 0};
        imma_u8u8(acc, y0[bb] & 0x0F0F0F0Fu, (y0[bb] >> 4) & 0x0F0F0F0Fu, y1[bb] & 0x0F0F0F0Fu,
                  (y1[bb] >> 4) & 0x0F0F0F0Fu, b0, b1);
#pragma unroll
        for (int i = 0; i < 4; ++i) o[u][i] = fmaf(static_cast<float>(acc[i]), wsc[i & 1], o[u][i]);
      }
    }
  }

  __device__ void store(float* o_s, float* ml_s) {
    store_tile<true>(o_s, ml_s, 1.0f);
  }
};

// A quantized split [begin, end) of kv head kvh: slice `ts` of the block's warps takes the
// contiguous positions [begin + ts * len, +len), len = q_split_len / slices, one sub-chunk ahead
// in registers. No shared memory and no barrier: `overlap()` (the full-precision rows) runs first.
template <bool INT8, bool kInt, class Overlap>
__device__ __forceinline__ void quant_split_direct(const Params& p, int begin, int end, int kvh,
                                                   int ts, int qv_warp, const float* q_warp,
                                                   float* o_mine, float* ml_mine,
                                                   const Overlap& overlap) {
  const QuantAttentionArgs& a = p.a;
  const int lane = threadIdx.x & 31, c = lane & 3;
  const int G = a.seg.group_size;
  const int64_t C = a.seg.capacity;
  const int slice_len = p.q_split_len / p.slices;
  const int b = begin + ts * slice_len, e = min(end, b + slice_len);
  const int n_subs = e > b ? (e - b) / kTok : 0;
  const int64_t codes = static_cast<int64_t>(kvh) * C * (kHD / 2);
  const Head head{a.seg.key_upper + codes,
                  INT8 ? a.seg.key_lower + codes : nullptr,
                  a.seg.value_upper + codes,
                  INT8 ? a.seg.value_lower + codes : nullptr,
                  a.seg.value_scale + static_cast<int64_t>(kvh) * C,
                  a.seg.value_min + static_cast<int64_t>(kvh) * C};
  const uint16_t* k_scale = a.seg.key_scale + static_cast<int64_t>(kvh) * (C / G) * kHD;
  const uint16_t* k_min = a.seg.key_min + static_cast<int64_t>(kvh) * (C / G) * kHD;

  // INT4: the next sub-chunk is loaded while this one is computed (2 x 40 registers); INT8 (twice
  // the codes) loads each sub-chunk just before use and relies on the other warps.
  constexpr bool kPrefetch = !INT8;
  // The full-precision rows first: their registers (RowPath) are dead before the chunks' are live.
  overlap();
  Chunk<INT8> cur;
  if (kPrefetch && n_subs > 0) load_chunk<INT8>(head, b, cur);

  static_assert(!(kInt && INT8), "integer tensor cores: the draft (INT4) view only");
  using Path = std::conditional_t<kInt, DirectPathInt, DirectPath<INT8>>;
  Path w;
  {
    int bnd[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int qv = qv_warp + 2 * c + k;
      bnd[k] = qv < p.nq ? quant_boundary_dev(a.pos + qv / p.group, G) : 0;
    }
    w.init(bnd[0], bnd[1]);
  }
  const float* q_row = q_warp + (lane >> 2) * Path::kQStride;
  for (int j = 0; j < n_subs; ++j) {
    const int t_sub = b + j * kTok;
    Chunk<INT8> nxt;
    if (kPrefetch) {
      if (j + 1 < n_subs) load_chunk<INT8>(head, t_sub + kTok, nxt);
    } else {
      load_chunk<INT8>(head, t_sub, cur);
    }
    if (j == 0 || t_sub % G == 0) {
      const int64_t grp = t_sub / G;
      w.fold_queries(q_row, k_scale + grp * kHD, k_min + grp * kHD);
    }
    w.process(cur, t_sub);
    if (kPrefetch) cur = nxt;
  }
  w.store(o_mine, ml_mine);
}

}  // namespace direct_path
