//! The batch layout of one engine step: which matmul groups the rows' tokens form and how
//! their attention runs. Model files stay architecture math; this module owns the layout,
//! chosen once per model by backend, dtype and quantization (docs/batch-layout.md has the
//! table and the MLX kernel rule behind each choice).
//!
//! Batch invariance rests on one rule (shared/gpu-invariance.md §0): every MLX kernel
//! reduces a row over its own data only, and picks its algorithm from the matmul's shape.
//! So a row's numbers cannot depend on its neighbours when every matmul it takes part in
//! has a shape fixed by that row alone: a decode row always sits in a zero-padded group of
//! exactly `decode_width` rows (or, where products run row-wise, on a kernel that sums each
//! row the same way at any row count), a prefill chunk (aligned to absolute positions by the
//! scheduler) is a matmul of its own, and attention runs at a capacity that is a function
//! of the row's own length.

use std::collections::HashMap;

use mlx_rs::Array;

use super::{positions::RowPositions, row_products};
use crate::runtime::Backend;

/// Prompts are prefilled in chunks that start at multiples of the layout's chunk
/// ([`Layout::prefill_chunk`]), an absolute position, so a prompt's numerics never depend
/// on how it arrived. This is the CPU's, where a chunk's cost is its arithmetic.
pub const PREFILL_CHUNK: usize = 128;

/// The GPU layouts' chunk: there each matmul and attention call of a chunk costs a launch
/// (tens of microseconds of host time for a cuBLAS or cuDNN call) whatever its length, so a
/// 512-token prompt runs in one pass, as mlx-lm's prefill does (128-token chunks ran a
/// 512-token prefill at 0.47× mlx-lm's speed on an H200).
pub const GPU_PREFILL_CHUNK: usize = 512;

/// The fewest slots one pooled attention call covers (and a class grows by); a pool's
/// calls cover more where its layout allows
/// ([`KvPool::call_slots`](crate::step::kv_cache::KvPool::call_slots)).
pub const MIN_CALL_SLOTS: i32 = 8;

/// How attention runs over the rows of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionLayout {
    /// Each row against its own unpadded cache, one call per row (invariant; the CPU's
    /// layout, where the per-call cost is small).
    PerRow,
    /// Decode rows attend at their cache's capacity (a multiple of the KV block, a function
    /// of the row's own length; a sliding-window layer's stops at its window's ring) with the
    /// positions beyond their length (or outside the window) masked, from a
    /// [`KvPool`](crate::step::kv_cache::KvPool) slot, in calls of a fixed number of slots of one
    /// capacity (`KvPool::call_slots`: a function of the capacity). The call's shape is
    /// fixed by the row, so it is invariant, and rows batch. Prefill chunks attend per row.
    Capacity,
    /// Decode steps stack every row's cache, zero-padded to the longest, into one masked
    /// attention call: the usual batched layout, whose reductions depend on the batch. Kept
    /// only to measure what invariance costs.
    Padded,
}

/// Measured invariant at 4, 8 and 16 (not 5 or 7); 8 is the CPU scheduler's row count, so
/// a full step reads the weights once.
const CPU_DECODE_WIDTH: usize = 8;

/// Pool slots a class grows by on CUDA: the GPU scheduler's default row count.
const CUDA_CALL_SLOTS: i32 = 32;

/// How pooled decode rows attend ([`AttentionLayout::Capacity`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PooledAttention {
    /// Calls of [`KvPool::call_slots`](crate::step::kv_cache::KvPool::call_slots) slots of
    /// one capacity through MLX's fused attention with a mask: the call's shape is a
    /// function of the row's capacity, so a row gets its bits in any call.
    MaskedCalls,
    /// Each query over its own positions (`step::pooled_attention`: Seedbar's kernel on
    /// CUDA, a call per query elsewhere), in an order those positions fix: a row's bits do
    /// not depend on its capacity, its slot or the step, and a query at position `p` gets
    /// what any other query at `p` of its row gets.
    PerQuery,
}

