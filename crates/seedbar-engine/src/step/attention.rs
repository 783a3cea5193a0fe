//! How a step's rows attend, apart from the layers' math: decode rows in the GPU decode
//! pool (per query over their own positions on CUDA, `pooled_attention`; in masked calls of
//! a fixed slot count per capacity on Metal), per row on their own caches (the CPU), or
//! padded together (the reference); each prefill chunk on its row's cache. A verify chunk's
//! tokens may run as decode places of the pool (`Layout::verifies_in_decode_groups`). A
//! layer hands its projected queries, keys and values here through [`AttentionMath`], which
//! the decoder's attention implements, and gets its groups' outputs back in the plan's
//! layout.

use std::collections::{hash_map::Entry, BTreeMap, HashMap};

use mlx_rs::{fast::ScaledDotProductAttentionMask, ops, ops::indexing::IndexOp, Array, Dtype};

use super::{
    groups::{join_rows, pick_rows},
    kv_cache::{KvCache, KvPool},
    plan::{AttentionLayout, PooledAttention, StepPlan, Uploads},
    pooled_attention::{self, QueryRow},
};
use crate::error::Result;

/// Which projection a split into heads is of (queries and keys may be normed per head).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Queries,
    Keys,
    Values,
}

/// A layer's attention math, as a step's attention uses it: its heads, its positions (RoPE
/// and window) and scaled dot-product attention of given queries, keys and values. Which
/// rows attend together, over which keys, is this module's.
pub trait AttentionMath {
    fn heads(&self) -> i32;
    fn kv_heads(&self) -> i32;
    fn head_dim(&self) -> i32;
    /// A query at position `p` sees keys in `(p - window, p]`; `None`: every earlier key.
    fn window(&self) -> Option<i32>;
    /// `[B, n, L, hd]` from `[B, L, n·hd]` (`n` the part's heads), normed per head where
    /// the layer norms that part.
    fn split_heads(&self, x: Array, part: Part) -> Result<Array>;
    /// `[W, n, 1, hd]` from a decode group's `[1, W, n·hd]` (each row one position), normed
    /// per head where the layer norms that part: [`split_heads`](Self::split_heads) of
    /// each row, in one reshape (the axes it would swap hold one element).
    fn row_heads(&self, x: Array, part: Part) -> Result<Array>;
    /// RoPE for positions `offset..` (`x` is `[B, H, L, hd]`); `x` in a layer without.
    fn rotate(&self, x: Array, offset: i32) -> Result<Array>;
    /// RoPE with row `b` at `positions[b]` (`x` is `[B, H, 1, hd]`).
    fn rotate_at(&self, x: Array, positions: &Array) -> Result<Array>;
    /// Multimodal RoPE: the token at `(b, l)` of `x` (`[B, H, L, hd]`) at the (time, row,
    /// column) position `positions[b * L + l]`.
    fn rotate_grid(&self, x: Array, positions: &[[i32; 3]]) -> Result<Array>;
    /// Scaled dot-product attention.
    fn attend(
        &self,
        q: Array,
        k: Array,
        v: Array,
        mask: Option<ScaledDotProductAttentionMask>,
    ) -> Result<Array>;
    /// Scores are `q · k` times this.
    fn scale(&self) -> f32;
    /// Scores are capped to `cap · tanh(s / cap)` (Gemma 2), if any.
    fn softcap(&self) -> Option<f32>;
}

