//! Key/value storage. [`KvCache`]: one sequence's per-layer `[1, kv_heads, T, head_dim]`
//! buffers that grow in fixed blocks, so writes land in place instead of re-concatenating,
//! or, for models on the packed CPU path, [`HostKv`] in host memory.
//! [`KvPool`]: decoding rows' KV at capacity, many rows to a buffer, so one step writes a
//! layer's new positions with one scatter and attends `SLOTS_PER_CALL` rows per call,
//! whatever the number of rows (the layout `step_plan::AttentionLayout::Capacity` uses).

use std::{collections::BTreeMap, sync::Arc};

use mlx_rs::{
    ops::{
        self,
        indexing::{scatter_single, IndexOp, TryIndexMutOp},
    },
    Array,
};

use crate::error::Result;

/// Positions added per growth step.
pub const KV_BLOCK: i32 = 256;

#[derive(Default, Clone)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    /// Positions in `keys` and `values`.
    len: i32,
    /// Set while the row decodes in a [`KvPool`]: the positions past `len` are there.
    pooled: Option<PoolSlot>,
    /// The packed CPU path's keys and values (then `keys` and `values` stay empty); shared
    /// by clones (the prefix cache's) until one of them writes.
    host: Option<Arc<HostKv>>,
}

/// One layer's keys and values in host memory, position-major: position `t`'s
/// `kv_heads · head_dim` keys at `keys[t · width..]`, its values likewise.
#[derive(Debug, Default, Clone)]
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
    /// Number of positions held (in a pool slot too).
    pub fn len(&self) -> i32 {
        self.pooled.map_or(self.len, |p| p.len)
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
        [&self.keys, &self.values]
            .into_iter()
            .flatten()
            .map(Array::nbytes)
            .sum::<usize>()
            + host
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Append `[B, H, L, D]` keys and values; returns everything held so far.
    pub fn append(&mut self, keys: Array, values: Array) -> Result<(Array, Array)> {
        self.host_to_mlx()?;
        let new = keys.shape()[2];
        let end = self.len + new;
        let capacity = self.keys.as_ref().map_or(0, |k| k.shape()[2]);
        if end > capacity {
            let blocks = (end - capacity + KV_BLOCK - 1) / KV_BLOCK;
            self.keys = Some(grow(self.keys.take(), &keys, blocks)?);
            self.values = Some(grow(self.values.take(), &values, blocks)?);
        }
        let (k, v) = (self.keys.as_mut().unwrap(), self.values.as_mut().unwrap());
        k.try_index_mut((.., .., self.len..end, ..), &keys)?;
        v.try_index_mut((.., .., self.len..end, ..), &values)?;
        self.len = end;
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
        let width = kv_heads * head_dim;
        let held = self.len as usize * width;
        let store = Arc::make_mut(self.host.get_or_insert_with(|| {
            Arc::new(HostKv {
                kv_heads,
                head_dim,
                ..HostKv::default()
            })
        }));
        store.keys.truncate(held);
        store.values.truncate(held);
        store.keys.extend_from_slice(keys);
        store.values.extend_from_slice(values);
        self.len += (keys.len() / width) as i32;
        Ok(())
    }

    /// The host store, where the packed CPU path keeps this cache.
    pub fn host(&self) -> Option<&HostKv> {
        self.host.as_deref()
    }

    /// A cache filled on the packed CPU path and then run through an MLX layout (tests run
    /// every layout from one prefill): the host store becomes MLX buffers.
    fn host_to_mlx(&mut self) -> Result<()> {
        let Some(host) = self.host.take() else {
            return Ok(());
        };
        if self.len > 0 {
            let (len, held) = (self.len, self.len as usize * host.width());
            let heads = [1, len, host.kv_heads as i32, host.head_dim as i32];
            let buffer = |x: &[f32]| -> Result<Array> {
                Ok(Array::from_slice(&x[..held], &heads)
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
        if self.len == 0 {
            self.keys = None;
            self.values = None;
            return Ok(());
        }
        let (keys, values) = self.held_up_to(self.len);
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

    /// The first `end` positions of the buffers (which hold at least that many).
    fn held_up_to(&self, end: i32) -> (Array, Array) {
        let (k, v) = (self.keys.as_ref().unwrap(), self.values.as_ref().unwrap());
        if k.shape()[2] == end {
            return (k.clone(), v.clone());
        }
        (k.index((.., .., ..end, ..)), v.index((.., .., ..end, ..)))
    }

    /// Keep only the first `len` positions (prefix reuse); a pooled row must have been
    /// released first. The MLX buffers keep the capacity a cache grown to `len` has, so a
    /// prefix hit attends over buffers shaped like a miss's (a kernel may choose by the
    /// buffer's layout), not like the longer sequence's it came from.
    pub fn truncate(&mut self, len: i32) {
        debug_assert!(self.pooled.is_none(), "release the pool slot first");
        self.len = self.len.min(len.max(0));
        let capacity = (self.len + KV_BLOCK - 1) / KV_BLOCK * KV_BLOCK;
        for buffer in [&mut self.keys, &mut self.values] {
            if let Some(b) = buffer.as_ref().filter(|b| b.shape()[2] > capacity) {
                *buffer = (capacity > 0).then(|| b.index((.., .., ..capacity, ..)));
            }
        }
    }
}

/// Slots one pooled attention call covers, and the step a pool class grows by.
pub const SLOTS_PER_CALL: i32 = 8;

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
/// its attention shape is too). A row enters when it starts decoding (its prefilled KV is
/// copied in; its own cache keeps that prompt part for prefix reuse), moves up a class
/// when it outgrows one, and leaves with [`release`](Self::release). Decode KV is never
/// reused by the prefix cache.
#[derive(Default)]
pub struct KvPool {
    classes: BTreeMap<i32, PoolClass>,
}

struct PoolClass {
    /// Per layer: keys and values, `[slots, kv_heads, capacity, head_dim]`.
    layers: Vec<(Array, Array)>,
    used: Vec<bool>,
}

impl KvPool {
    /// Make sure the row (its per-layer caches) has a slot with room for one more position,
    /// entering the pool or moving up a class as needed.
    pub fn place(&mut self, row: &mut [KvCache]) -> Result<()> {
        for cache in row.iter_mut() {
            cache.host_to_mlx()?;
        }
        let len = row[0].len();
        let capacity = (len + 1 + KV_BLOCK - 1) / KV_BLOCK * KV_BLOCK;
        let previous = row[0].pooled;
        if previous.is_some_and(|p| p.capacity == capacity) {
            return Ok(());
        }
        let slot = self.allocate(capacity, row)?;
        for (layer, cache) in row.iter_mut().enumerate() {
            let (keys, values) = match previous {
                Some(p) => {
                    let (k, v) = &self.classes[&p.capacity].layers[layer];
                    let held = |a: &Array| a.index((p.slot..p.slot + 1, .., ..p.len, ..));
                    (held(k), held(v))
                }
                None => cache.held_up_to(cache.len),
            };
            let (k, v) = &mut self.classes.get_mut(&capacity).expect("allocated").layers[layer];
            k.try_index_mut((slot..slot + 1, .., ..len, ..), &keys)?;
            v.try_index_mut((slot..slot + 1, .., ..len, ..), &values)?;
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

    /// Write one new position for each of `rows` (their caches at this layer) in the class
    /// of `capacity`: `keys`/`values` are `[rows, kv_heads, 1, head_dim]`, in that order.
    pub fn write(
        &mut self,
        layer: usize,
        capacity: i32,
        rows: &mut [&mut KvCache],
        keys: &Array,
        values: &Array,
    ) -> Result<()> {
        let (k, v) = &mut self.classes.get_mut(&capacity).expect("placed").layers[layer];
        let shape = k.shape().to_vec();
        let (heads, head_dim) = (shape[1], shape[3]);
        let mut index = Vec::with_capacity(rows.len() * heads as usize);
        for cache in rows.iter_mut() {
            let p = cache.pooled.as_mut().expect("placed");
            for h in 0..heads {
                index.push((p.slot * heads + h) * capacity + p.len);
            }
            p.len += 1;
        }
        let index = Array::from_slice(&index, &[index.len() as i32]);
        let n = index.shape()[0];
        let scatter = |buffer: &Array, new: &Array| -> Result<Array> {
            let flat = buffer.reshape(&[-1, head_dim])?;
            let written = scatter_single(&flat, &index, new.reshape(&[n, 1, head_dim])?, 0)?;
            Ok(written.reshape(&shape)?)
        };
        *k = scatter(k, keys)?;
        *v = scatter(v, values)?;
        Ok(())
    }

    /// Keys and values of the `SLOTS_PER_CALL` slots from `first` of a class at `layer`.
    pub fn call(&self, layer: usize, capacity: i32, first: i32) -> (Array, Array) {
        let (k, v) = &self.classes[&capacity].layers[layer];
        let span = |a: &Array| a.index(first..first + SLOTS_PER_CALL);
        (span(k), span(v))
    }

    fn allocate(&mut self, capacity: i32, like: &[KvCache]) -> Result<i32> {
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
        // Grow by a whole call's slots, shaped like the row's own buffers.
        let grown = class.used.len() as i32 + SLOTS_PER_CALL;
        let mut layers = Vec::with_capacity(like.len());
        for (layer, cache) in like.iter().enumerate() {
            let template = cache.keys.as_ref().expect("a decoding row has prefilled");
            let s = template.shape();
            let extra =
                ops::zeros_dtype(&[SLOTS_PER_CALL, s[1], capacity, s[3]], template.dtype())?;
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

fn grow(buffer: Option<Array>, like: &Array, blocks: i32) -> Result<Array> {
    let s = like.shape();
    let extra = ops::zeros_dtype(&[s[0], s[1], blocks * KV_BLOCK, s[3]], like.dtype())?;
    Ok(match buffer {
        Some(old) => ops::concatenate(&[old, extra], 2)?,
        None => extra,
    })
}
