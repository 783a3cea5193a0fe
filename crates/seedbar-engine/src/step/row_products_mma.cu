// y = x · wᵀ for up to 32 rows of a 16-bit x on tensor cores, each output computed the
// same way for any row count (row_products_mma.cuh says how). Body of an MLX custom CUDA
// kernel (MLX writes the signature; the header is row_products_mma.cuh): inputs x [..., K]
// (M rows) and w [N, K] of type T (bf16 or f16), output y [M, N] (any shape of that size);
// template arguments T, MT (m-tiles of 16 rows, M <= 16 MT) and NT (n-tiles of 8 columns
// per block of 128 threads). K must be a multiple of 32.
// x may carry leading axes: its rows are all of them but the last.
const int depth = x_shape[x_ndim - 1];
int rows = 1;
for (int d = 0; d < x_ndim - 1; ++d) {
  rows *= x_shape[d];
}
seedbar_rows::products<T, MT, NT, 8>(
    x, rows, depth, w_shape[0], y, [&](int n, int k, unsigned* words) {
      const uint4 v = *reinterpret_cast<const uint4*>(w + static_cast<long>(n) * depth + k);
      words[0] = v.x;
      words[1] = v.y;
      words[2] = v.z;
      words[3] = v.w;
    });
