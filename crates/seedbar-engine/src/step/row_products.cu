// y = x · wᵀ for a few rows, with each output computed the same way for any row count.
// Body of an MLX custom CUDA kernel (MLX writes the signature): inputs x [..., K] (M rows)
// and w [N, K] of type T, output y [M, N] (any shape of that size); template arguments T,
// MAX_ROWS (M <= MAX_ROWS) and COLS (output columns per warp). One warp computes COLS
// columns for every row.
//
// The sum behind y[m, n] does not depend on M, MAX_ROWS or COLS: lane l multiplies the
// k-spans [256 j + 8 l, 256 j + 8 l + 8) in order of j, each element with one explicit
// fused multiply-add in float32, and the 32 lanes' partial sums meet in one fixed
// butterfly. So a row gets the same bits alone and among any others, which is what lets a
// decode step skip padding (a cuBLAS product picks its algorithm by M). K must be a
// multiple of 8 (16-byte loads of 2-byte types).
constexpr int LANES = 32;
constexpr int SPAN = 8;
constexpr int CHUNK = LANES * SPAN;
// x may carry leading axes: its rows are all of them but the last.
const int depth = x_shape[x_ndim - 1];
int rows = 1;
for (int d = 0; d < x_ndim - 1; ++d) {
  rows *= x_shape[d];
}
const int outputs = w_shape[0];
const int lane = threadIdx.x % LANES;
const int first = (blockIdx.x * blockDim.x + threadIdx.x) / LANES * COLS;
if (first >= outputs) {
  return;
}
float acc[COLS][MAX_ROWS];
#pragma unroll
for (int c = 0; c < COLS; ++c) {
#pragma unroll
  for (int m = 0; m < MAX_ROWS; ++m) {
    acc[c][m] = 0.0f;
  }
}
// Eight consecutive elements of type T at p, as floats (p is 8-element aligned).
auto load8 = [](const T* p, float* out) {
  alignas(16) T v[SPAN];
  if constexpr (sizeof(T) == 2) {
    *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(p);
  } else {
    reinterpret_cast<float4*>(v)[0] = reinterpret_cast<const float4*>(p)[0];
    reinterpret_cast<float4*>(v)[1] = reinterpret_cast<const float4*>(p)[1];
  }
#pragma unroll
  for (int i = 0; i < SPAN; ++i) {
    out[i] = static_cast<float>(v[i]);
  }
};
#pragma unroll 2
for (int k = lane * SPAN; k < depth; k += CHUNK) {
  float wv[COLS][SPAN];
#pragma unroll
  for (int c = 0; c < COLS; ++c) {
    const int n = min(first + c, outputs - 1);
    load8(w + static_cast<long>(n) * depth + k, wv[c]);
  }
#pragma unroll
  for (int m = 0; m < MAX_ROWS; ++m) {
    if (m < rows) {
      float xv[SPAN];
      load8(x + static_cast<long>(m) * depth + k, xv);
#pragma unroll
      for (int c = 0; c < COLS; ++c) {
#pragma unroll
        for (int i = 0; i < SPAN; ++i) {
          acc[c][m] = __fmaf_rn(wv[c][i], xv[i], acc[c][m]);
        }
      }
    }
  }
}
#pragma unroll
for (int c = 0; c < COLS; ++c) {
#pragma unroll
  for (int m = 0; m < MAX_ROWS; ++m) {
    if (m < rows) {
#pragma unroll
      for (int offset = LANES / 2; offset > 0; offset /= 2) {
        acc[c][m] = __fadd_rn(acc[c][m], __shfl_xor_sync(0xffffffff, acc[c][m], offset));
      }
      // Every lane holds the sum now; lane m % 32 stores it.
      if (lane == m % LANES && first + c < outputs) {
        y[static_cast<long>(m) * outputs + first + c] = static_cast<T>(acc[c][m]);
      }
    }
  }
}
