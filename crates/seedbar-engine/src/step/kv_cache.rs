//! Key/value storage. [`KvCache`]: one sequence's per-layer `[1, kv_heads, T, head_dim]`
//! buffers that grow in fixed blocks, so writes land in place instead of re-concatenating,
//! or, for models on the packed CPU path, [`HostKv`] in host memory.
//! [`KvPool`]: decoding rows' KV at capacity, many rows to a buffer, so one step writes a
//! layer's new positions with one scatter and attends a fixed number of slots per call
//! ([`KvPool::call_slots`], a function of the capacity alone), whatever the number of rows
//! (the layout `plan::AttentionLayout::Capacity` uses).
//!
//! A sliding-window layer's storage holds only the positions its next queries can still
//! see, plus fixed slack ([`kept_from`]): memory is bounded by the window, not the context.
//! Which positions a cache holds when a step appends to it and reads it, and where, is a
//! function of its length alone (never of how the row got there: alone or batched,
//! prefilled or decoded, from the prefix cache or not), so attention reads the same keys in
//! the same order on every path. In the pool a windowed layer's slot is a ring of at most
//! [`ring_capacity`] positions, laid out by the row's length alone too. A cache becomes
//! plain data and back in `snapshot` (the prefix cache's disk tier).

mod scatter;
mod snapshot;

pub use snapshot::{buffer_bytes, KvSnapshot, StoredKv};

use std::{collections::BTreeMap, sync::Arc};

use mlx_rs::{
    ops::{
        self,
        indexing::{IndexOp, TryIndexMutOp},
    },
    Array,
};

use crate::{
    error::{EngineError, Result},
    step::plan::{PooledAttention, Uploads, MIN_CALL_SLOTS, PREFILL_CHUNK},
};

/// Positions added per growth step, and the step a windowed cache drops old ones by.
pub const KV_BLOCK: i32 = 256;

/// Positions a windowed cache keeps beyond what its next query sees, so the prefix cache
/// can cut an entry back to the last prefill-chunk boundary before its end (where a hit on
/// the next turn resumes) and still hold every key the window there sees. Sized for the
/// CPU's chunk: on a GPU layout (512-token chunks) a boundary further back than this is
/// served only where the keys are still held (`reusable_from`), else the turn is a miss.
const REUSE_SLACK: i32 = PREFILL_CHUNK as i32;

/// The first position a cache whose queries see `window` positions keeps once it holds
/// `len`: the oldest the next query (at position `len`) sees, less [`REUSE_SLACK`], rounded
/// down to a whole [`KV_BLOCK`] (so old positions go a block at a time). `0` without a
/// window. A cache then holds at most `window - 1 + REUSE_SLACK + KV_BLOCK` positions
/// before a step appends its new ones.
pub fn kept_from(window: Option<i32>, len: i32) -> i32 {
    window.map_or(0, |w| {
        (len - (w - 1) - REUSE_SLACK).max(0) / KV_BLOCK * KV_BLOCK
    })
}

/// The most drafted tokens one verify chunk carries (its last decoded token and these run
/// as decode places in one step, `Layout::verifies_in_decode_groups`).
pub const MAX_DRAFTS: i32 = 16;

/// Positions of a windowed layer's ring in a [`KvPool`] slot: the window and
/// [`MAX_DRAFTS`] more, rounded up to a whole [`KV_BLOCK`]. Every position a decode query
/// sees fits, and a verify chunk's writes (kept or cut later) land only where positions no
/// query of the chunk or after it sees were.
pub fn ring_capacity(window: i32) -> i32 {
    whole_blocks(window + MAX_DRAFTS)
}

/// `positions` rounded up to a whole number of [`KV_BLOCK`]s: the capacity a buffer grown
/// block by block has once it holds them.
fn whole_blocks(positions: i32) -> i32 {
    (positions + KV_BLOCK - 1) / KV_BLOCK * KV_BLOCK
}

#[derive(Default, Clone)]
pub struct KvCache {
    /// Buffer index `i` holds position `first + i`.
    keys: Option<Array>,
    values: Option<Array>,
    /// Positions written so far (the sequence's length at this layer).
    len: i32,
    /// The oldest position held: [`kept_from`] of the length before the last append.
    first: i32,
    /// The layer's sliding window, if any: positions its queries no longer see are dropped.
    window: Option<i32>,
    /// Set while the row decodes in a [`KvPool`]: the positions past `len` are there.
    pooled: Option<PoolSlot>,
    /// The packed CPU path's keys and values (then `keys` and `values` stay empty); shared
    /// by clones (the prefix cache's) until one of them writes.
    host: Option<Arc<HostKv>>,
    /// A length [`truncate`](Self::truncate) must stay able to cut back to (the prompt's,
    /// where decoded KV is not reused), and the copy of this cache kept for it once
    /// letting old positions go would have made that cut inexact.
    cut_back: Option<(i32, Option<Box<KvCache>>)>,
}

