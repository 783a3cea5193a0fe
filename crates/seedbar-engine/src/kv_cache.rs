//! Per-layer key/value cache of one batch of sequences: `[B, kv_heads, T, head_dim]` buffers
//! that grow in fixed blocks, so decode writes in place instead of re-concatenating.

use mlx_rs::{
    ops::{
        self,
        indexing::{IndexOp, TryIndexMutOp},
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
    len: i32,
}

impl KvCache {
    /// Number of positions held.
    pub fn len(&self) -> i32 {
        self.len
    }

    /// Bytes allocated for keys and values (capacity, not just the positions used).
    pub fn bytes(&self) -> usize {
        [&self.keys, &self.values]
            .into_iter()
            .flatten()
            .map(Array::nbytes)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Append `[B, H, L, D]` keys and values; returns everything held so far.
    pub fn append(&mut self, keys: Array, values: Array) -> Result<(Array, Array)> {
        self.write(keys, values)?;
        Ok(self.held_up_to(self.len))
    }

    /// Append like [`append`](Self::append), but return the buffers up to the capacity a
    /// cache of this length has (`len` rounded up to a whole `KV_BLOCK`), whatever this
    /// buffer's own size: the positions past `len` are to be masked. The shape is a
    /// function of the length alone, also for a cache cloned from a longer one.
    pub fn append_at_capacity(&mut self, keys: Array, values: Array) -> Result<(Array, Array)> {
        self.write(keys, values)?;
        Ok(self.held_up_to((self.len + KV_BLOCK - 1) / KV_BLOCK * KV_BLOCK))
    }

    /// Write `keys` and `values` after the held positions, growing the buffers by whole
    /// blocks when they are full.
    fn write(&mut self, keys: Array, values: Array) -> Result<()> {
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
        Ok(())
    }

    /// The first `end` positions of the buffers (written after [`write`](Self::write)).
    fn held_up_to(&self, end: i32) -> (Array, Array) {
        let (k, v) = (self.keys.as_ref().unwrap(), self.values.as_ref().unwrap());
        if k.shape()[2] == end {
            return (k.clone(), v.clone());
        }
        (k.index((.., .., ..end, ..)), v.index((.., .., ..end, ..)))
    }

    /// Keep only the first `len` positions (prefix reuse).
    pub fn truncate(&mut self, len: i32) {
        self.len = self.len.min(len.max(0));
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
