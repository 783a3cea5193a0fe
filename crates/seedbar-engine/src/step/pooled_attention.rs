//! Pooled decode attention per query ([`PooledAttention::PerQuery`], CUDA's layout): each
//! decoding row's query over its own positions of its pool slot, in an order those
//! positions fix, so a row's output is the same bits at any capacity, slot or company, and
//! a query at position `p` gets what any query of its row at `p` gets. On CUDA this is one
//! kernel of Seedbar's own (`pooled_attention.cu`): a launch per pool class and layer for
//! every decoding row in that class, with no work for empty slots; from a few rows on, a
//! block takes all the query heads of a key-value head (the same bits, fewer reads).
//! Elsewhere (the CUDA layout run on the CPU, a layer the kernel does not take) each query
//! is an attention call of its own over exactly its positions.
//!
//! [`PooledAttention::PerQuery`]: super::plan::PooledAttention::PerQuery

use std::sync::OnceLock;

use mlx_rs::{ops, ops::indexing::IndexOp, Array, Dtype};

use super::{attention::AttentionMath, plan::Uploads};
use crate::{
    cuda_kernel::{self, KernelSource, Launch},
    error::Result,
    runtime::Backend,
};

/// One decoding row's query against the class's buffers.
#[derive(Debug, Clone, Copy)]
pub struct QueryRow {
    /// Where its query lies among the step's stacked queries.
    pub place: i32,
    /// Its slot in the class's buffers.
    pub slot: i32,
    /// Positions it sees end here (its length, its new position included)...
    pub len: i32,
    /// ...and start here (0, or where a sliding window starts).
    pub first: i32,
}

/// Threads per block: four warps, each taking every fourth tile of positions.
const THREADS: i32 = 128;

/// From this many (row, key-value head) pairs in a launch on, a block takes all the query
/// heads of a key-value head (reading each key and value once for them); below it, a head
/// each (more blocks for few rows). The same bits either way, so the choice may follow the
/// row count.
const GROUPED_FROM: i32 = 64;

/// The most query heads times head dim a block takes (its registers: a running output of
/// `HD / 32` floats per head and lane).
const GROUP_MOST_ELEMENTS: i32 = 1024;

static KERNEL: KernelSource = KernelSource {
    name: "seedbar_pooled_attention",
    body: include_str!("pooled_attention.cu"),
    header: "",
    inputs: &["q", "keys", "values", "rows"],
};

/// Whether the kernel attends a layer of `head_dim` computed in `dtype`: 16-bit floats
/// (its 16-byte loads take 8 of them), head dims that are a multiple of 32 up to 256, on
/// MLX's CUDA backend, where it passes its check.
fn kernel_runs(head_dim: i32, dtype: Dtype) -> bool {
    static CHECKED: OnceLock<bool> = OnceLock::new();
    matches!(dtype, Dtype::Float16 | Dtype::Bfloat16)
        && head_dim % 32 == 0
        && head_dim <= 256
        && Backend::current() == Backend::Cuda
        && *CHECKED.get_or_init(|| cuda_kernel::passes("the pooled attention kernel", check))
}

/// Whether blocks of a key-value head's query heads give each head its bits of a block a
/// head on this GPU (checked once, after the kernel's own check).
fn grouping_runs() -> bool {
    static CHECKED: OnceLock<bool> = OnceLock::new();
    *CHECKED.get_or_init(|| {
        cuda_kernel::passes("the pooled attention kernel's grouped blocks", || {
            let (q, keys, values) = check_inputs()?;
            let run = |group| {
                let cache = (&keys, &values);
                launch_kernel(
                    &q,
                    cache,
                    &check_rows(),
                    (0.125, None),
                    group,
                    &mut Uploads::default(),
                )
            };
            Ok(run(4)?.eq_values(&run(1)?)?)
        })
    })
}

/// The checks' queries (4 of 8 heads of 64), keys and values (3 slots of 2 key-value heads).
fn check_inputs() -> Result<(Array, Array, Array)> {
    let dtype = Dtype::Bfloat16;
    Ok((
        cuda_kernel::check_values(&[4, 8, 1, 64], 11, dtype)?,
        cuda_kernel::check_values(&[3, 2, 256, 64], 13, dtype)?,
        cuda_kernel::check_values(&[3, 2, 256, 64], 17, dtype)?,
    ))
}

/// The checks' rows: the target (query 0, slot 1, 200 positions) second, among rows of other
/// slots and lengths and its own row's next position.
fn check_rows() -> [QueryRow; 4] {
    let row = |place, slot, len, first| QueryRow {
        place,
        slot,
        len,
        first,
    };
    [
        row(1, 2, 37, 0),
        row(0, 1, 200, 0),
        row(2, 1, 201, 0),
        row(3, 0, 256, 100),
    ]
}