/// One layer's keys and values in host memory, position-major: the `t`-th held position's
/// `kv_heads · head_dim` keys at `keys[t · width..]`, its values likewise.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct HostKv {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl HostKv {
    /// Floats per position: `kv_heads · head_dim`.
    pub fn width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

impl KvCache {
    /// An empty cache for a layer whose queries see the last `window` positions (`None`:
    /// every earlier one).
    pub fn new(window: Option<i32>) -> Self {
        KvCache {
            window,
            ..KvCache::default()
        }
    }

    /// Number of positions written (in a pool slot too).
    pub fn len(&self) -> i32 {
        self.pooled.map_or(self.len, |p| p.len)
    }

    /// The oldest position held (`0` unless a sliding window let older ones go).
    pub fn first(&self) -> i32 {
        self.first
    }

    /// Positions held in this cache's own storage (a pool slot's are the pool's).
    pub fn held(&self) -> i32 {
        self.len - self.first
    }

    /// The pool slot the row decodes in, if any.
    pub fn pooled(&self) -> Option<PoolSlot> {
        self.pooled
    }

    /// Bytes allocated for keys and values (capacity, not just the positions used).
    pub fn bytes(&self) -> usize {
        let host = self.host.as_ref().map_or(0, |h| {
            (h.keys.capacity() + h.values.capacity()) * std::mem::size_of::<f32>()
        });
        let kept_for_cut = match &self.cut_back {
            Some((_, Some(copy))) => copy.bytes(),
            _ => 0,
        };
        [&self.keys, &self.values]
            .into_iter()
            .flatten()
            .map(Array::nbytes)
            .sum::<usize>()
            + host
            + kept_for_cut
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Append `[B, H, L, D]` keys and values; returns every position held, `first()` on.
    pub fn append(&mut self, keys: Array, values: Array) -> Result<(Array, Array)> {
        self.host_to_mlx()?;
        self.rebase(kept_from(self.window, self.len))?;
        let (at, end) = (self.held(), self.held() + keys.shape()[2]);
        let capacity = self.keys.as_ref().map_or(0, |k| k.shape()[2]);
        if end > capacity {
            let blocks = (end - capacity + KV_BLOCK - 1) / KV_BLOCK;
            self.keys = Some(grow(self.keys.take(), &keys, blocks)?);
            self.values = Some(grow(self.values.take(), &values, blocks)?);
        }
        let (k, v) = (self.keys.as_mut().unwrap(), self.values.as_mut().unwrap());
        k.try_index_mut((.., .., at..end, ..), &keys)?;
        v.try_index_mut((.., .., at..end, ..), &values)?;
        self.len = self.first + end;
        Ok(self.held_up_to(end))
    }

    /// Append positions to the host store (`keys` and `values`: `kv_heads · head_dim`
    /// floats per position). Positions a [`truncate`](Self::truncate) dropped are
    /// overwritten.
    pub fn append_host(
        &mut self,
        keys: &[f32],
        values: &[f32],
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        self.mlx_to_host(kv_heads, head_dim)?;
        self.host.get_or_insert_with(|| {
            Arc::new(HostKv {
                kv_heads,
                head_dim,
                ..HostKv::default()
            })
        });
        self.rebase(kept_from(self.window, self.len))?;
        let held = self.held() as usize;
        let store = Arc::make_mut(self.host.as_mut().expect("inserted above"));
        store.keys.truncate(held * store.width());
        store.values.truncate(held * store.width());
        store.keys.extend_from_slice(keys);
        store.values.extend_from_slice(values);
        self.len += (keys.len() / store.width()) as i32;
        Ok(())
    }

    /// The host store, where the packed CPU path keeps this cache: its `t`-th position is
    /// position `first() + t`.
    pub fn host(&self) -> Option<&HostKv> {
        self.host.as_deref()
    }

    /// Hold positions `first..len` from now on: older ones are dropped; where `first` is
    /// older than what is held (a prefix-cache entry cut back), the missing positions are
    /// zeros, which no query reads ([`reusable_from`](Self::reusable_from)). The storage
    /// is copied, so a dropped block's memory is freed (and a clone sharing it is not
    /// touched).
    fn rebase(&mut self, first: i32) -> Result<()> {
        if first == self.first {
            return Ok(());
        }
        // Before dropping what a cache stopped at the held length would still hold, keep a
        // copy for cuts back to it (sharing the storage the copy below replaces).
        let breaks_cut = match &self.cut_back {
            Some((len, None)) => first > kept_from(self.window, *len),
            _ => false,
        };
        if breaks_cut {
            let copy = KvCache {
                cut_back: None,
                ..self.clone()
            };
            if let Some((_, kept)) = self.cut_back.as_mut() {
                *kept = Some(Box::new(copy));
            }
        }
        let held = self.held().max(0);
        // Keep the held positions from `first` on, behind `front` zero positions.
        let (skip, front) = ((first - self.first).max(0), (self.first - first).max(0));
        let kept = (held - skip).max(0);
        if let Some(host) = self.host.as_mut() {
            let width = host.width();
            let copy = |buffer: &[f32]| {
                let mut fresh = vec![0.0f32; (front + kept) as usize * width];
                let from = skip as usize * width;
                fresh[front as usize * width..]
                    .copy_from_slice(&buffer[from..from + kept as usize * width]);
                fresh
            };
            *host = Arc::new(HostKv {
                keys: copy(&host.keys),
                values: copy(&host.values),
                ..**host
            });
        } else if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            let positions = front + kept;
            let capacity = whole_blocks(positions);
            let copy = |a: &Array| -> Result<Option<Array>> {
                if capacity == 0 {
                    return Ok(None);
                }
                let s = a.shape();
                let mut fresh = ops::zeros_dtype(&[s[0], s[1], capacity, s[3]], a.dtype())?;
                if kept > 0 {
                    let part = a.index((.., .., skip..skip + kept, ..));
                    fresh.try_index_mut((.., .., front..positions, ..), &part)?;
                }
                Ok(Some(fresh))
            };
            let (k, v) = (copy(k)?, copy(v)?);
            self.keys = k;
            self.values = v;
        }
        self.first = first;
        Ok(())
    }

