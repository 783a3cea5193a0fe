// One query token per (row, head) against a pool class's keys and values, each output
// computed from the query's own positions alone, in an order fixed by those positions: the
// same bits whatever the class's capacity, slot or companions, alone or in any step. Body
// of an MLX custom CUDA kernel (MLX writes the signature): inputs q [P, H, HD] of type T
// (rotated queries, in any order), keys and values [S, KVH, C, HD] of type T (the class's
// buffers: position t of slot s at index t % C), and rows int32 [2 + 4 R] (the bits of the
// score's scale and, where SOFTCAP, the logit cap as float32, then per output row: the
// query's place in q, its slot, its length — it sees positions before it — and its first
// visible position); output y [R, H · HD]; template arguments T, HD (head dim, a multiple of 32
// and of 8), SOFTCAP (0 or 1) and GROUP (query heads per block: 1, or all the heads of a
// key-value head, which then reads each key and value once for all of them). Launch
// R · H / GROUP blocks of 128 threads.
//
// The sum, per query head: the positions run in tiles of 32 at absolute multiples of 32;
// warp w of the block takes the query's tiles w, w + 4, ... (counted from the tile of its
// first position). Per tile, lane l scores position 32 j + l (a dot product over the head
// in four fixed interleaved partial sums, then (0 + 1) + (2 + 3)), the warp folds it into
// its running maximum, total and output (online softmax: each scaled by exp(old max - new
// max)), each output element adding the tile's positions in order with one FMA each (their
// values loaded eight positions at a time ahead of the sums). The four warps' partial
// results then meet in the order 0, 1, 2, 3. GROUP changes which thread does a head's
// operations, never the operations or their order: a head's output is the same bits at
// GROUP 1 and at GROUP H / KVH.
constexpr int WARPS = 4;
const float NEG_INF = __int_as_float(0xff800000);
constexpr int LANES = 32;
constexpr int PER_LANE = HD / LANES;
// A lane's PER_LANE values of a position, loaded at once (4, 8 or 16 bytes).
struct alignas(PER_LANE * sizeof(T)) Span {
  T e[PER_LANE];
};
constexpr int SPANS = 8;
const int heads = q_shape[1];
const int kv_heads = keys_shape[1];
const int capacity = keys_shape[2];
const int r = blockIdx.x / (heads / GROUP);
const int h0 = blockIdx.x % (heads / GROUP) * GROUP;
const int place = rows[2 + 4 * r];
const int slot = rows[3 + 4 * r];
const int len = rows[4 + 4 * r];
const int first = rows[5 + 4 * r];
const float scale = __int_as_float(rows[0]);
const float cap = __int_as_float(rows[1]);
const int lane = threadIdx.x % LANES;
const int warp = threadIdx.x / LANES;
__shared__ float query[GROUP][HD];
__shared__ float part_max[WARPS][GROUP];
__shared__ float part_total[WARPS][GROUP];
__shared__ float part_out[WARPS][GROUP][HD];
const T* q_rows = q + (static_cast<long>(place) * heads + h0) * HD;
for (int e = threadIdx.x; e < GROUP * HD; e += blockDim.x) {
  query[e / HD][e % HD] = static_cast<float>(q_rows[e]) * scale;
}
__syncthreads();
const long base = (static_cast<long>(slot) * kv_heads + h0 / (heads / kv_heads)) * capacity;
float running[GROUP];
float total[GROUP];
float out[GROUP][PER_LANE];
#pragma unroll
for (int g = 0; g < GROUP; ++g) {
  running[g] = NEG_INF;
  total[g] = 0.0f;
#pragma unroll
  for (int e = 0; e < PER_LANE; ++e) {
    out[g][e] = 0.0f;
  }
}
const int last_tile = (len - 1) / LANES;
for (int j = first / LANES + warp; j <= last_tile; j += WARPS) {
  const int t = j * LANES + lane;
  const bool seen = t >= first && t < len;
  float score[GROUP];
#pragma unroll
  for (int g = 0; g < GROUP; ++g) {
    score[g] = NEG_INF;
  }
  if (seen) {
    const T* k_row = keys + (base + t % capacity) * HD;
    float partial[GROUP][4];
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
      partial[g][0] = partial[g][1] = partial[g][2] = partial[g][3] = 0.0f;
    }
#pragma unroll (GROUP == 1 ? HD / 8 : 4)
    for (int e = 0; e < HD; e += 8) {
      alignas(16) T k8[8];
      *reinterpret_cast<uint4*>(k8) = *reinterpret_cast<const uint4*>(k_row + e);
#pragma unroll
      for (int g = 0; g < GROUP; ++g) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          partial[g][i % 4] = __fmaf_rn(query[g][e + i], static_cast<float>(k8[i]), partial[g][i % 4]);
        }
      }
    }
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
      score[g] = __fadd_rn(__fadd_rn(partial[g][0], partial[g][1]), __fadd_rn(partial[g][2], partial[g][3]));
      if (SOFTCAP) {
        score[g] = cap * tanhf(score[g] / cap);
      }
    }
  }
  float weight[GROUP];
