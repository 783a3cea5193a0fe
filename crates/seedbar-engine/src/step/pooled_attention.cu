// One query token per (row, head) against a pool class's keys and values, each output
// computed from the query's own positions alone, in an order fixed by those positions: the
// same bits whatever the class's capacity, slot or companions, alone or in any step. Body
// of an MLX custom CUDA kernel (MLX writes the signature): inputs q [P, H, HD] of type T
// (rotated queries, in any order), keys and values [S, KVH, C, HD] of type T (the class's
// buffers: position t of slot s at index t % C), rows int32 [R, 4] (per output row: the
// query's place in q, its slot, its length — it sees positions before it — and its first
// visible position), and factors float32 [2] (the score's scale and, where SOFTCAP, the
// logit cap); output y [R, H, HD]; template arguments T, HD (head dim, a multiple of 32
// and of 8) and SOFTCAP (0 or 1). Launch R · H blocks of 128 threads.
//
// The sum: the positions run in tiles of 32 at absolute multiples of 32; warp w of the
// block takes the query's tiles w, w + 4, ... (counted from the tile of its first position).
// Per tile, lane l scores position 32 j + l (a dot product over the head in four fixed
// interleaved partial sums, then (0 + 1) + (2 + 3)), the warp folds it into its running
// maximum, total and output (online softmax: each scaled by exp(old max - new max)), each
// output element adding the tile's positions in order with one FMA each. The four warps'
// partial results then meet in the order 0, 1, 2, 3.
constexpr int WARPS = 4;
const float NEG_INF = __int_as_float(0xff800000);
constexpr int LANES = 32;
constexpr int PER_LANE = HD / LANES;
const int heads = q_shape[1];
const int kv_heads = keys_shape[1];
const int capacity = keys_shape[2];
const int r = blockIdx.x / heads;
const int h = blockIdx.x % heads;
const int place = rows[4 * r];
const int slot = rows[4 * r + 1];
const int len = rows[4 * r + 2];
const int first = rows[4 * r + 3];
const int lane = threadIdx.x % LANES;
const int warp = threadIdx.x / LANES;
__shared__ float query[HD];
__shared__ float part_max[WARPS];
__shared__ float part_total[WARPS];
__shared__ float part_out[WARPS][HD];
const T* q_row = q + (static_cast<long>(place) * heads + h) * HD;
const float scale = factors[0];
for (int e = threadIdx.x; e < HD; e += blockDim.x) {
  query[e] = static_cast<float>(q_row[e]) * scale;
}
__syncthreads();
const long base = (static_cast<long>(slot) * kv_heads + h / (heads / kv_heads)) * capacity;
float running = NEG_INF;
float total = 0.0f;
float out[PER_LANE];
#pragma unroll
for (int e = 0; e < PER_LANE; ++e) {
  out[e] = 0.0f;
}
const int last_tile = (len - 1) / LANES;
for (int j = first / LANES + warp; j <= last_tile; j += WARPS) {
  const int t = j * LANES + lane;
  const bool seen = t >= first && t < len;
  float score = NEG_INF;
  if (seen) {
    const T* k_row = keys + (base + t % capacity) * HD;
    float partial[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
    for (int e = 0; e < HD; e += 8) {
      alignas(16) T k8[8];
      *reinterpret_cast<uint4*>(k8) = *reinterpret_cast<const uint4*>(k_row + e);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        partial[i % 4] = __fmaf_rn(query[e + i], static_cast<float>(k8[i]), partial[i % 4]);
      }
    }
    score = __fadd_rn(__fadd_rn(partial[0], partial[1]), __fadd_rn(partial[2], partial[3]));
    if (SOFTCAP) {
      score = factors[1] * tanhf(score / factors[1]);
    }
  }
  float tile_max = score;
#pragma unroll
  for (int offset = LANES / 2; offset > 0; offset /= 2) {
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, offset));
  }
  const float next = fmaxf(running, tile_max);
  const float keep = expf(running - next);
  const float weight = seen ? expf(score - next) : 0.0f;
  float tile_total = weight;
#pragma unroll
  for (int offset = LANES / 2; offset > 0; offset /= 2) {
    tile_total = __fadd_rn(tile_total, __shfl_xor_sync(0xffffffff, tile_total, offset));
  }
  total = __fmaf_rn(total, keep, tile_total);
#pragma unroll
  for (int e = 0; e < PER_LANE; ++e) {
    out[e] = __fmul_rn(out[e], keep);
  }
  for (int i = 0; i < LANES; ++i) {
    const float w = __shfl_sync(0xffffffff, weight, i);
    const int ti = j * LANES + i;
    if (ti >= first && ti < len) {
      const T* v_row = values + (base + ti % capacity) * HD + lane * PER_LANE;
#pragma unroll
      for (int e = 0; e < PER_LANE; ++e) {
        out[e] = __fmaf_rn(w, static_cast<float>(v_row[e]), out[e]);
      }
    }
  }
  running = next;
}
if (lane == 0) {
  part_max[warp] = running;
  part_total[warp] = total;
}
#pragma unroll
for (int e = 0; e < PER_LANE; ++e) {
  part_out[warp][lane * PER_LANE + e] = out[e];
}
__syncthreads();
if (warp == 0) {
  float most = part_max[0];
#pragma unroll
  for (int w = 1; w < WARPS; ++w) {
    most = fmaxf(most, part_max[w]);
  }
  float sum = 0.0f;
  float acc[PER_LANE];
#pragma unroll
  for (int e = 0; e < PER_LANE; ++e) {
    acc[e] = 0.0f;
  }
#pragma unroll
  for (int w = 0; w < WARPS; ++w) {
    // A warp that saw no tile holds -inf, 0 and zeros: it adds nothing.
    const float f = part_max[w] == NEG_INF ? 0.0f : expf(part_max[w] - most);
    sum = __fmaf_rn(part_total[w], f, sum);
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) {
      acc[e] = __fmaf_rn(part_out[w][lane * PER_LANE + e], f, acc[e]);
    }
  }
  T* y_row = y + (static_cast<long>(r) * heads + h) * HD + lane * PER_LANE;
#pragma unroll
  for (int e = 0; e < PER_LANE; ++e) {
    y_row[e] = static_cast<T>(__fdiv_rn(acc[e], sum));
  }
}