    /// A cache filled on the packed CPU path and then run through an MLX layout (tests run
    /// every layout from one prefill): the host store becomes MLX buffers.
    fn host_to_mlx(&mut self) -> Result<()> {
        let Some(host) = self.host.take() else {
            return Ok(());
        };
        let held = self.held();
        if held > 0 {
            let floats = held as usize * host.width();
            let heads = [1, held, host.kv_heads as i32, host.head_dim as i32];
            let buffer = |x: &[f32]| -> Result<Array> {
                Ok(Array::from_slice(&x[..floats], &heads)
                    .transpose_axes(&[0, 2, 1, 3])?
                    .contiguous()?)
            };
            self.keys = Some(buffer(&host.keys)?);
            self.values = Some(buffer(&host.values)?);
        }
        Ok(())
    }

    /// The reverse of [`host_to_mlx`](Self::host_to_mlx): MLX buffers become the host store.
    fn mlx_to_host(&mut self, kv_heads: usize, head_dim: usize) -> Result<()> {
        if self.keys.is_none() {
            return Ok(());
        }
        debug_assert!(self.pooled.is_none(), "release the pool slot first");
        if self.held() <= 0 {
            self.keys = None;
            self.values = None;
            return Ok(());
        }
        let (keys, values) = self.held_up_to(self.held());
        let rows = |a: Array| -> Result<Vec<f32>> {
            let a = a.transpose_axes(&[0, 2, 1, 3])?.contiguous()?;
            Ok(a.try_as_slice::<f32>()?.to_vec())
        };
        self.host = Some(Arc::new(HostKv {
            keys: rows(keys)?,
            values: rows(values)?,
            kv_heads,
            head_dim,
        }));
        self.keys = None;
        self.values = None;
        Ok(())
    }

    /// The first `end` buffer positions (which hold at least that many).
    fn held_up_to(&self, end: i32) -> (Array, Array) {
        let (k, v) = (self.keys.as_ref().unwrap(), self.values.as_ref().unwrap());
        if k.shape()[2] == end {
            return (k.clone(), v.clone());
        }
        (k.index((.., .., ..end, ..)), v.index((.., .., ..end, ..)))
    }