/// Each group's projected queries, keys and values (`[1, W, .]`) attended per row or in
/// batches as `plan` says; the rows' outputs are laid back into their groups'
/// `[1, W, H·hd]` (zero rows where a group is padded), before the output projection.
pub fn attend_groups(
    layer: &impl AttentionMath,
    QueriesKeysValues(projected): QueriesKeysValues,
    plan: &StepPlan,
    caches: &mut [&mut KvCache],
    decode_kv: &mut DecodeKv,
) -> Result<Vec<Array>> {
    let pooled = plan.attention == AttentionLayout::Capacity;
    // Queries, keys and values, RoPE applied. A decode group is split into heads and
    // rotated as a whole (`[W, H, 1, hd]`, each row at its own position) and kept whole
    // for pooled attention or cut into rows; a prefill chunk is a row of its own
    // (`[1, H, len, hd]`).
    let mut groups: Vec<Option<(Array, Array, Array)>> = vec![None; plan.widths.len()];
    let mut rows: Vec<Option<(Array, Array, Array)>> = vec![None; plan.slots.len()];
    for g in 0..plan.widths.len() {
        let members: Vec<usize> = plan.rows_of(g).collect();
        if plan.is_decode_group(g) {
            let width = plan.widths[g];
            let mut positions = vec![[0i32; 3]; width as usize];
            // Which places run an image token (a one-token prefill chunk over an image). A
            // verify chunk's tokens are places at consecutive positions.
            let mut on_grid = vec![false; width as usize];
            for &i in &members {
                let (start, s) = (plan.slots[i].offset as usize, caches[i].len() as usize);
                for j in 0..plan.slots[i].len as usize {
                    positions[start + j] = plan.rope_position(i, s + j);
                    on_grid[start + j] = plan.text_shift(i, s + j, s + j + 1).is_none();
                }
            }
            let at: Vec<i32> = positions.iter().map(|p| p[0]).collect();
            let at = decode_kv.uploads.get(&at).clone();
            // An image token rotates on its grid, as in any chunk over it, picked into place:
            // the text rows keep the bits they get in any group.
            let rotate = |x: Array| -> Result<Array> {
                let text = layer.rotate_at(x.clone(), &at)?;
                if !on_grid.contains(&true) {
                    return Ok(text);
                }
                let mask = Array::from_slice(&on_grid, &[width, 1, 1, 1]);
                Ok(ops::select(&mask, layer.rotate_grid(x, &positions)?, text)?)
            };
            let (q, k, v) = match &projected[g] {
                Projected::Parts(q, k, v) => (
                    rotate(layer.row_heads(q.clone(), Part::Queries)?)?,
                    rotate(layer.row_heads(k.clone(), Part::Keys)?)?,
                    layer.row_heads(v.clone(), Part::Values)?,
                ),
                Projected::Joined(qkv) => {
                    // `[W, H + 2·kv, 1, hd]`: queries and keys are its first heads, rotated
                    // in one call (a row's heads all at its position), then sliced apart
                    // (views; more than one row's are copied out whole for RoPE).
                    let (h, kv) = (layer.heads(), layer.kv_heads());
                    let heads = qkv.reshape(&[width, h + 2 * kv, 1, layer.head_dim()])?;
                    let qk = heads.index((.., ..h + kv));
                    let qk = rotate(if width > 1 { qk.contiguous()? } else { qk })?;
                    (
                        qk.index((.., ..h)),
                        qk.index((.., h..)),
                        heads.index((.., h + kv..)),
                    )
                }
            };
            if pooled {
                groups[g] = Some((q, k, v));
                continue;
            }
            for &i in &members {
                debug_assert_eq!(plan.slots[i].len, 1, "verify chunks are places only pooled");
                let at = plan.slots[i].offset;
                let row = |a: &Array| a.index(at..at + 1);
                rows[i] = Some((row(&q), row(&k), row(&v)));
            }
            continue;
        }
        let Projected::Parts(q_all, k_all, v_all) = &projected[g] else {
            unreachable!("only decode groups are projected joined");
        };
        for &i in &members {
            let slot = &plan.slots[i];
            let span = |a: &Array| a.index((.., slot.offset..slot.offset + slot.len, ..));
            let start = caches[i].len() as usize;
            let end = start + slot.len as usize;
            let shift = plan.text_shift(i, start, end);
            // Over an image: each position on its grid, worked out once for q and k.
            let grid: Vec<[i32; 3]> = match shift {
                Some(_) => Vec::new(),
                None => (start..end).map(|s| plan.rope_position(i, s)).collect(),
            };
            let rotate = |x: Array| match shift {
                Some(shift) => layer.rotate(x, start as i32 + shift),
                None => layer.rotate_grid(x, &grid),
            };
            let q = rotate(layer.split_heads(span(q_all), Part::Queries)?)?;
            let k = rotate(layer.split_heads(span(k_all), Part::Keys)?)?;
            let v = layer.split_heads(span(v_all), Part::Values)?;
            rows[i] = Some((q, k, v));
        }
    }
    let group_outs = if pooled {
        pooled_decode(layer, &groups, plan, caches, decode_kv)?
    } else {
        vec![None; plan.widths.len()]
    };
    // The rows attended one by one (or, in the reference layout, padded together).
    let decoding = plan.slots.len() > 1 && plan.slots.iter().all(|s| s.len == 1);
    let mut outs: Vec<Option<Array>> = vec![None; plan.slots.len()];
    if matches!(plan.attention, AttentionLayout::Padded) && decoding {
        let all = rows.into_iter().map(|r| r.expect("every row")).collect();
        for (i, out) in padded_decode(layer, all, caches)?.into_iter().enumerate() {
            outs[i] = Some(out);
        }
    } else {
        for (i, row) in rows.into_iter().enumerate() {
            if let Some(row) = row {
                outs[i] = Some(own_cache(layer, row, &mut *caches[i])?);
            }
        }
    }
    // Back into the groups' `[1, W, H*hd]` layout, zero rows where a group is padded.
    let width = layer.heads() * layer.head_dim();
    let mut grouped = Vec::with_capacity(plan.widths.len());
    for (g, (&w, &filled)) in plan.widths.iter().zip(&plan.filled).enumerate() {
        let decode = plan.is_decode_group(g);
        let out = match &group_outs[g] {
            // A pooled group's `[W, H·hd]`, as the output projection takes it (its rows
            // add to the residual's `[1, W, D]` by broadcasting).
            Some(out) => out.clone(),
            None => {
                // Decode rows are `[1, H, 1, hd]`, stacked on the first axis; prefill
                // rows are flattened to `[1, len, H*hd]` and joined on the second.
                let mut parts = plan
                    .rows_of(g)
                    .map(|i| {
                        let out = outs[i].take().expect("every row attended");
                        if decode {
                            Ok(out)
                        } else {
                            let len = plan.slots[i].len;
                            Ok(out
                                .transpose_axes(&[0, 2, 1, 3])?
                                .reshape(&[1, len, width])?)
                        }
                    })
                    .collect::<Result<Vec<_>>>()?;
                if filled < w {
                    let mut shape = parts[0].shape().to_vec();
                    shape[if decode { 0 } else { 1 }] = w - filled;
                    parts.push(ops::zeros_dtype(&shape, parts[0].dtype())?);
                }
                let joined = if parts.len() == 1 {
                    parts.pop().expect("one part")
                } else {
                    ops::concatenate(&parts, if decode { 0 } else { 1 })?
                };
                // `[W, H, 1, hd]` holds each row's heads end to end, as `[1, W, H·hd]` does.
                if decode {
                    joined.reshape(&[1, w, width])?
                } else {
                    joined
                }
            }
        };
        grouped.push(out);
    }
    Ok(grouped)
}

