//! MLX's scatter over several leading axes at once, which mlx-rs wraps only along one: the
//! pool writes a step's new keys and values at `(slot, head, position)` in its
//! `[slots, kv_heads, ring, head_dim]` buffers as they are, with no reshape before or after.

use mlx_rs::{Array, Stream};

use crate::error::{EngineError, Result};

/// `buffer` with `updates[i]` at `(indices[0][i], indices[1][i], ...)` of its leading axes,
/// the rest of it unchanged; `updates` is `[n, 1, .., 1, rest of buffer's shape]` (one
/// element on each indexed axis).
pub(super) fn scatter_leading(buffer: &Array, indices: &[Array], updates: &Array) -> Result<Array> {
    let axes: Vec<i32> = (0..indices.len() as i32).collect();
    let stream = Stream::thread_local_or_default();
    // SAFETY: every handle passed lives through the call; the index vector is freed after
    // it, and the result is a new array MLX hands over (empty where the call failed).
    unsafe {
        let vector = mlx_sys::mlx_vector_array_new();
        for index in indices {
            mlx_sys::mlx_vector_array_append_value(vector, index.as_ptr());
        }
        let mut out = mlx_sys::mlx_array_new();
        let status = mlx_sys::mlx_scatter(
            &mut out,
            buffer.as_ptr(),
            vector,
            updates.as_ptr(),
            axes.as_ptr(),
            axes.len(),
            stream.as_ptr(),
        );
        mlx_sys::mlx_vector_array_free(vector);
        let out = Array::from_ptr(out);
        if status != 0 {
            return Err(EngineError::Mlx("MLX refused a scatter".to_string()));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use mlx_rs::ops::indexing::scatter_single;

    use super::*;

    /// The same array as a scatter of the flattened buffer along its first axis.
    #[test]
    fn writes_what_a_scatter_of_the_flat_buffer_writes() {
        let (slots, heads, ring, dim) = (3, 2, 5, 4);
        let buffer = Array::from_iter(0..slots * heads * ring * dim, &[slots, heads, ring, dim])
            .as_dtype(mlx_rs::Dtype::Float32)
            .unwrap();
        let (slot, head, position) = ([2, 0, 1], [1, 0, 1], [4, 0, 2]);
        let n = slot.len() as i32;
        let updates = Array::from_iter((0..n * dim).map(|x| -(x as f32)), &[n, 1, 1, 1, dim]);
        let index = |v: &[i32]| Array::from_slice(v, &[n]);
        let written = scatter_leading(
            &buffer,
            &[index(&slot), index(&head), index(&position)],
            &updates,
        )
        .unwrap();
        let flat: Vec<i32> = (0..n as usize)
            .map(|i| (slot[i] * heads + head[i]) * ring + position[i])
            .collect();
        let expected = scatter_single(
            buffer.reshape(&[-1, dim]).unwrap(),
            index(&flat),
            updates.reshape(&[n, 1, dim]).unwrap(),
            0,
        )
        .unwrap()
        .reshape(&[slots, heads, ring, dim])
        .unwrap();
        assert_eq!(written.shape(), expected.shape());
        assert_eq!(
            written.as_slice::<f32>(),
            expected.as_slice::<f32>(),
            "the same writes"
        );
        assert_ne!(written.as_slice::<f32>(), buffer.as_slice::<f32>());
    }
}