    /// The positions a pool ring of `ring` positions holds at `len` (the last `ring`, or
    /// all held), read from this cache: `(keys, values, ring index)` for each run that does
    /// not wrap around the ring.
    fn ring_spans(&self, len: i32, ring: i32) -> Vec<(Array, Array, i32)> {
        let (k, v) = self.held_up_to(self.held());
        let mut spans = Vec::with_capacity(2);
        let mut from = self.first.max(len - ring);
        while from < len {
            let end = len.min((from / ring + 1) * ring);
            let run = |a: &Array| a.index((.., .., from - self.first..end - self.first, ..));
            spans.push((run(&k), run(&v), from % ring));
            from = end;
        }
        spans
    }

    /// The shortest length [`truncate`](Self::truncate) can cut this cache back to and
    /// still compute what a cache that never dropped a position would: a query there must
    /// find every key its window sees (`0` where nothing was dropped).
    pub fn reusable_from(&self) -> i32 {
        match self.window {
            Some(w) if self.first > 0 => self.first + w - 1,
            _ => 0,
        }
    }

    /// Keep this cache as reusable at `len` positions as if it had stopped there (a cut
    /// back to `len`, or as far back as a cache of `len` positions allows), whatever its
    /// window lets go later: at the cost of one window's copy, kept once needed.
    pub fn hold_cut_back_to(&mut self, len: i32) {
        self.cut_back = Some((len, None));
    }

    /// Keep only the first `len` positions (prefix reuse, drafted positions not kept); a
    /// pooled row may cut only positions of its slot (its own storage, the prompt, stays
    /// whole until it is released). Refused below [`reusable_from`](Self::reusable_from)
    /// (the cache has dropped keys a query there would see) unless the copy kept for
    /// [`hold_cut_back_to`](Self::hold_cut_back_to) can be cut there.
    pub fn truncate(&mut self, len: i32) -> Result<()> {
        let len = len.max(0);
        if let Some(p) = self.pooled.as_mut() {
            // The slot's later positions stay behind, unseen: a query sees positions below
            // its length, and a ring holds MAX_DRAFTS more than its window.
            debug_assert!(len >= self.len, "release the pool slot first");
            p.len = p.len.min(len);
            return Ok(());
        }
        if let Some((_, Some(copy))) = self.cut_back.take() {
            if len < self.reusable_from() && len >= copy.reusable_from() {
                *self = *copy;
            }
        }
        if len < self.len && len < self.reusable_from() {
            return Err(EngineError::InvalidRequest(format!(
                "a sliding-window cache holding positions {}..{} cannot be cut back to {len}: \
                 it dropped keys a query there sees",
                self.first, self.len
            )));
        }
        self.len = self.len.min(len);
        self.fit_capacity();
        Ok(())
    }

    /// MLX buffers of the capacity a cache grown to this length has (where no position
    /// was dropped), so a prefix hit attends over buffers shaped like a miss's (a kernel
    /// may choose by the buffer's layout), not like the longer sequence's it came from.
    fn fit_capacity(&mut self) {
        if self.first > 0 {
            return;
        }
        let capacity = whole_blocks(self.len);
        for buffer in [&mut self.keys, &mut self.values] {
            if let Some(b) = buffer.as_ref().filter(|b| b.shape()[2] > capacity) {
                *buffer = (capacity > 0).then(|| b.index((.., .., ..capacity, ..)));
            }
        }
    }
}

/// The shortest length every cache of a sequence can be cut back to exactly
/// ([`KvCache::reusable_from`]).
pub fn reusable_from(caches: &[KvCache]) -> i32 {
    caches.iter().map(KvCache::reusable_from).max().unwrap_or(0)
}

/// Positions (slots × capacity) above which a pool call halves its slots, down to
/// [`MIN_CALL_SLOTS`]: wide calls for the short classes most rows sit in, without
/// allocating wide classes of long rows.
const CALL_POSITIONS: i32 = 32 * 1024;

/// Where a decoding row's KV lives in a [`KvPool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSlot {
    /// The class's capacity: the row's length rounded up to a whole `KV_BLOCK`.
    pub capacity: i32,
    pub slot: i32,
    /// Positions held, the prefilled ones included.
    pub len: i32,
}

