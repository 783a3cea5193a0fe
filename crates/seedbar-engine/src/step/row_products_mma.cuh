// The tensor-core row product of row_products_mma.cu: y = x · wᵀ for up to 32 rows of
// 16-bit x, where every output is computed the same way whatever the row count. Passed to
// MLX as the kernel's header (MLX writes the kernel's signature and puts its body after
// this); `products` takes the weights through a loader, so another weight layout is another
// loader. Needs sm_80 or newer (mma.sync with bf16/f16 operands).
//
// How the sums run, and why a row's bits do not depend on the other rows:
// - A block is four warps over the same 8 · NT output columns; warp `s` takes the s-th
//   quarter of K's blocks of KB elements (the split is a function of K alone). Lane
//   (g, t) = (lane / 4, lane % 4) holds, per KB block, EL consecutive elements
//   [KB b + EL t, KB b + EL (t + 1)) of weight row g of each n-tile and of x rows g and
//   g + 8 of each m-tile; pairs of them are mma.sync.m16n8k16's k-slots (2t, 2t + 1) and
//   (2t + 8, 2t + 9), the same mapping for x and w, so each product is x[m, k] · w[n, k].
// - A warp chains its mma.sync steps in order of k; each output of a tile is the tensor
//   core's fixed sum of one x row and one w column: no other row of the tile takes part,
//   and rows past M are zeros that are never loaded.
// - The four warps' partial sums of an output meet in one fixed order (0, 1, 2, 3).
// The m-tiles, n-tiles and blocks change only who computes an output, not how.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace seedbar_rows {

constexpr int WARPS = 4;

// mma.sync.m16n8k16 with float32 accumulators, for operands of type T.
template <typename T>
struct Mma;

// Mma<TYPE>, whose operands are PTX's PTX_TYPE.
#define SEEDBAR_MMA(TYPE, PTX_TYPE)                                                         \
  template <>                                                                               \
  struct Mma<TYPE> {                                                                        \
    static __device__ inline void run(float c[4], const unsigned a[4], const unsigned b[2]) { \
      asm volatile(                                                                         \
          "mma.sync.aligned.m16n8k16.row.col.f32." PTX_TYPE "." PTX_TYPE ".f32 "             \
          "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"               \
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                 \
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));             \
    }                                                                                       \
  };
SEEDBAR_MMA(__nv_bfloat16, "bf16")
SEEDBAR_MMA(__half, "f16")
#undef SEEDBAR_MMA

// y [rows, outputs] = x [rows, depth] · wᵀ for this block's 8 · NT columns, with MT
// m-tiles of 16 rows (rows <= 16 · MT). `load_w(n, k, words)` fills `words` with weight
// row n's EL elements from k as EL / 2 registers of two T each (the lower k in the low
// half). depth must be a multiple of KB = 4 · EL, and EL a multiple of 8 (16-byte loads of
// x).
template <typename T, int MT, int NT, int EL, typename LoadW>
__device__ inline void products(
    const T* x, int rows, int depth, int outputs, T* y, LoadW load_w) {
  constexpr int KB = 4 * EL;
  constexpr int WORDS = EL / 2;
  __shared__ float partial[WARPS][MT * 16][NT * 8];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int first = blockIdx.x * NT * 8;
  const int blocks = depth / KB;
  const int per_warp = (blocks + WARPS - 1) / WARPS;
  const int begin = warp * per_warp;
  const int end = min(blocks, begin + per_warp);
  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[mt][nt][i] = 0.0f;
      }
    }
  }
#pragma unroll 2
  for (int b = begin; b < end; ++b) {
    const int k = b * KB + t * EL;
    unsigned wv[NT][WORDS];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      load_w(min(first + nt * 8 + g, outputs - 1), k, wv[nt]);
    }
    // x rows g and g + 8 of each m-tile (zeros past the last row).
    unsigned xv[MT][2][WORDS];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = mt * 16 + h * 8 + g;
#pragma unroll
        for (int i = 0; i < WORDS / 4; ++i) {
          uint4 v = make_uint4(0u, 0u, 0u, 0u);
          if (m < rows) {
            v = reinterpret_cast<const uint4*>(x + static_cast<long>(m) * depth + k)[i];
          }
          xv[mt][h][4 * i] = v.x;
          xv[mt][h][4 * i + 1] = v.y;
          xv[mt][h][4 * i + 2] = v.z;
          xv[mt][h][4 * i + 3] = v.w;
        }
      }
    }
    // Step s takes elements 4s .. 4s + 3 of the lane's EL: registers 2s and 2s + 1.
#pragma unroll
    for (int s = 0; s < EL / 4; ++s) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const unsigned a[4] = {
            xv[mt][0][2 * s], xv[mt][1][2 * s], xv[mt][0][2 * s + 1], xv[mt][1][2 * s + 1]};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const unsigned bw[2] = {wv[nt][2 * s], wv[nt][2 * s + 1]};
          Mma<T>::run(acc[mt][nt], a, bw);
        }
      }
    }
  }
  // The accumulators hold rows g, g + 8 and columns 2t, 2t + 1 of each tile.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        partial[warp][mt * 16 + g + (i / 2) * 8][nt * 8 + 2 * t + i % 2] = acc[mt][nt][i];
      }
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < MT * 16 * NT * 8; e += blockDim.x) {
    const int m = e / (NT * 8);
    const int c = e % (NT * 8);
    if (m < rows && first + c < outputs) {
      float sum = partial[0][m][c];
#pragma unroll
      for (int s = 1; s < WARPS; ++s) {
        sum = __fadd_rn(sum, partial[s][m][c]);
      }
      y[static_cast<long>(m) * outputs + first + c] = static_cast<T>(sum);
    }
  }
}

} // namespace seedbar_rows