#pragma unroll
  for (int g = 0; g < GROUP; ++g) {
    float tile_max = score[g];
#pragma unroll
    for (int offset = LANES / 2; offset > 0; offset /= 2) {
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, offset));
    }
    const float next = fmaxf(running[g], tile_max);
    const float keep = expf(running[g] - next);
    weight[g] = seen ? expf(score[g] - next) : 0.0f;
    float tile_total = weight[g];
#pragma unroll
    for (int offset = LANES / 2; offset > 0; offset /= 2) {
      tile_total = __fadd_rn(tile_total, __shfl_xor_sync(0xffffffff, tile_total, offset));
    }
    total[g] = __fmaf_rn(total[g], keep, tile_total);
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) {
      out[g][e] = __fmul_rn(out[g][e], keep);
    }
    running[g] = next;
  }
  // The tile's values, SPANS positions' loads in flight at a time, then added in order.
  for (int i0 = 0; i0 < LANES; i0 += SPANS) {
    Span v[SPANS];
#pragma unroll
    for (int i = 0; i < SPANS; ++i) {
      const int ti = j * LANES + i0 + i;
      if (ti >= first && ti < len) {
        v[i] = *reinterpret_cast<const Span*>(values + (base + ti % capacity) * HD + lane * PER_LANE);
      }
    }
#pragma unroll
    for (int i = 0; i < SPANS; ++i) {
      float w[GROUP];
#pragma unroll
      for (int g = 0; g < GROUP; ++g) {
        w[g] = __shfl_sync(0xffffffff, weight[g], i0 + i);
      }
      const int ti = j * LANES + i0 + i;
      if (ti >= first && ti < len) {
        const T* vs = reinterpret_cast<const T*>(&v[i]);
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
#pragma unroll
          for (int e = 0; e < PER_LANE; ++e) {
            out[g][e] = __fmaf_rn(w[g], static_cast<float>(vs[e]), out[g][e]);
          }
        }
      }
    }
  }
}
#pragma unroll
for (int g = 0; g < GROUP; ++g) {
  if (lane == 0) {
    part_max[warp][g] = running[g];
    part_total[warp][g] = total[g];
  }
#pragma unroll
  for (int e = 0; e < PER_LANE; ++e) {
    part_out[warp][g][lane * PER_LANE + e] = out[g][e];
  }
}
__syncthreads();
// Warp w meets the four warps' parts of heads w, w + 4, ...
for (int g = warp; g < GROUP; g += WARPS) {
  float most = part_max[0][g];
#pragma unroll
  for (int w = 1; w < WARPS; ++w) {
    most = fmaxf(most, part_max[w][g]);
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
    const float f = part_max[w][g] == NEG_INF ? 0.0f : expf(part_max[w][g] - most);
    sum = __fmaf_rn(part_total[w][g], f, sum);
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) {
      acc[e] = __fmaf_rn(part_out[w][g][lane * PER_LANE + e], f, acc[e]);
    }
  }
  T* y_row = y + (static_cast<long>(r) * heads + h0 + g) * HD + lane * PER_LANE;
#pragma unroll
  for (int e = 0; e < PER_LANE; ++e) {
    y_row[e] = static_cast<T>(__fdiv_rn(acc[e], sum));
  }
}