/// One row against its own unpadded cache (causal within a prefill chunk). In a
/// sliding-window layer only the keys some query of the row sees take part, masked
/// per query where the window moves within the chunk.
fn own_cache(
    layer: &impl AttentionMath,
    (q, k, v): (Array, Array, Array),
    cache: &mut KvCache,
) -> Result<Array> {
    let len = q.shape()[2];
    let (k, v) = cache.append(k, v)?;
    let total = cache.len();
    let start = layer.window().map_or(0, |w| (total - len + 1 - w).max(0));
    // The cache holds positions from `first()` on, never past `start`.
    let skip = start - cache.first();
    let (k, v) = if skip > 0 {
        let tail = |a: &Array| a.index((.., .., skip.., ..));
        (tail(&k), tail(&v))
    } else {
        (k, v)
    };
    let window_moves = layer.window().is_some_and(|w| total - w > start);
    let mask = if len > 1 && window_moves {
        Some(window_mask(len, total - start, layer.window(), q.dtype())?)
    } else {
        None
    };
    let mask = match &mask {
        Some(m) => Some(ScaledDotProductAttentionMask::Array(m)),
        None => (len > 1).then_some(ScaledDotProductAttentionMask::Causal),
    };
    layer.attend(q, k, v, mask)
}

/// The decode groups (`groups[g]`: group `g`'s rotated `[W, ., 1, hd]` queries, keys and
/// values) attended in the pool: each class's new keys and values are written with one
/// scatter, then every [`KvPool::call_slots`] slots holding a row of this step are one
/// call at the class's capacity, positions past each row's length masked (a slot of no
/// row here attends zeros with any query, its output dropped). Rows are picked by
/// slicing where they lie in order (the usual case), so a step adds few ops per layer.
/// Returns each decode group's `[W, H · hd]` output.
fn pooled_decode(
    layer: &impl AttentionMath,
    groups: &[Option<(Array, Array, Array)>],
    plan: &StepPlan,
    caches: &mut [&mut KvCache],
    decode_kv: &mut DecodeKv,
) -> Result<Vec<Option<Array>>> {
    if groups.iter().all(Option::is_none) {
        return Ok(vec![None; groups.len()]);
    }
    // The decode groups end to end; `at[i]` is row `i`'s place in them.
    let mut at: Vec<Option<i32>> = vec![None; plan.slots.len()];
    let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
    let mut places = 0;
    for (g, group) in groups.iter().enumerate() {
        let Some((q, k, v)) = group else { continue };
        for i in plan.rows_of(g) {
            at[i] = Some(places + plan.slots[i].offset);
        }
        places += plan.widths[g];
        qs.push(q);
        ks.push(k);
        vs.push(v);
    }
    let (q, k, v) = (join_rows(&qs)?, join_rows(&ks)?, join_rows(&vs)?);
    let mut by_class: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    for (i, place) in at.iter().enumerate() {
        if place.is_some() {
            let capacity = caches[i].pooled().expect("placed").capacity;
            by_class.entry(capacity).or_default().push(i);
        }
    }
    let at_layer = decode_kv.layer;
    let mut outs = Vec::new();
    // Where each place's output lies among the calls' outputs end to end (`None`: a
    // padding place no call computed; any output serves it).
    let mut out_of: Vec<Option<i32>> = vec![None; places as usize];
    let mut computed = 0;
    for (capacity, members) in by_class {
        // Each row's places, in order: its new positions' keys and values, and queries.
        let row_places = |i: usize| {
            let first = at[i].expect("a decode row");
            first..first + plan.slots[i].len
        };
        let rows: Vec<i32> = members.iter().flat_map(|&i| row_places(i)).collect();
        let counts: Vec<i32> = members.iter().map(|&i| plan.slots[i].len).collect();
        let mut picked: Vec<&mut KvCache> = caches
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| members.contains(i))
            .map(|(_, c)| &mut **c)
            .collect();
        decode_kv.pool.write(
            at_layer,
            capacity,
            &mut picked,
            &counts,
            (
                &pick_rows(&k, &rows, &mut decode_kv.uploads)?,
                &pick_rows(&v, &rows, &mut decode_kv.uploads)?,
            ),
            &mut decode_kv.uploads,
        )?;
        if plan.pooled == PooledAttention::PerQuery {
            // A row's j-th place sees the positions up to its own.
            let queries: Vec<QueryRow> = members
                .iter()
                .flat_map(|&i| {
                    let p = caches[i].pooled().expect("placed");
                    let n = plan.slots[i].len;
                    row_places(i).enumerate().map(move |(j, place)| {
                        let len = p.len - n + j as i32 + 1;
                        QueryRow {
                            place,
                            slot: p.slot,
                            len,
                            first: layer.window().map_or(0, |w| (len - w).max(0)),
                        }
                    })
                })
                .collect();
            let class = decode_kv.pool.class(at_layer, capacity);
            outs.push(pooled_attention::attend(
                layer,
                &q,
                (&class.0, &class.1),
                &queries,
                &mut decode_kv.uploads,
            )?);
            for (j, query) in queries.iter().enumerate() {
                out_of[query.place as usize] = Some(computed + j as i32);
            }
            computed += queries.len() as i32;
            continue;
        }
        debug_assert!(
            counts.iter().all(|&n| n == 1),
            "masked calls take decode rows"
        );
        // Each call: its slots' rows, as (place, length).
        let slots = decode_kv.pool.call_slots(capacity);
        let mut calls: BTreeMap<i32, Vec<Option<(i32, i32)>>> = BTreeMap::new();
        for &i in &members {
            let p = caches[i].pooled().expect("placed");
            let first = p.slot / slots * slots;
            let call = calls
                .entry(first)
                .or_insert_with(|| vec![None; slots as usize]);
            call[(p.slot - first) as usize] = Some((at[i].expect("a decode row"), p.len));
        }
        for (first, call) in calls {
            let queries = call_queries(&call, places);
            // A padding place that served as a filler takes that output (so a group's
            // outputs stay in order); a row's place always takes its own.
            for (j, &place) in queries.iter().enumerate() {
                let own = call[j].is_some();
                let entry = &mut out_of[place as usize];
                if own || entry.is_none() {
                    *entry = Some(computed + j as i32);
                }
            }
            let lens: Vec<i32> = call
                .iter()
                .map(|c| c.map_or(capacity, |(_, len)| len))
                .collect();
            let queries = pick_rows(&q, &queries, &mut decode_kv.uploads)?;
            let (keys, values) = decode_kv.pool.call(at_layer, capacity, first);
            let (ring, window) = (keys.shape()[2], layer.window());
            let mask = decode_kv.masks.get(ring, window, lens, queries.dtype())?;
            outs.push(layer.attend(
                queries,
                keys,
                values,
                Some(ScaledDotProductAttentionMask::Array(mask)),
            )?);
            computed += slots;
        }
    }
    // Each output row's heads end to end (`[places, H · hd]`), as the kernel writes them.
    let all = join_rows(&outs.iter().collect::<Vec<_>>())?;
    let all = match all.ndim() {
        2 => all,
        _ => all.reshape(&[all.shape()[0], -1])?,
    };
    let mut place = 0;
    groups
        .iter()
        .enumerate()
        .map(|(g, group)| {
            if group.is_none() {
                return Ok(None);
            }
            let w = plan.widths[g];
            let picks: Vec<i32> = out_of[place as usize..(place + w) as usize]
                .iter()
                .map(|o| o.unwrap_or(0))
                .collect();
            place += w;
            Ok(Some(pick_rows(&all, &picks, &mut decode_kv.uploads)?))
        })
        .collect()
}