/// Decoding rows' KV, by capacity class: per layer, `[slots, kv_heads, capacity, head_dim]`
/// buffers in which each row holds one slot (a function of nothing but its own length, so
/// its attention shape is too). A sliding-window layer's buffers hold at most
/// [`ring_capacity`] positions, position `t` at `t % capacity` (below that capacity, every
/// position at its own index). A row enters when it starts decoding (its prefilled KV is
/// copied in; its own cache keeps that prompt part for prefix reuse), moves up a class
/// when it outgrows one, and leaves with [`release`](Self::release). Decode KV is never
/// reused by the prefix cache.
pub struct KvPool {
    classes: BTreeMap<i32, PoolClass>,
    /// The most slots one attention call covers ([`call_slots`](Self::call_slots)).
    max_call_slots: i32,
    /// Whether rows attend per query ([`PooledAttention::PerQuery`]): then a class's slot
    /// count shapes no call, and a class grows from one slot, doubling up to its call
    /// slots (a lone row holds one slot's buffers, not a call's).
    per_query: bool,
}

impl Default for KvPool {
    fn default() -> Self {
        KvPool::new(MIN_CALL_SLOTS, PooledAttention::MaskedCalls)
    }
}

struct PoolClass {
    /// Per layer: keys and values, `[slots, kv_heads, capacity, head_dim]`.
    layers: Vec<(Array, Array)>,
    used: Vec<bool>,
}

impl KvPool {
    /// An empty pool whose attention calls cover up to `max_call_slots` slots (the
    /// layout's `pool_call_slots`; at least [`MIN_CALL_SLOTS`]), its rows attending as
    /// `pooled` says.
    pub fn new(max_call_slots: i32, pooled: PooledAttention) -> Self {
        KvPool {
            classes: BTreeMap::new(),
            max_call_slots: max_call_slots.max(MIN_CALL_SLOTS),
            per_query: pooled == PooledAttention::PerQuery,
        }
    }

    /// Slots one attention call of the class of `capacity` covers, and the step the class
    /// grows by: the most the pool allows, halved while the call would hold more than
    /// [`CALL_POSITIONS`] positions, never below [`MIN_CALL_SLOTS`]. A function of the
    /// capacity alone (so of the row's own length): a row's call shape does not depend on
    /// the batch.
    pub fn call_slots(&self, capacity: i32) -> i32 {
        let mut slots = self.max_call_slots;
        while slots > MIN_CALL_SLOTS && slots * capacity > CALL_POSITIONS {
            slots /= 2;
        }
        slots
    }

    /// Make sure the row (its per-layer caches) has a slot with room for `new` more
    /// positions, entering the pool or moving to the class of its length as needed.
    pub fn place(&mut self, row: &mut [KvCache], new: i32) -> Result<()> {
        for cache in row.iter_mut() {
            cache.host_to_mlx()?;
        }
        let len = row[0].len();
        let capacity = whole_blocks(len + new);
        let previous = row[0].pooled;
        if previous.is_some_and(|p| p.capacity == capacity) {
            return Ok(());
        }
        let slot = self.allocate(capacity, row)?;
        for (layer, cache) in row.iter_mut().enumerate() {
            // What the row held, as (source keys, values, its first position's index there).
            let moved = match previous {
                // The previous class's slot, as laid out there: a ring that was full keeps
                // its layout (the new capacity is the same), a shorter one is every
                // position at its own index.
                Some(p) => {
                    let (k, v) = &self.classes[&p.capacity].layers[layer];
                    let n = p.len.min(k.shape()[2]);
                    let held = |a: &Array| a.index((p.slot..p.slot + 1, .., ..n, ..));
                    vec![(held(k), held(v), 0)]
                }
                None => cache.ring_spans(len, ring_of(capacity, cache.window)),
            };
            let (k, v) = &mut self.classes.get_mut(&capacity).expect("allocated").layers[layer];
            for (keys, values, at) in moved {
                let end = at + keys.shape()[2];
                k.try_index_mut((slot..slot + 1, .., at..end, ..), &keys)?;
                v.try_index_mut((slot..slot + 1, .., at..end, ..), &values)?;
            }
            cache.pooled = Some(PoolSlot {
                capacity,
                slot,
                len,
            });
        }
        if let Some(p) = previous {
            self.free(p);
        }
        Ok(())
    }

    /// Bytes the pool's buffers hold, over every class and layer.
    pub fn bytes(&self) -> usize {
        self.classes
            .values()
            .flat_map(|c| &c.layers)
            .map(|(k, v)| k.nbytes() + v.nbytes())
            .sum()
    }

    /// Leave the pool: the row's caches hold their prefilled positions again.
    pub fn release(&mut self, row: &mut [KvCache]) {
        let Some(p) = row.first().and_then(|c| c.pooled) else {
            return;
        };
        for cache in row.iter_mut() {
            cache.pooled = None;
        }
        self.free(p);
    }