/// How a step's dense matmuls run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Products {
    /// MLX's matmul (BLAS, cuBLAS, Metal's kernels), which picks its algorithm by the row
    /// count: decode groups are padded to exactly `decode_width` rows.
    Matmul,
    /// Products of at most [`row_products::MAX_ROWS`] rows through
    /// [`row_products`](crate::step::row_products)' kernels, whose rows get the same bits at
    /// any row count:
    /// decode groups of up to `decode_width` rows and the output head's groups run unpadded
    /// (longer prefill chunks keep MLX's matmul, each a matmul of its own).
    RowWise,
}

/// A backend's layout for every step of one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Rows of every decode matmul group (zero rows pad the last one, unless `products` is
    /// [`Products::RowWise`]); `None` puts all of
    /// a step's tokens into one matmul: invariant only on matmuls whose rows are independent
    /// at any row count (the CPU kernels); elsewhere the reference layout, where a row's
    /// numbers follow the step's row count.
    pub decode_width: Option<usize>,
    pub attention: AttentionLayout,
    /// Whether a position's KV (and so all that follows from it) is the same however the
    /// row's tokens were split into steps: prefill chunks of any length at any offset, or
    /// one decoded token at a time. Then prefill chunks need no alignment, and the prefix
    /// cache reuses KV up to any position, decoded positions included. Otherwise chunks
    /// end at absolute multiples of `prefill_chunk`, and reuse stops at such a boundary
    /// within the prompt, so a hit prefills the rest in the chunks a miss would. Only the
    /// packed CPU path claims it: elsewhere decode groups are not prefill chunks.
    pub kv_independent_of_steps: bool,
    /// The most pool slots one masked decode-attention call covers, and the slots a pool
    /// class grows by ([`KvPool::new`](crate::step::kv_cache::KvPool::new)): on Metal a
    /// call stays at the pool's minimum; on CUDA, whose rows attend per query, a class grows
    /// from one slot, doubling, to the 32 rows a step decodes, then by 32.
    pub pool_call_slots: i32,
    /// How pooled decode rows attend: in masked calls of a fixed slot count per capacity
    /// through MLX's fused kernel (Metal's vector kernel takes the mask), or each query over
    /// its own positions (CUDA, where MLX's fused kernel takes no mask and its fallback
    /// broadcasts the keys to every query head, `gpu-invariance.md` §2.3).
    pub pooled: PooledAttention,
    pub products: Products,
    /// Aligned prefill chunks end at multiples of this absolute position
    /// ([`PREFILL_CHUNK`] on the CPU, [`GPU_PREFILL_CHUNK`] on GPUs).
    pub prefill_chunk: usize,
    /// Whether a step's prefill chunk must end at such a multiple ([`chunk_end`]): every
    /// invariant layout where KV depends on how steps split a row. The packed CPU path's
    /// and the reference's run as much of a prompt as the step's budget allows.
    ///
    /// [`chunk_end`]: Layout::chunk_end
    pub aligned_chunks: bool,
}

/// The weights' format, as far as the layout cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightKind {
    Dense,
    Quantized,
    /// Every matmul on `seedbar_kernels`'s CPU kernels (4/8-bit weights on the CPU backend)
    /// in a float32 model: the host path of `architectures/decoder.rs` runs it.
    Packed,
}

impl Layout {
    /// The fastest layout without the invariance promise (bench reference only).
    pub const REFERENCE: Layout = Layout {
        decode_width: None,
        attention: AttentionLayout::Padded,
        kv_independent_of_steps: false,
        pool_call_slots: MIN_CALL_SLOTS,
        pooled: PooledAttention::MaskedCalls,
        products: Products::Matmul,
        prefill_chunk: PREFILL_CHUNK,
        aligned_chunks: false,
    };