/// One decode token per row, attended in a single call over the caches padded with
/// masked zeros to the longest (the non-invariant reference layout).
fn padded_decode(
    layer: &impl AttentionMath,
    rows: Vec<(Array, Array, Array)>,
    caches: &mut [&mut KvCache],
) -> Result<Vec<Array>> {
    let count = rows.len() as i32;
    let mut held = Vec::with_capacity(rows.len());
    let mut qs = Vec::with_capacity(rows.len());
    for ((q, k, v), cache) in rows.into_iter().zip(caches.iter_mut()) {
        held.push(cache.append(k, v)?);
        qs.push(q);
    }
    // Each row's held positions (from its cache's `first()`), the new one last.
    let lens: Vec<i32> = caches.iter().map(|c| c.held()).collect();
    let longest = lens.iter().copied().max().unwrap_or(1);
    let (mut ks, mut vs) = (Vec::new(), Vec::new());
    for ((k, v), len) in held.into_iter().zip(&lens) {
        let pad = [(0, 0), (0, 0), (0, longest - len), (0, 0)];
        ks.push(ops::pad(&k, &pad, None, None)?);
        vs.push(ops::pad(&v, &pad, None, None)?);
    }
    let q = ops::concatenate(&qs, 0)?;
    let mask = decode_mask(longest, layer.window(), &lens, q.dtype())?;
    let out = layer.attend(
        q,
        ops::concatenate(&ks, 0)?,
        ops::concatenate(&vs, 0)?,
        Some(ScaledDotProductAttentionMask::Array(&mask)),
    )?;
    Ok((0..count).map(|i| out.index(i..i + 1)).collect())
}