    /// Write `counts[r]` new positions for each of `rows` (their caches at this layer) in
    /// the class of `capacity`: `keys`/`values` are `[Σ counts, kv_heads, 1, head_dim]`, row
    /// by row, in position order, with one scatter whose index comes from `uploads` (layers
    /// alike share one); one position alone is one slice update.
    pub fn write(
        &mut self,
        layer: usize,
        capacity: i32,
        rows: &mut [&mut KvCache],
        counts: &[i32],
        (keys, values): (&Array, &Array),
        uploads: &mut Uploads,
    ) -> Result<()> {
        let (k, v) = &mut self.classes.get_mut(&capacity).expect("placed").layers[layer];
        let (heads, ring, head_dim) = (k.shape()[1], k.shape()[2], k.shape()[3]);
        if let ([cache], [1]) = (&mut *rows, counts) {
            // One position (a lone chat's decode step): written as the slice it is.
            let p = cache.pooled.as_mut().expect("placed");
            let (slot, at) = (p.slot, p.len % ring);
            p.len += 1;
            let place = || (slot..slot + 1, .., at..at + 1, ..);
            k.try_index_mut(place(), keys)?;
            v.try_index_mut(place(), values)?;
            return Ok(());
        }
        // Each new position's (slot, head, place in the ring), head by head.
        let n = keys.shape()[0] as usize * heads as usize;
        let mut index = [(); 3].map(|_| Vec::with_capacity(n));
        for (cache, &count) in rows.iter_mut().zip(counts) {
            let p = cache.pooled.as_mut().expect("placed");
            for _ in 0..count {
                for h in 0..heads {
                    index[0].push(p.slot);
                    index[1].push(h);
                    index[2].push(p.len % ring);
                }
                p.len += 1;
            }
        }
        let index: Vec<Array> = index.iter().map(|i| uploads.get(i).clone()).collect();
        let updates = |new: &Array| new.reshape(&[n as i32, 1, 1, 1, head_dim]);
        *k = scatter::scatter_leading(k, &index, &updates(keys)?)?;
        *v = scatter::scatter_leading(v, &index, &updates(values)?)?;
        Ok(())
    }

    /// Keys and values of the [`call_slots`](Self::call_slots) slots from `first` of a
    /// class at `layer` (`[slots, kv_heads, ring, head_dim]`, the ring at most the class's
    /// capacity).
    pub fn call(&self, layer: usize, capacity: i32, first: i32) -> (Array, Array) {
        let (k, v) = &self.classes[&capacity].layers[layer];
        let slots = self.call_slots(capacity);
        let span = |a: &Array| a.index(first..first + slots);
        (span(k), span(v))
    }

    /// Keys and values of every slot of a class at `layer` (`[slots, kv_heads, ring,
    /// head_dim]`).
    pub fn class(&self, layer: usize, capacity: i32) -> (Array, Array) {
        self.classes[&capacity].layers[layer].clone()
    }

    fn allocate(&mut self, capacity: i32, like: &[KvCache]) -> Result<i32> {
        let call_slots = self.call_slots(capacity);
        let class = match self.classes.entry(capacity) {
            std::collections::btree_map::Entry::Occupied(c) => c.into_mut(),
            std::collections::btree_map::Entry::Vacant(slot) => slot.insert(PoolClass {
                layers: Vec::new(),
                used: Vec::new(),
            }),
        };
        if let Some(free) = class.used.iter().position(|u| !u) {
            class.used[free] = true;
            return Ok(free as i32);
        }
        // Grow by a whole call's slots (per query: by as many as it holds, from one, up to a
        // call's), shaped like the row's own buffers.
        let held = class.used.len() as i32;
        let more = if self.per_query {
            held.clamp(1, call_slots)
        } else {
            call_slots
        };
        let grown = held + more;
        let mut layers = Vec::with_capacity(like.len());
        for (layer, cache) in like.iter().enumerate() {
            let template = cache.keys.as_ref().expect("a decoding row has prefilled");
            let s = template.shape();
            let ring = ring_of(capacity, cache.window);
            let extra = ops::zeros_dtype(&[more, s[1], ring, s[3]], template.dtype())?;
            layers.push(match class.layers.get(layer) {
                Some((k, v)) => (
                    ops::concatenate(&[k, &extra], 0)?,
                    ops::concatenate(&[v, &extra], 0)?,
                ),
                None => (extra.clone(), extra),
            });
        }
        class.layers = layers;
        let slot = class.used.len();
        class.used.resize(grown as usize, false);
        class.used[slot] = true;
        Ok(slot as i32)
    }

