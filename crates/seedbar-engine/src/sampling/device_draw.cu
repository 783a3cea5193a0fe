// Each row's token from its logits, drawn as the host draws it (`gumbel_max` in
// `sampling.rs`): the first entry of the largest score, where a sampled row's score is
// `logit · (1/T) + noise` (a correctly rounded f32 product, then sum) with the keyed noise
// of its seed and position computed here, and a greedy row's is its logit. Body of an MLX
// custom CUDA kernel (MLX writes the signature): inputs logits [R, V] float32 and rows
// uint32 [4 R] (per row: its noise key's low and high words, the bits of 1/T as f32, and
// 1 when greedy); output y [R] uint32. Launch R blocks of THREADS threads.
//
// Thread t takes entries t, t + THREADS, ... keeping the first of its largest scores; the
// threads' bests then meet, a larger score or an equal one of a lower entry winning, so
// the result is the lowest entry of the largest score whatever the split. A NaN score never
// wins; where no score exceeds -inf the draw is entry 0, and a greedy row whose entry 0 is
// NaN draws 0, as the host's draws do.
constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int NONE = 0x7fffffff;
const float NEG_INF = __int_as_float(0xff800000);
const int r = blockIdx.x;
const int vocab = logits_shape[1];
const float* l = logits + static_cast<long>(r) * vocab;
const unsigned long long key =
    static_cast<unsigned long long>(rows[4 * r]) | (static_cast<unsigned long long>(rows[4 * r + 1]) << 32);
const float inverse_t = __uint_as_float(rows[4 * r + 2]);
const bool greedy = rows[4 * r + 3] != 0;
float best = NEG_INF;
int best_at = NONE;
for (int i = threadIdx.x; i < vocab; i += THREADS) {
  const float score = greedy ? l[i] : __fadd_rn(__fmul_rn(l[i], inverse_t), seedbar_gumbel(key, i));
  if (score > best) {
    best = score;
    best_at = i;
  }
}
#pragma unroll
for (int offset = 16; offset > 0; offset /= 2) {
  const float other = __shfl_down_sync(0xffffffff, best, offset);
  const int other_at = __shfl_down_sync(0xffffffff, best_at, offset);
  if (other > best || (other == best && other_at < best_at)) {
    best = other;
    best_at = other_at;
  }
}
__shared__ float warp_best[WARPS];
__shared__ int warp_at[WARPS];
if (threadIdx.x % 32 == 0) {
  warp_best[threadIdx.x / 32] = best;
  warp_at[threadIdx.x / 32] = best_at;
}
__syncthreads();
if (threadIdx.x == 0) {
  for (int w = 1; w < WARPS; ++w) {
    if (warp_best[w] > best || (warp_best[w] == best && warp_at[w] < best_at)) {
      best = warp_best[w];
      best_at = warp_at[w];
    }
  }
  const bool none = best_at == NONE || (greedy && isnan(l[0]));
  y[r] = none ? 0u : static_cast<unsigned int>(best_at);
}