/// Each matmul group's projected queries, keys and values (`[1, W, .]`), in group order.
#[derive(Default)]
pub struct QueriesKeysValues(Vec<Projected>);

/// One group's queries, keys and values.
enum Projected {
    Parts(Array, Array, Array),
    /// A decode group's as one product, each row's queries, keys and values end to end.
    Joined(Array),
}

impl QueriesKeysValues {
    pub fn push(&mut self, q: Array, k: Array, v: Array) {
        self.0.push(Projected::Parts(q, k, v));
    }

    /// A decode group's queries, keys and values as one product (`[1, W, (H + 2·kv_heads)
    /// · hd]`, none normed per head): its queries and keys are rotated in one call.
    pub fn push_joined(&mut self, qkv: Array) {
        self.0.push(Projected::Joined(qkv));
    }
}

/// What a step's decode rows carry from layer to layer.
pub struct DecodeKv<'a> {
    pool: &'a mut KvPool,
    /// The calls' masks, built once: every layer holds the same lengths.
    masks: Masks,
    /// The rows' positions and the pool's write indices, alike in every layer.
    uploads: Uploads,
    pub layer: usize,
}

impl<'a> DecodeKv<'a> {
    /// The step's decode KV, with every decoding row placed in `pool` where the layout
    /// pools it.
    pub fn place(
        plan: &StepPlan,
        caches: &mut [&mut [KvCache]],
        pool: &'a mut KvPool,
    ) -> Result<Self> {
        if plan.attention == AttentionLayout::Capacity {
            for g in 0..plan.widths.len() {
                if plan.is_decode_group(g) {
                    for i in plan.rows_of(g) {
                        pool.place(caches[i], plan.slots[i].len)?;
                    }
                }
            }
        }
        Ok(DecodeKv {
            pool,
            masks: Masks::default(),
            uploads: Uploads::default(),
            layer: 0,
        })
    }
}