    /// The invariant layout for this process's MLX backend and the model's weights.
    pub fn invariant(weights: WeightKind) -> Layout {
        Layout::for_backend(Backend::current(), weights)
    }

    /// The invariant layout of `backend` for `weights` (tests run a GPU's layout on the CPU).
    pub fn for_backend(backend: Backend, weights: WeightKind) -> Layout {
        let gpu = |decode_width| Layout {
            decode_width: Some(decode_width),
            attention: AttentionLayout::Capacity,
            kv_independent_of_steps: false,
            pool_call_slots: if backend == Backend::Cuda {
                CUDA_CALL_SLOTS
            } else {
                MIN_CALL_SLOTS
            },
            pooled: if backend == Backend::Cuda {
                PooledAttention::PerQuery
            } else {
                PooledAttention::MaskedCalls
            },
            products: Products::Matmul,
            prefill_chunk: GPU_PREFILL_CHUNK,
            aligned_chunks: true,
        };
        // Per-row attention on each row's own cache, MLX's matmuls, 128-token chunks.
        let cpu = |decode_width, kv_independent_of_steps| Layout {
            decode_width,
            attention: AttentionLayout::PerRow,
            kv_independent_of_steps,
            pool_call_slots: MIN_CALL_SLOTS,
            pooled: PooledAttention::MaskedCalls,
            products: Products::Matmul,
            prefill_chunk: PREFILL_CHUNK,
            aligned_chunks: !kv_independent_of_steps,
        };
        match (backend, weights) {
            // seedbar_kernels sums each (row, column) in one order for any row count, and
            // every other op of a step (norms, RoPE, per-row attention) is per row: a step's
            // tokens share one matmul and a lone row pays for no padding.
            // And the host path (`architectures/host.rs`) computes a position the same way in any
            // chunk, prefilled or decoded (row-wise math, one attention function per query),
            // so KV does not depend on how steps split a row, and the prefix cache may reuse
            // it at any position (`prefix_cache_hit_equals_miss` crosses decoded positions
            // here, `a_prefix_hit_reuses_every_common_position` ends mid-chunk).
            (Backend::Cpu, WeightKind::Packed) => cpu(None, true),
            // cblas_sgemm for every M (cpu/gemms/cblas.cpp), but inside OpenBLAS the rows
            // past the last whole microkernel tile take tail kernels that sum differently.
            (Backend::Cpu, _) => cpu(Some(CPU_DECODE_WIDTH), false),
            // Dense M >= 2 goes to cuBLASLt, whose algorithm and split-K follow M; quantized
            // M < 8 to qmv (a per-row grid) and above to qmm_sm80 with tile_m from M. And each
            // call costs more to launch than a decode step's work at a few rows: Seedbar's
            // row kernels instead, whose rows are independent of M, in unpadded groups of up
            // to 32 rows (the GPU scheduler's row count, so a full step reads each weight
            // once, and one row reads it at a vector product's speed).
            // (Packed weights exist on the CPU backend only.)
            (Backend::Cuda, _) => Layout {
                products: Products::RowWise,
                ..gpu(row_products::MAX_ROWS as usize)
            },
            // gemv_wide uses 16 K-lanes for M in 6..=15 (M3+); steel split-K above.
            (Backend::Metal, WeightKind::Dense) => gpu(8),
            // qmv_wide is identical for 2 <= M < the chip's vector limit (>= 6): one
            // 5-vector tile per weight pass.
            (Backend::Metal, WeightKind::Quantized | WeightKind::Packed) => gpu(5),
        }
    }

    /// Where a step's prefill chunk of a `len`-token prompt that starts at `start` ends,
    /// with `budget` prefill tokens left in the step: at the next aligned end
    /// ([`aligned_chunk_end`](Self::aligned_chunk_end)) where chunks are aligned, else
    /// wherever the budget runs out (at least one token).
    pub fn chunk_end(&self, start: usize, len: usize, budget: usize) -> usize {
        if self.aligned_chunks {
            self.aligned_chunk_end(start, len)
        } else {
            (start + budget.max(1)).min(len)
        }
    }

