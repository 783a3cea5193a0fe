//! A layer's KV as plain data and back ([`KvSnapshot`]): what the prefix cache's disk tier
//! writes and reads. A restored cache holds the same positions, in storage of the same
//! kind and shape, as the cache snapshotted (MLX buffers of its capacity, or the packed CPU
//! path's host store), so a step on it computes what a step on the original would.

use std::sync::Arc;

use mlx_rs::{Array, Dtype};

use super::{HostKv, KvCache};
use crate::error::{EngineError, Result};

/// One layer's KV as plain data.
#[derive(Debug, Clone, PartialEq)]
pub struct KvSnapshot {
    /// The layer's sliding window, if any.
    pub window: Option<i32>,
    /// The oldest position held.
    pub first: i32,
    /// Positions written.
    pub len: i32,
    pub stored: StoredKv,
}

/// Where a snapshot's keys and values are, as the cache kept them.
#[derive(Debug, Clone, PartialEq)]
pub enum StoredKv {
    /// No position held.
    Empty,
    /// The packed CPU path's host store: positions `first..len`, `width()` floats each
    /// (exactly that many: [`KvCache::snapshot`] cuts what a truncation left behind).
    Host(Arc<HostKv>),
    /// MLX buffers `[1, kv_heads, capacity, head_dim]` of `dtype`, row-major, as bytes in
    /// the machine's order: buffer index `i` holds position `first + i`.
    Device {
        dtype: Dtype,
        shape: [i32; 4],
        keys: Vec<u8>,
        values: Vec<u8>,
    },
}

/// Bytes of one element of the dtypes KV is kept in.
fn element_bytes(dtype: Dtype) -> Result<usize> {
    match dtype {
        Dtype::Float32 => Ok(4),
        Dtype::Float16 | Dtype::Bfloat16 => Ok(2),
        other => Err(EngineError::InvalidRequest(format!(
            "KV of dtype {other:?} cannot be kept"
        ))),
    }
}

/// An evaluated buffer's bytes, row-major.
fn bytes_of(buffer: &Array) -> Result<Vec<u8>> {
    let buffer = buffer.contiguous()?;
    Ok(match buffer.dtype() {
        Dtype::Float32 => bytemuck::cast_slice(buffer.try_as_slice::<f32>()?).to_vec(),
        Dtype::Float16 => bytemuck::cast_slice(buffer.try_as_slice::<half::f16>()?).to_vec(),
        Dtype::Bfloat16 => bytemuck::cast_slice(buffer.try_as_slice::<half::bf16>()?).to_vec(),
        other => {
            return Err(EngineError::InvalidRequest(format!(
                "KV of dtype {other:?} cannot be kept"
            )))
        }
    })
}

/// Bytes of a buffer of `shape` and `dtype`; `None` unless every dimension is positive and
/// the size fits.
pub fn buffer_bytes(shape: &[i32; 4], dtype: Dtype) -> Option<usize> {
    let size = element_bytes(dtype).ok()?;
    shape.iter().try_fold(size, |n, &d| {
        let d = usize::try_from(d).ok().filter(|&d| d > 0)?;
        n.checked_mul(d)
    })
}

/// A buffer of `shape` and `dtype` from its row-major bytes.
fn buffer_from(bytes: &[u8], shape: &[i32; 4], dtype: Dtype) -> Result<Array> {
    if buffer_bytes(shape, dtype) != Some(bytes.len()) {
        return Err(EngineError::InvalidRequest(format!(
            "a KV buffer of shape {shape:?} and {dtype:?} does not hold {} bytes",
            bytes.len()
        )));
    }
    Ok(match dtype {
        Dtype::Float32 => Array::from_slice(&bytemuck::pod_collect_to_vec::<u8, f32>(bytes), shape),
        Dtype::Float16 => {
            Array::from_slice(&bytemuck::pod_collect_to_vec::<u8, half::f16>(bytes), shape)
        }
        _ => Array::from_slice(
            &bytemuck::pod_collect_to_vec::<u8, half::bf16>(bytes),
            shape,
        ),
    })
}

impl KvCache {
    /// This cache's positions as plain data. A pooled row must have been released first;
    /// what [`hold_cut_back_to`](Self::hold_cut_back_to) kept is not part of it.
    pub fn snapshot(&self) -> Result<KvSnapshot> {
        debug_assert!(self.pooled.is_none(), "release the pool slot first");
        let held = self.held().max(0) as usize;
        let stored = if let Some(host) = &self.host {
            // Shared as it is, unless a truncation left positions past the length behind.
            let floats = held * host.width();
            StoredKv::Host(if host.keys.len() == floats {
                host.clone()
            } else {
                Arc::new(HostKv {
                    keys: host.keys[..floats].to_vec(),
                    values: host.values[..floats].to_vec(),
                    ..**host
                })
            })
        } else if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            let s = k.shape();
            StoredKv::Device {
                dtype: k.dtype(),
                shape: [s[0], s[1], s[2], s[3]],
                keys: bytes_of(k)?,
                values: bytes_of(v)?,
            }
        } else {
            StoredKv::Empty
        };
        Ok(KvSnapshot {
            window: self.window,
            first: self.first,
            len: self.len,
            stored,
        })
    }

    /// The cache a snapshot was taken of; an inconsistent snapshot (sizes that do not
    /// match its positions) is refused.
    pub fn restore(snapshot: KvSnapshot) -> Result<KvCache> {
        let KvSnapshot {
            window,
            first,
            len,
            stored,
        } = snapshot;
        let held = len - first;
        let refuse = |what: &str| {
            Err(EngineError::InvalidRequest(format!(
                "a KV snapshot of positions {first}..{len} {what}"
            )))
        };
        if first < 0 || held < 0 || window.is_some_and(|w| w <= 0) {
            return refuse("is not a range of positions");
        }
        let mut cache = KvCache {
            window,
            first,
            len,
            ..KvCache::default()
        };
        match stored {
            StoredKv::Empty if held > 0 => return refuse("holds no keys"),
            StoredKv::Empty => {}
            StoredKv::Host(host) => {
                let width = host.kv_heads.checked_mul(host.head_dim).filter(|&w| w > 0);
                let floats = width.and_then(|width| width.checked_mul(held as usize));
                let sized = |keys: &[f32]| Some(keys.len()) == floats;
                if !sized(&host.keys) || !sized(&host.values) {
                    return refuse("has host keys of another size");
                }
                cache.host = Some(host);
            }
            StoredKv::Device {
                dtype,
                shape,
                keys,
                values,
            } => {
                if shape[0] != 1 || shape[2] < held {
                    return refuse(&format!("does not fit buffers of shape {shape:?}"));
                }
                cache.keys = Some(buffer_from(&keys, &shape, dtype)?);
                cache.values = Some(buffer_from(&values, &shape, dtype)?);
            }
        }
        Ok(cache)
    }
}