/// The query place of each slot of one pooled call (`call[j]`: the place and length of
/// slot `j`'s row, if it runs here) among `places` stacked queries. A slot of no row takes
/// the place that keeps the call's queries consecutive when the rows' places allow it (so
/// [`pick_rows`] slices), else the first row's.
fn call_queries(call: &[Option<(i32, i32)>], places: i32) -> Vec<i32> {
    let (j, (place, _)) = call
        .iter()
        .enumerate()
        .find_map(|(j, c)| c.map(|c| (j as i32, c)))
        .expect("a call holds a row");
    let start = place - j;
    let in_order = start >= 0
        && start + call.len() as i32 <= places
        && call
            .iter()
            .zip(start..)
            .all(|(c, want)| c.is_none_or(|(p, _)| p == want));
    call.iter()
        .zip(start..)
        .map(|(c, consecutive)| match c {
            Some((p, _)) => *p,
            None if in_order => consecutive,
            None => place,
        })
        .collect()
}

/// The masks of a step's batched decode-attention calls, by the calls' key capacity (a
/// windowed layer's ring or the class's), window and lengths.
#[derive(Default)]
struct Masks(HashMap<(i32, Option<i32>, Vec<i32>), Array>);

impl Masks {
    /// See [`decode_mask`]; built once per step for the layers that share it.
    fn get(
        &mut self,
        capacity: i32,
        window: Option<i32>,
        lens: Vec<i32>,
        dtype: Dtype,
    ) -> Result<&Array> {
        match self.0.entry((capacity, window, lens)) {
            Entry::Occupied(mask) => Ok(mask.into_mut()),
            Entry::Vacant(slot) => {
                let mask = decode_mask(capacity, window, &slot.key().2, dtype)?;
                Ok(slot.insert(mask))
            }
        }
    }
}