    fn free(&mut self, p: PoolSlot) {
        let class = self.classes.get_mut(&p.capacity).expect("a used class");
        class.used[p.slot as usize] = false;
        if class.used.iter().all(|u| !u) {
            self.classes.remove(&p.capacity);
        }
    }
}

/// The positions a layer of `window` keeps in a pool class of `capacity`.
fn ring_of(capacity: i32, window: Option<i32>) -> i32 {
    window.map_or(capacity, |w| capacity.min(ring_capacity(w)))
}

fn grow(buffer: Option<Array>, like: &Array, blocks: i32) -> Result<Array> {
    let s = like.shape();
    let extra = ops::zeros_dtype(&[s[0], s[1], blocks * KV_BLOCK, s[3]], like.dtype())?;
    Ok(match buffer {
        Some(old) => ops::concatenate(&[old, extra], 2)?,
        None => extra,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: i32 = 16;

    /// Positions `from..from + n` as one KV head of one feature whose value is the position.
    fn positions(from: i32, n: i32) -> Vec<f32> {
        (from..from + n).map(|t| t as f32).collect()
    }

    /// Append positions `from..from + n` to `cache`, in MLX buffers or the host store.
    fn append(cache: &mut KvCache, from: i32, n: i32, host: bool) {
        let x = positions(from, n);
        if host {
            cache.append_host(&x, &x, 1, 1).unwrap();
        } else {
            let a = Array::from_slice(&x, &[1, 1, n, 1]);
            cache.append(a.clone(), a).unwrap();
        }
    }

    /// A cache of `window` filled to `len` positions, `step` at a time.
    fn filled_with(window: Option<i32>, len: i32, step: i32, host: bool) -> KvCache {
        let mut cache = KvCache::new(window);
        let mut at = 0;
        while at < len {
            let n = step.min(len - at);
            append(&mut cache, at, n, host);
            at += n;
        }
        cache
    }

    /// A cache of [`WINDOW`] filled to `len` positions, `step` at a time.
    fn filled(len: i32, step: i32, host: bool) -> KvCache {
        filled_with(Some(WINDOW), len, step, host)
    }

    /// The keys the cache holds, oldest first.
    fn held_keys(cache: &KvCache) -> Vec<f32> {
        match cache.host() {
            Some(h) => h.keys.clone(),
            None => {
                let (k, _) = cache.held_up_to(cache.held());
                let k = k.contiguous().unwrap();
                k.eval().unwrap();
                k.as_slice::<f32>().to_vec()
            }
        }
    }

    #[test]
    fn a_windowed_cache_keeps_a_bounded_tail_laid_out_by_its_length_alone() {
        for host in [false, true] {
            // Decoded one by one, and prefilled in chunks (of a prefill chunk and less).
            let mut by_one = KvCache::new(Some(WINDOW));
            for len in 0..1200 {
                for step in [7, PREFILL_CHUNK as i32] {
                    if len % step != 0 {
                        continue;
                    }
                    // What a step at `len` reads is the same, however the row got there.
                    let (mut a, mut b) = (by_one.clone(), filled(len, step, host));
                    append(&mut a, len, 1, host);
                    append(&mut b, len, 1, host);
                    assert_eq!((a.first(), a.len()), (b.first(), b.len()), "{len}/{step}");
                    assert_eq!(held_keys(&a), held_keys(&b), "{len}/{step}");
                    assert_eq!(held_keys(&a), positions(a.first(), a.held()));
                    let bound = WINDOW - 1 + REUSE_SLACK + KV_BLOCK + 1;
                    assert!(a.held() <= bound, "{} held at {len}", a.held());
                }
                append(&mut by_one, len, 1, host);
            }
            assert!(by_one.first() > 0, "nothing was dropped");
            // Memory follows: 1200 positions of 2 floats would be 9600 bytes.
            assert!(by_one.bytes() < 9600 * 6 / 10, "{} bytes", by_one.bytes());
        }
    }

    #[test]
    fn a_cut_back_cache_is_exact_or_refused() {
        for host in [false, true] {
            let entry = filled(700, 1, host);
            assert!(entry.first() > 0);
            let shortest = entry.reusable_from();
            assert_eq!(shortest, entry.first() + WINDOW - 1);
            // Below: a query there would see keys the cache let go.
            let mut refused = entry.clone();
            assert!(refused.truncate(shortest - 1).is_err());
            // At or above: the next step reads what a cache that never dropped would, at the
            // same places (where positions no query reads were dropped, zeros stand in).
            // And a cache held for cuts back to 552 (a prompt), decoded far past it: it cuts
            // back to the prefill chunk before (512) as a cache stopped at 552 would.
            let mut decoded = filled(552, PREFILL_CHUNK as i32, host);
            decoded.hold_cut_back_to(552);
            for len in 552..1000 {
                append(&mut decoded, len, 1, host);
            }
            assert!(decoded.reusable_from() > 552);
            for (mut cut_back, cut) in [
                (entry.clone(), shortest),
                (entry.clone(), 600),
                (decoded, 552),
            ] {
                cut_back.truncate(cut).unwrap();
                let mut fresh = filled(cut, PREFILL_CHUNK as i32, host);
                append(&mut cut_back, cut, 1, host);
                append(&mut fresh, cut, 1, host);
                assert_eq!(
                    (cut_back.first(), cut_back.len()),
                    (fresh.first(), fresh.len())
                );
                let seen = (cut + 1 - WINDOW - fresh.first()) as usize;
                assert_eq!(held_keys(&cut_back)[seen..], held_keys(&fresh)[seen..]);
            }
            // The entry itself is untouched by its clones' cuts.
            assert_eq!(held_keys(&entry), positions(entry.first(), entry.held()));
        }
    }

    #[test]
    fn a_pool_call_covers_a_number_of_slots_set_by_the_capacity_alone() {
        let cuda = KvPool::new(32, PooledAttention::PerQuery);
        let calls: Vec<i32> = [256, 1024, 1280, 2048, 4096, 8192]
            .map(|capacity| cuda.call_slots(capacity))
            .to_vec();
        assert_eq!(calls, [32, 32, 16, 16, 8, 8]);
        assert_eq!(KvPool::default().call_slots(256), MIN_CALL_SLOTS);
    }

    #[test]
    fn a_per_query_pool_class_grows_from_one_slot_and_a_masked_one_by_a_call() {
        // Rows of 100 positions joining a class one by one: its buffers' slots.
        let slots_as_rows_join = |mut pool: KvPool| -> Vec<i32> {
            let mut rows: Vec<Vec<KvCache>> = Vec::new();
            (0..5)
                .map(|_| {
                    let mut row = vec![filled(100, PREFILL_CHUNK as i32, false)];
                    pool.place(&mut row, 1).unwrap();
                    let capacity = row[0].pooled().unwrap().capacity;
                    rows.push(row);
                    pool.class(0, capacity).0.shape()[0]
                })
                .collect()
        };
        let per_query = KvPool::new(32, PooledAttention::PerQuery);
        assert_eq!(slots_as_rows_join(per_query), [1, 2, 4, 4, 8]);
        assert_eq!(slots_as_rows_join(KvPool::default()), [8; 5]);
    }

    #[test]
    fn a_windowed_layer_decodes_in_a_ring_of_its_pool_slot() {
        // A windowed layer and a full one, prefilled to 250 and decoded to 600: the row
        // moves from the 256 class to 512 and 768, its windowed layer's ring stays 256.
        let chunk = PREFILL_CHUNK as i32;
        let mut row = vec![
            filled(250, chunk, false),
            filled_with(None, 250, chunk, false),
        ];
        let mut pool = KvPool::default();
        for len in 250..600 {
            pool.place(&mut row, 1).unwrap();
            let capacity = row[0].pooled().unwrap().capacity;
            for (layer, cache) in row.iter_mut().enumerate() {
                let new = Array::from_slice(&[len as f32], &[1, 1, 1, 1]);
                pool.write(
                    layer,
                    capacity,
                    &mut [&mut *cache],
                    &[1],
                    (&new, &new),
                    &mut Uploads::default(),
                )
                .unwrap();
                let slot = cache.pooled().unwrap().slot;
                let (keys, _) = pool.call(layer, capacity, 0);
                let keys = keys.index(slot).contiguous().unwrap();
                keys.eval().unwrap();
                let keys = keys.as_slice::<f32>();
                let ring = keys.len() as i32;
                assert_eq!(ring, if layer == 0 { 256 } else { capacity });
                // Every position the window sees sits at its place in the ring.
                for t in (len + 1 - WINDOW).max(0)..=len {
                    assert_eq!(
                        keys[(t % ring) as usize],
                        t as f32,
                        "layer {layer} at {len}"
                    );
                }
            }
        }
        assert_eq!(row[0].pooled().unwrap().capacity, 768);
    }
}
