// y = x · dequantize(w)ᵀ for a few rows of x and MLX's affine-quantized w, with each output
// computed the same way for any row count. Body of an MLX custom CUDA kernel (MLX writes
// the signature): inputs x [..., K] (M rows) of type T, w [N, K * BITS / 32] uint32
// (BITS-bit values, the lowest bits first), scales and biases [N, K / GROUP] of type T;
// output y [M, N] (any shape of that size); template arguments T, MAX_ROWS (M <= MAX_ROWS),
// COLS (output columns per warp), BITS (4 or 8) and GROUP (the quantization group, a
// multiple of the span below).
//
// The sum behind y[m, n] does not depend on M, MAX_ROWS or COLS: lane l reads 16 bytes of
// weights at a time, the span of SPAN elements [CHUNK j + SPAN l, CHUNK j + SPAN (l + 1))
// in order of j; per span it sums q_i x_i and x_i in element order with explicit float32
// operations and adds scale · dot + bias · sum of x, and the 32 lanes' partial sums meet in
// one fixed butterfly. So a row gets the same bits alone and among any others, and one row
// reads each weight once at the speed of a vector product. K must be a multiple of SPAN.
constexpr int LANES = 32;
constexpr int WORDS = 4;
constexpr int PER_WORD = 32 / BITS;
constexpr int SPAN = WORDS * PER_WORD;
constexpr int CHUNK = LANES * SPAN;
constexpr unsigned int MASK = (1u << BITS) - 1u;
// x may carry leading axes: its rows are all of them but the last.
const int depth = x_shape[x_ndim - 1];
int rows = 1;
for (int d = 0; d < x_ndim - 1; ++d) {
  rows *= x_shape[d];
}
const int outputs = w_shape[0];
const long words_per_row = w_shape[1];
const long groups_per_row = scales_shape[1];
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
for (int k = lane * SPAN; k < depth; k += CHUNK) {
  float q[COLS][SPAN];
  float scale[COLS];
  float bias[COLS];
#pragma unroll
  for (int c = 0; c < COLS; ++c) {
    const long n = min(first + c, outputs - 1);
    const uint4 packed = *reinterpret_cast<const uint4*>(w + n * words_per_row + k / PER_WORD);
    const unsigned int words[WORDS] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
    for (int j = 0; j < WORDS; ++j) {
#pragma unroll
      for (int i = 0; i < PER_WORD; ++i) {
        q[c][j * PER_WORD + i] = static_cast<float>((words[j] >> (BITS * i)) & MASK);
      }
    }
    scale[c] = static_cast<float>(scales[n * groups_per_row + k / GROUP]);
    bias[c] = static_cast<float>(biases[n * groups_per_row + k / GROUP]);
  }
#pragma unroll
  for (int m = 0; m < MAX_ROWS; ++m) {
    if (m < rows) {
      const T* xs = x + static_cast<long>(m) * depth + k;
      // SPAN elements in 16-byte loads (x's rows start 16-byte aligned: K % SPAN == 0).
      alignas(16) T raw[SPAN];
#pragma unroll
      for (int i = 0; i < SPAN * static_cast<int>(sizeof(T)) / 16; ++i) {
        reinterpret_cast<uint4*>(raw)[i] = reinterpret_cast<const uint4*>(xs)[i];
      }
      float xv[SPAN];
#pragma unroll
      for (int i = 0; i < SPAN; ++i) {
        xv[i] = static_cast<float>(raw[i]);
      }
      float total = 0.0f;
#pragma unroll
      for (int i = 0; i < SPAN; ++i) {
        total = __fadd_rn(total, xv[i]);
      }
#pragma unroll
      for (int c = 0; c < COLS; ++c) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < SPAN; ++i) {
          dot = __fmaf_rn(q[c][i], xv[i], dot);
        }
        acc[c][m] = __fmaf_rn(scale[c], dot, acc[c][m]);
        acc[c][m] = __fmaf_rn(bias[c], total, acc[c][m]);
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
