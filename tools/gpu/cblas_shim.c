/* A stand-in for OpenBLAS on the GPU machine, used when OpenBLAS does not fit the device call's
 * 64 MiB transfer limit (tools/gpu/fetch_debs.sh decides). It provides the two symbols the CPU
 * backend calls: cblas_sgemm (plain f32 loops; the CPU backend already spreads panels over its
 * threads) and openblas_set_num_threads, plus sgemm_ for CMake's FindBLAS link check.
 * Built by tools/gpu/build_on_device.sh as libopenblas.so; compiled against OpenBLAS's cblas.h,
 * so the signatures are checked. The results differ from OpenBLAS's only in summation order. */
#include <cblas.h>

/* Element (i, j) of op(M) for a matrix stored row- or column-major with leading dimension ld. */
static float element(const float* m, blasint ld, int row_major, int trans, blasint i, blasint j) {
  if (trans) {
    blasint t = i;
    i = j;
    j = t;
  }
  return row_major ? m[(long)i * ld + j] : m[(long)j * ld + i];
}

/* sum over k of a[k] * b[k], in 8 independent partial sums (so the compiler may vectorize it
 * without reassociating a single sum). */
static float dot(const float* a, const float* b, blasint n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  blasint k = 0;
  for (; k + 8 <= n; k += 8) {
    for (int e = 0; e < 8; ++e) acc[e] += a[k + e] * b[k + e];
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; k < n; ++k) s += a[k] * b[k];
  return s;
}

void cblas_sgemm(OPENBLAS_CONST enum CBLAS_ORDER Order, OPENBLAS_CONST enum CBLAS_TRANSPOSE TransA,
                 OPENBLAS_CONST enum CBLAS_TRANSPOSE TransB, OPENBLAS_CONST blasint M,
                 OPENBLAS_CONST blasint N, OPENBLAS_CONST blasint K, OPENBLAS_CONST float alpha,
                 OPENBLAS_CONST float* A, OPENBLAS_CONST blasint lda, OPENBLAS_CONST float* B,
                 OPENBLAS_CONST blasint ldb, OPENBLAS_CONST float beta, float* C,
                 OPENBLAS_CONST blasint ldc) {
  const int row_major = Order == CblasRowMajor;
  const int ta = TransA != CblasNoTrans, tb = TransB != CblasNoTrans;
  for (blasint i = 0; i < M; ++i) {
    for (blasint j = 0; j < N; ++j) {
      float s;
      if (row_major && !ta && tb) { /* the CPU backend's case: rows of A and B are contiguous */
        s = dot(A + (long)i * lda, B + (long)j * ldb, K);
      } else {
        s = 0.0f;
        for (blasint k = 0; k < K; ++k) {
          s += element(A, lda, row_major, ta, i, k) * element(B, ldb, row_major, tb, k, j);
        }
      }
      float* c = row_major ? &C[(long)i * ldc + j] : &C[(long)j * ldc + i];
      *c = alpha * s + (beta == 0.0f ? 0.0f : beta * *c);
    }
  }
}

void openblas_set_num_threads(int num_threads) { (void)num_threads; }

/* Only linked by FindBLAS's check; never called. */
void sgemm_(void) {}