/// The kernel on this GPU: a query gets its bits alone and among rows of other slots and
/// lengths (its own row's next position among them), and MLX's attention's values over
/// exactly its positions within bfloat16's rounding.
fn check() -> Result<bool> {
    let (q, keys, values) = check_inputs()?;
    let scale = 0.125;
    let run = |rows: &[QueryRow]| {
        let cache = (&keys, &values);
        launch_kernel(&q, cache, rows, (scale, None), 1, &mut Uploads::default())
    };
    let together = check_rows();
    let alone = run(&together[1..2])?;
    let same = run(&together)?.index(1..2).eq_values(&alone)?;
    let seen = |a: &Array| a.index((1..2, .., ..200, ..));
    let reference = mlx_rs::fast::scaled_dot_product_attention(
        q.index(0..1),
        seen(&keys),
        seen(&values),
        scale,
        None,
        None,
    )?;
    // The kernel writes a row's heads end to end.
    let reference = reference.reshape(&[1, -1])?;
    Ok(same && alone.all_close(&reference, 2e-2, 2e-2, None)?)
}

/// `rows`' outputs (`[rows, H · hd]`, each row's heads end to end, in order) from the step's stacked queries `q`
/// (`[P, H, 1, hd]`, rotated) against one class's `keys` and `values` (`[S, kv_heads, C,
/// hd]`, position `t` at `t % C`), with `layer`'s scale and score cap.
pub fn attend(
    layer: &impl AttentionMath,
    q: &Array,
    (keys, values): (&Array, &Array),
    rows: &[QueryRow],
    uploads: &mut Uploads,
) -> Result<Array> {
    if !kernel_runs(layer.head_dim(), q.dtype()) {
        return each_query(layer, q, (keys, values), rows, uploads);
    }
    let factors = (layer.scale(), layer.softcap());
    let (heads, kv_heads) = (q.shape()[1], keys.shape()[1]);
    let group = heads / kv_heads;
    let grouped = rows.len() as i32 * kv_heads >= GROUPED_FROM
        && group * layer.head_dim() <= GROUP_MOST_ELEMENTS
        && grouping_runs();
    let group = if grouped { group } else { 1 };
    launch_kernel(q, (keys, values), rows, factors, group, uploads)
}

/// [`attend`] on the kernel, scores scaled by `scale` and, where given, capped by `softcap`
/// (`cap · tanh(s / cap)`), `group` query heads a block (1, or the heads per key-value head).
fn launch_kernel(
    q: &Array,
    (keys, values): (&Array, &Array),
    rows: &[QueryRow],
    (scale, softcap): (f32, Option<f32>),
    group: i32,
    uploads: &mut Uploads,
) -> Result<Array> {
    let (heads, head_dim) = (q.shape()[1], q.shape()[3]);
    // The score's factors as float bits, then each row's numbers.
    let factors = [scale, softcap.unwrap_or(1.0)].map(|f| f.to_bits() as i32);
    let table: Vec<i32> = factors
        .into_iter()
        .chain(rows.iter().flat_map(|r| [r.place, r.slot, r.len, r.first]))
        .collect();
    // Uploaded once a step for all layers, and read flat: no op a layer.
    let table = uploads.get(&table).clone();
    let count = rows.len() as i32;
    let launch = Launch {
        shape: &[count, heads * head_dim],
        dtype: q.dtype(),
        threads: count * heads / group * THREADS,
        block: THREADS,
        template: &[
            (c"HD", head_dim),
            (c"SOFTCAP", i32::from(softcap.is_some())),
            (c"GROUP", group),
        ],
    };
    cuda_kernel::launch(&KERNEL, &[q, keys, values, &table], launch)
}

/// [`attend`] off the kernel: each query an attention call of its own over exactly its
/// positions, gathered from its slot in position order.
fn each_query(
    layer: &impl AttentionMath,
    q: &Array,
    (keys, values): (&Array, &Array),
    rows: &[QueryRow],
    uploads: &mut Uploads,
) -> Result<Array> {
    let capacity = keys.shape()[2];
    let outs = rows
        .iter()
        .map(|r| {
            let at: Vec<i32> = (r.first..r.len).map(|t| t % capacity).collect();
            let at = uploads.get(&at).clone();
            let seen =
                |a: &Array| -> Result<Array> { Ok(a.index(r.slot..r.slot + 1).take_axis(&at, 2)?) };
            let query = q.index(r.place..r.place + 1);
            layer.attend(query, seen(keys)?, seen(values)?, None)
        })
        .collect::<Result<Vec<_>>>()?;
    let width = q.shape()[1] * q.shape()[3];
    Ok(ops::concatenate(&outs, 0)?.reshape(&[-1, width])?)
}