    /// The next multiple of [`prefill_chunk`](Self::prefill_chunk) after `start`, an
    /// absolute position, or the prompt's end: a prompt's chunks are then the same alone,
    /// batched, or after a prefix-cache hit.
    pub fn aligned_chunk_end(&self, start: usize, len: usize) -> usize {
        ((start / self.prefill_chunk + 1) * self.prefill_chunk).min(len)
    }

    /// Whether drafted tokens can be verified exactly: a row running its last token and its
    /// drafts as one chunk gets, at each of their positions, the logits one decode step a
    /// token would give, so a draft kept is the token plain decoding draws there. Either
    /// every position is computed the same way in any chunk (the packed CPU path), or the
    /// chunk runs as decode places ([`verifies_in_decode_groups`]).
    ///
    /// [`verifies_in_decode_groups`]: Self::verifies_in_decode_groups
    pub fn verifies_drafts(&self) -> bool {
        self.kv_independent_of_steps || self.verifies_in_decode_groups()
    }

    /// Whether a verify chunk's tokens run as decode places, each at its own position: in
    /// the decode groups (row-wise products: a row's bits at any row count) and pooled
    /// attention per query (a query at position `p` gets what a decode step at `p` gets),
    /// so each position is computed as a decode step computes it (CUDA's layout).
    pub fn verifies_in_decode_groups(&self) -> bool {
        self.attention == AttentionLayout::Capacity
            && self.pooled == PooledAttention::PerQuery
            && self.products == Products::RowWise
    }

    /// Reused prompt KV ends at a multiple of this many tokens: the prefill chunk where KV
    /// depends on how steps split a row (so the rest is prefilled in the chunks a cold
    /// start uses), any position where it does not.
    pub fn reuse_granularity(&self) -> usize {
        if self.kv_independent_of_steps {
            1
        } else {
            self.prefill_chunk
        }
    }
}

/// Where one row's tokens sit in the step's matmul groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub group: usize,
    /// First position of the row inside its group.
    pub offset: i32,
    pub len: i32,
}

/// One step's layout: the matmul groups (each a `[1, width, D]` activation), where each
/// row sits in them, and the groups the rows' last positions form for the output head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepPlan {
    /// Rows of each matmul group, padding included.
    pub widths: Vec<i32>,
    /// Whether each group is one of decode places (one token each, or a verify chunk's
    /// tokens each at its own position), which run as a whole; else a prefill chunk.
    pub decode: Vec<bool>,
    /// Tokens of each group that belong to rows (the rest is padding).
    pub filled: Vec<i32>,
    pub slots: Vec<Slot>,
    /// Rows of each output-head group (one position per row of the step, in row order).
    pub head_widths: Vec<i32>,
    pub attention: AttentionLayout,
    /// [`Layout::pooled`].
    pub pooled: PooledAttention,
    /// [`Layout::products`].
    pub products: Products,
    /// Each row's rotary positions ([`StepPlan::placed`]); empty: every row's token at
    /// sequence index `s` rotates by `s`.
    pub positions: Vec<RowPositions>,
}