/// `[rows, 1, 1, capacity]` for decode rows whose caches hold `lens[i]` positions, the new
/// one last, position `t` at index `t % capacity` (a ring once `lens[i]` passes the
/// capacity; below it, every position at its own index): 0 where the row's query sees the
/// index's latest position (before its length, and within `window` of it), -inf elsewhere.
fn decode_mask(capacity: i32, window: Option<i32>, lens: &[i32], dtype: Dtype) -> Result<Array> {
    let values: Vec<f32> = lens
        .iter()
        .flat_map(|&len| {
            let first = window.map_or(0, |w| len - w);
            (0..capacity).map(move |i| {
                // The latest position below `len` that index `i` holds, if any.
                let t = i + (len - 1 - i).max(0) / capacity * capacity;
                if t < len && t >= first {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    let rows = lens.len() as i32;
    Ok(Array::from_slice(&values, &[rows, 1, 1, capacity]).as_dtype(dtype)?)
}

/// `[len, keys]` for the last `len` of `keys` consecutive positions as queries: 0 where a
/// query sees the key (at or before it, and within `window` of it), -inf elsewhere.
pub fn window_mask(len: i32, keys: i32, window: Option<i32>, dtype: Dtype) -> Result<Array> {
    let values: Vec<f32> = (0..len)
        .flat_map(|i| {
            let at = keys - len + i;
            let first = window.map_or(0, |w| at + 1 - w);
            (0..keys).map(move |t| {
                if t <= at && t >= first {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Ok(Array::from_slice(&values, &[len, keys]).as_dtype(dtype)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_of_rows_in_order_takes_its_queries_by_slicing() {
        // Slots 0 and 2 of a 4-slot call hold the rows at places 5 and 7 of 12 stacked
        // queries: the empty slots take places 6 and 8, so the call reads places 5..9.
        let call = [Some((5, 30)), None, Some((7, 40)), None];
        assert_eq!(call_queries(&call, 12), [5, 6, 7, 8]);
        // Too few stacked queries to continue the run, or rows out of order: the empty
        // slots take the first row's place, and the call gathers.
        assert_eq!(call_queries(&call, 8), [5, 5, 7, 5]);
        let shuffled = [Some((3, 30)), Some((1, 40)), None, None];
        assert_eq!(call_queries(&shuffled, 12), [3, 1, 3, 3]);
        let picks = |rows: &[i32]| {
            let a = ops::arange::<_, f32>(0.0, 12.0, None).unwrap();
            let picked = pick_rows(&a, rows, &mut Uploads::default()).unwrap();
            picked.as_slice::<f32>().to_vec()
        };
        assert_eq!(picks(&[5, 6, 7, 8]), [5.0, 6.0, 7.0, 8.0]);
        assert_eq!(picks(&[3, 1, 3]), [3.0, 1.0, 3.0]);
    }
}