impl StepPlan {
    /// The plan for rows running `lens[i]` new tokens each; `verify[i]` (if given) says row
    /// `i`'s chunk verifies drafted tokens, which runs as decode places where the layout
    /// [`verifies_in_decode_groups`](Layout::verifies_in_decode_groups).
    pub fn new(layout: &Layout, lens: &[i32], verify: &[bool]) -> StepPlan {
        let mut plan = StepPlan {
            widths: Vec::new(),
            decode: Vec::new(),
            filled: Vec::new(),
            slots: Vec::with_capacity(lens.len()),
            head_widths: Vec::new(),
            attention: layout.attention,
            pooled: layout.pooled,
            products: layout.products,
            positions: Vec::new(),
        };
        let Some(width) = layout.decode_width.map(|w| w as i32) else {
            let mut offset = 0;
            for &len in lens {
                plan.slots.push(Slot {
                    group: 0,
                    offset,
                    len,
                });
                offset += len;
            }
            plan.widths.push(offset);
            plan.decode.push(lens.iter().all(|&len| len == 1));
            plan.filled.push(offset);
            plan.head_widths.push(lens.len() as i32);
            return plan;
        };
        // Single tokens (and verify chunks where they are decode places) share fixed-width
        // groups; longer chunks are matmuls of their own.
        let in_decode_groups = layout.verifies_in_decode_groups();
        let mut open: Option<usize> = None;
        for (i, &len) in lens.iter().enumerate() {
            let places = len == 1 || (in_decode_groups && verify.get(i) == Some(&true));
            let group = match open.filter(|_| places) {
                Some(g) if plan.filled[g] + len <= width => g,
                _ => {
                    plan.widths.push(if places { width.max(len) } else { len });
                    plan.decode.push(places);
                    plan.filled.push(0);
                    let g = plan.widths.len() - 1;
                    if places {
                        open = Some(g);
                    }
                    g
                }
            };
            plan.slots.push(Slot {
                group,
                offset: plan.filled[group],
                len,
            });
            plan.filled[group] += len;
        }
        let rows = lens.len() as i32;
        plan.head_widths = vec![width; (rows as usize).div_ceil(width as usize)];
        if layout.products == Products::RowWise {
            plan.widths.clone_from(&plan.filled);
            if let Some(last) = plan.head_widths.last_mut() {
                *last = rows - width * ((rows - 1) / width);
            }
        }
        plan
    }

    /// The plan with row `i`'s rotary positions `positions[i]` (one per row, or none).
    pub fn placed(mut self, positions: &[RowPositions]) -> StepPlan {
        if positions.iter().any(|p| !p.is_plain()) {
            self.positions = positions.to_vec();
        }
        self
    }

    /// The (time, row, column) rotary position of row `row`'s token at sequence index `s`.
    pub fn rope_position(&self, row: usize, s: usize) -> [i32; 3] {
        match self.positions.get(row) {
            Some(p) => p.at(s),
            None => [s as i32; 3],
        }
    }

    /// Where row `row`'s tokens at sequence indices `start..end` rotate as `index + shift`,
    /// the shift; `None` where the span holds an image token of a multimodal-RoPE row.
    pub fn text_shift(&self, row: usize, start: usize, end: usize) -> Option<i32> {
        match self.positions.get(row) {
            Some(p) => p.text_shift(start, end),
            None => Some(0),
        }
    }

    /// Whether group `g` holds decode places, which run as a whole ([`StepPlan::decode`]).
    pub fn is_decode_group(&self, group: usize) -> bool {
        self.decode[group]
    }

    /// The rows of group `g`, in position order.
    pub fn rows_of(&self, group: usize) -> impl Iterator<Item = usize> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(move |(_, s)| s.group == group)
            .map(|(i, _)| i)
    }
}

/// A step's small index arrays on the device, each uploaded once however many layers read
/// it: every upload is a copy into device memory that the first kernel reading it waits
/// for.
#[derive(Default)]
pub struct Uploads(HashMap<Vec<i32>, Array>);

impl Uploads {
    /// `values` as a `[n]` int32 array (looked up without a copy of `values`: layers ask
    /// for the same ones).
    pub fn get(&mut self, values: &[i32]) -> &Array {
        if !self.0.contains_key(values) {
            let array = Array::from_slice(values, &[values.len() as i32]);
            self.0.insert(values.to_vec(), array);
        }
        &self.0[values]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_runs_every_token_in_one_matmul() {
        let plan = StepPlan::new(&Layout::REFERENCE, &[128, 1, 1, 5], &[]);
        assert_eq!(plan.widths, [135]);
        assert_eq!(plan.head_widths, [4]);
        assert_eq!(
            plan.slots[3],
            Slot {
                group: 0,
                offset: 130,
                len: 5
            }
        );
    }

    #[test]
    fn the_cpu_decodes_in_groups_of_eight() {
        let cpu = Layout::for_backend(Backend::Cpu, WeightKind::Quantized);
        let plan = StepPlan::new(&cpu, &[128, 1, 1, 5], &[]);
        assert_eq!(plan.widths, [128, 8, 5]);
        assert_eq!(plan.filled, [128, 2, 5]);
        assert_eq!(plan.head_widths, [8]);
        assert_eq!(
            plan.slots[2],
            Slot {
                group: 1,
                offset: 1,
                len: 1
            }
        );
    }

    #[test]
    fn the_cpu_kernels_run_a_step_as_one_unpadded_matmul() {
        let packed = Layout::for_backend(Backend::Cpu, WeightKind::Packed);
        let plan = StepPlan::new(&packed, &[128, 1, 1, 5], &[]);
        assert_eq!((plan.widths, plan.filled), (vec![135], vec![135]));
        assert_eq!(plan.head_widths, [4]);
        assert_eq!(plan.attention, AttentionLayout::PerRow);
        let alone = StepPlan::new(&packed, &[1], &[]);
        assert_eq!((alone.widths, alone.head_widths), (vec![1], vec![1]));
    }

    #[test]
    fn gpu_decode_rows_fill_fixed_width_groups_and_chunks_stand_alone() {
        let metal = Layout::for_backend(Backend::Metal, WeightKind::Dense);
        let mut lens = vec![1; 20];
        lens.insert(3, 128);
        lens.push(7);
        let plan = StepPlan::new(&metal, &lens, &[]);
        assert_eq!(plan.widths, [8, 128, 8, 8, 7]);
        assert_eq!(plan.filled, [8, 128, 8, 4, 7]);
        let slot = |group, offset, len| Slot { group, offset, len };
        assert_eq!(plan.slots[3], slot(1, 0, 128));
        assert_eq!(plan.slots[16], slot(2, 7, 1));
        assert_eq!(plan.slots[17], slot(3, 0, 1));
        assert_eq!(plan.head_widths, [8, 8, 8]);
        // A row alone gets the same shapes as in a crowd.
        let alone = StepPlan::new(&metal, &[1], &[]);
        assert_eq!((alone.widths, alone.head_widths), (vec![8], vec![8]));
    }

    #[test]
    fn row_wise_products_leave_decode_and_head_groups_unpadded() {
        for weights in [WeightKind::Dense, WeightKind::Quantized] {
            assert_eq!(
                Layout::for_backend(Backend::Cuda, weights).products,
                Products::RowWise
            );
        }
        let cuda = Layout::for_backend(Backend::Cuda, WeightKind::Quantized);
        let mut lens = vec![1; 40];
        lens.insert(3, 128);
        let plan = StepPlan::new(&cuda, &lens, &[]);
        assert_eq!(plan.widths, [32, 128, 8]);
        assert_eq!(plan.filled, plan.widths);
        assert_eq!(plan.head_widths, [32, 9]);
        let alone = StepPlan::new(&cuda, &[1], &[]);
        assert_eq!((alone.widths, alone.head_widths), (vec![1], vec![1]));
    }

    #[test]
    fn gpus_prefill_in_longer_chunks_than_the_cpu() {
        for weights in [WeightKind::Dense, WeightKind::Quantized] {
            for backend in [Backend::Cuda, Backend::Metal] {
                let layout = Layout::for_backend(backend, weights);
                assert_eq!(layout.prefill_chunk, GPU_PREFILL_CHUNK);
            }
            assert_eq!(
                Layout::for_backend(Backend::Cpu, weights).prefill_chunk,
                PREFILL_CHUNK
            );
        }
    }
}
