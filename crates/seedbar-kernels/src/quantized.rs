//! Matrix products `x · Wᵀ` with affine-quantized weights (`w = scale · q + bias` for each
//! group of a row's columns, held in 4 or 8 bits: MLX's format and GGUF's Q4_0 to Q8_0, Q4_K
//! and Q5_K),
//! computed on the CPU so that **every output row depends on its own input row alone**.
//!
//! Each output `y[i][n]` is one fused multiply-add chain over the columns in order,
//! `acc = fma(w[n][k], x[i][k], acc)` for `k = 0, 1, …`, with `w[n][k] = fma(q, scale, bias)`.
//! Every kernel (AVX-512, AVX2, portable) and every tile shape computes exactly that chain,
//! so a row's result is bit-identical whatever the number of rows in the call, the row's
//! position among them, the thread that computes it, or the x86 CPU it runs on.
//!
//! Why a kernel of its own: decoding is bound by the bytes of weights read per token. Dense
//! f32 weights on OpenBLAS read 6–8× more bytes than 4-bit ones, and MLX's CPU
//! `quantized_matmul` is a scalar loop. Here the weights stay quantized in memory and are
//! widened in registers, once per tile for all of its input rows.
//!
//! With [`Activations::Int8`] the input rows are rounded to int8 per block first and the
//! chains run over integer dot products instead (the [`int8`] module: llama.cpp's way on a
//! CPU, a few times fewer instructions per weight); every kernel still agrees bit for bit.
//!
//! Layout: the weight rows are cut into panels of [`PANEL`] rows (the SIMD lanes). For float
//! activations a panel stores each pair of columns `(k, k + 1)` as 16 bytes at 4 bits (byte
//! `j`: row `j`'s `q` at `k` in the low nibble, at `k + 1` in the high one) or 32 bytes at 8
//! bits (the 16 rows at `k`, then at `k + 1`); for int8 activations, each 4 columns of a row
//! are 4 adjacent bytes (an integer dot product's lane), 64 bytes per step of 4 columns at 8
//! bits or 8 at 4 (columns `k + 4..k + 8` in the high nibbles). Scales and biases are 16
//! lanes per group.

mod int8;
mod kernels;

use std::ops::Range;

use crate::{Kernel, Team};

/// Weight rows per panel: the SIMD lanes of one AVX-512 vector.
pub const PANEL: usize = 16;

/// How a product reads its input rows: which numbers a model's products give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activations {
    /// As they are: each output one float32 FMA chain over the columns (mlx-lm's numbers).
    Float,
    /// Rounded per row and block of 32 columns to int8 (`d · a`, `|a| ≤ 127`,
    /// `d = amax / 127`) and multiplied in integer dot products, as llama.cpp's CPU backend
    /// computes a quantized matrix's products (its Q8 activations).
    Int8,
}

/// A matrix this crate cannot hold.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Unsupported {
    #[error(
        "int8 activations over {cols} columns in groups of {group_size} (columns in blocks of \
         32, each group whole steps of 8 columns, 4 at 8 bits, are needed)"
    )]
    Int8 { cols: usize, group_size: usize },
    #[error("{0}-bit weights (2 to 8 are supported)")]
    Bits(u32),
    #[error("group size {0} (an even number is needed)")]
    GroupSize(usize),
    #[error("{cols} columns in groups of {group_size}")]
    Columns { cols: usize, group_size: usize },
    #[error("{what} holds {actual} values, {expected} expected")]
    Length {
        what: &'static str,
        expected: usize,
        actual: usize,
    },
}

/// A `[rows, cols]` weight matrix, quantized per group of `group_size` columns.
#[derive(Debug, Clone)]
pub struct QuantizedMatrix {
    rows: usize,
    cols: usize,
    group_size: usize,
    bits: u32,
    activations: Activations,
    /// `[panel][column step][bytes]` (the module docs); rows past `rows` in the last panel
    /// are zero.
    data: Vec<u8>,
    /// `[panel][group][PANEL]` scales and biases.
    affine: Affine,
}

/// A matrix's scales and biases, `[panel][group][PANEL]` each: float16 where every one of
/// them is exact there (GGUF's own scales are float16), so a product reads a sixth fewer
/// bytes of a 4-bit matrix; float32 otherwise. Either way a kernel multiplies by the same
/// float32 values (the conversion is exact).
#[derive(Debug, Clone)]
pub(crate) enum Affine {
    Single { scales: Vec<f32>, biases: Vec<f32> },
    Half { scales: Vec<u16>, biases: Vec<u16> },
}

impl Affine {
    /// Float16 where every value converts exactly, else as given.
    fn new(scales: Vec<f32>, biases: Vec<f32>) -> Affine {
        let halves = |v: &[f32]| {
            v.iter()
                .map(|&x| half_bits(x))
                .collect::<Option<Vec<u16>>>()
        };
        match (halves(&scales), halves(&biases)) {
            (Some(scales), Some(biases)) => Affine::Half { scales, biases },
            _ => Affine::Single { scales, biases },
        }
    }

    /// Scale and bias `at`.
    fn get(&self, at: usize) -> (f32, f32) {
        match self {
            Affine::Single { scales, biases } => (scales[at], biases[at]),
            Affine::Half { scales, biases } => (half_value(scales[at]), half_value(biases[at])),
        }
    }

    fn len(&self) -> usize {
        match self {
            Affine::Single { scales, .. } => scales.len(),
            Affine::Half { scales, .. } => scales.len(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Affine::Single { scales, biases } => 4 * (scales.len() + biases.len()),
            Affine::Half { scales, biases } => 2 * (scales.len() + biases.len()),
        }
    }

    /// Parts end to end.
    fn join(parts: &[&Affine]) -> Affine {
        let values = parts.iter().flat_map(|a| (0..a.len()).map(|at| a.get(at)));
        let (scales, biases) = values.unzip();
        Affine::new(scales, biases)
    }
}

/// `x` as float16 bits, where it is exactly a float16 (normal or subnormal).
fn half_bits(x: f32) -> Option<u16> {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exponent = ((bits >> 23) & 0xff) as i32 - 127;
    let mantissa = bits & 0x7f_ffff;
    if x == 0.0 {
        return Some(sign);
    }
    if (-14..=15).contains(&exponent) {
        // Normal: the mantissa's low 13 bits are dropped.
        return (mantissa & 0x1fff == 0)
            .then(|| sign | (((exponent + 15) as u16) << 10) | (mantissa >> 13) as u16);
    }
    if (-24..-14).contains(&exponent) {
        // Subnormal: the value in units of 2^-24.
        let shift = (-exponent - 1) as u32;
        let full = mantissa | 0x80_0000;
        return (full & ((1 << shift) - 1) == 0).then(|| sign | (full >> shift) as u16);
    }
    None
}

/// The float16 `h` as f32 (exact).
fn half_value(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let (exponent, mantissa) = (((h >> 10) & 0x1f) as i32, (h & 0x3ff) as f32);
    sign * match exponent {
        0 => mantissa * 2f32.powi(-24),
        _ => (1024.0 + mantissa) * 2f32.powi(exponent - 25),
    }
}

/// MLX's affine quantization of a `[rows, cols]` matrix, as its arrays hold it.
#[derive(Debug, Clone, Copy)]
pub struct MlxAffine<'a> {
    /// The `[rows, cols · bits / 32]` uint32 weight: each row's `bits`-bit values one stream
    /// from the low bits up.
    pub words: &'a [u32],
    /// `[rows, cols / group_size]`.
    pub scales: &'a [f32],
    /// `[rows, cols / group_size]`.
    pub biases: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub group_size: usize,
    pub bits: u32,
}

impl QuantizedMatrix {
    /// Repack MLX's affine quantization for products over `activations`. Values of 2 to 4
    /// bits are held in 4 bits, of 5 to 8 in 8 (GGUF's Q5_0 and Q5_1 among them): the same
    /// values, the same chains. Int8 activations need columns in blocks of 32 whose groups
    /// hold whole steps of 8 columns (4 at 8 bits); every MLX and GGUF format does.
    pub fn from_mlx_affine(
        mlx: MlxAffine<'_>,
        activations: Activations,
    ) -> Result<Self, Unsupported> {
        let MlxAffine {
            words,
            scales,
            biases,
            rows,
            cols,
            group_size,
            bits,
        } = mlx;
        if !(2..=8).contains(&bits) {
            return Err(Unsupported::Bits(bits));
        }
        if group_size == 0 || !group_size.is_multiple_of(2) {
            return Err(Unsupported::GroupSize(group_size));
        }
        if !cols.is_multiple_of(group_size) || !(cols * bits as usize).is_multiple_of(32) {
            return Err(Unsupported::Columns { cols, group_size });
        }
        let groups = rows * (cols / group_size);
        for (what, len, expected) in [
            ("the weight", words.len(), rows * cols * bits as usize / 32),
            ("the scales", scales.len(), groups),
            ("the biases", biases.len(), groups),
        ] {
            if len != expected {
                return Err(Unsupported::Length {
                    what,
                    expected,
                    actual: len,
                });
            }
        }
        let format = Format {
            cols,
            group_size,
            bits: if bits <= 4 { 4 } else { 8 },
            activations,
        };
        if activations == Activations::Int8 && !int8::holds(format) {
            return Err(Unsupported::Int8 { cols, group_size });
        }
        let mask = (1u64 << bits) - 1;
        let row_groups = cols / group_size;
        Ok(Self::from_fn(
            format,
            rows,
            |row, col| {
                let at = (row * cols + col) * bits as usize;
                let (word, shift) = (at / 32, at % 32);
                let next = words.get(word + 1).map_or(0, |&w| u64::from(w));
                (((u64::from(words[word]) | next << 32) >> shift) & mask) as u8
            },
            |row, group| {
                let at = row * row_groups + group;
                (scales[at], biases[at])
            },
        ))
    }

    /// Pack from accessors: `q(row, col)` and `affine(row, group) = (scale, bias)`.
    fn from_fn(
        format: Format,
        rows: usize,
        q: impl Fn(usize, usize) -> u8,
        affine: impl Fn(usize, usize) -> (f32, f32),
    ) -> Self {
        let Format {
            cols,
            group_size,
            bits,
            activations,
        } = format;
        let panels = rows.div_ceil(PANEL);
        let row_groups = cols / group_size;
        let lane = |panel: usize, j: usize| Some(panel * PANEL + j).filter(|&r| r < rows);
        let mut data = Vec::with_capacity(panels * cols / 2 * pair_bytes(bits));
        let (mut scales, mut biases) = (Vec::new(), Vec::new());
        for panel in 0..panels {
            let at = |j, col| lane(panel, j).map_or(0, |r| q(r, col));
            match (activations, bits) {
                (Activations::Float, 4) => {
                    for k in (0..cols).step_by(2) {
                        data.extend((0..PANEL).map(|j| at(j, k) | (at(j, k + 1) << 4)));
                    }
                }
                (Activations::Float, _) => {
                    for k in (0..cols).step_by(2) {
                        data.extend((0..PANEL).map(|j| at(j, k)));
                        data.extend((0..PANEL).map(|j| at(j, k + 1)));
                    }
                }
                (Activations::Int8, 4) => {
                    for k in (0..cols).step_by(8) {
                        let lane = |j| (0..4).map(move |b| at(j, k + b) | (at(j, k + 4 + b) << 4));
                        data.extend((0..PANEL).flat_map(lane));
                    }
                }
                (Activations::Int8, _) => {
                    for k in (0..cols).step_by(4) {
                        data.extend((0..PANEL).flat_map(|j| (0..4).map(move |b| at(j, k + b))));
                    }
                }
            }
            for g in 0..row_groups {
                for j in 0..PANEL {
                    let (s, b) = lane(panel, j).map_or((0.0, 0.0), |r| affine(r, g));
                    scales.push(s);
                    biases.push(b);
                }
            }
        }
        QuantizedMatrix {
            rows,
            cols,
            group_size,
            bits,
            activations,
            data,
            affine: Affine::new(scales, biases),
        }
    }

    fn format(&self) -> Format {
        Format {
            cols: self.cols,
            group_size: self.group_size,
            bits: self.bits,
            activations: self.activations,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn bits(&self) -> u32 {
        self.bits
    }

    pub fn group_size(&self) -> usize {
        self.group_size
    }

    pub fn activations(&self) -> Activations {
        self.activations
    }

    /// Bytes the weights take in memory (what one full product reads).
    pub fn bytes(&self) -> usize {
        self.data.len() + self.affine.bytes()
    }

    /// Rows `range` as a matrix of their own (fused projections split at load).
    pub fn slice_rows(&self, range: Range<usize>) -> QuantizedMatrix {
        Self::from_fn(
            self.format(),
            range.len(),
            |row, col| self.q(range.start + row, col),
            |row, group| self.affine(range.start + row, group),
        )
    }

    /// The rows of `parts` end to end, as one matrix: projections of the same input (q, k
    /// and v; gate and up) become one product, one pass over the input and one dispatch.
    /// Each row keeps its values, so each output is the same chain as in its own part.
    /// `None` when the parts differ in columns, group size, bits or activations (or there
    /// are none).
    pub fn stack_rows(parts: &[&QuantizedMatrix]) -> Option<QuantizedMatrix> {
        let first = parts.first()?;
        if parts.iter().any(|m| m.format() != first.format()) {
            return None;
        }
        if parts[..parts.len() - 1]
            .iter()
            .all(|m| m.rows.is_multiple_of(PANEL))
        {
            // Every part starts on a panel of its own: the panels are laid end to end.
            let affines: Vec<&Affine> = parts.iter().map(|m| &m.affine).collect();
            return Some(QuantizedMatrix {
                rows: parts.iter().map(|m| m.rows).sum(),
                data: parts.iter().flat_map(|m| &m.data).copied().collect(),
                affine: Affine::join(&affines),
                cols: first.cols,
                group_size: first.group_size,
                bits: first.bits,
                activations: first.activations,
            });
        }
        // Row `r` of the stack is row `r - starts[p]` of part `p`.
        let starts: Vec<usize> = parts
            .iter()
            .scan(0, |start, m| {
                let at = *start;
                *start += m.rows;
                Some(at)
            })
            .collect();
        let locate = |row: usize| {
            let p = starts.partition_point(|&s| s <= row) - 1;
            (parts[p], row - starts[p])
        };
        Some(Self::from_fn(
            first.format(),
            parts.iter().map(|m| m.rows).sum(),
            |row, col| {
                let (m, r) = locate(row);
                m.q(r, col)
            },
            |row, group| {
                let (m, r) = locate(row);
                m.affine(r, group)
            },
        ))
    }

    /// Row `row` of the matrix as f32, `fma(q, scale, bias)`: the weights the kernels use.
    pub fn dequantize_row(&self, row: usize) -> Vec<f32> {
        (0..self.cols)
            .map(|col| {
                let (s, b) = self.affine(row, col / self.group_size);
                (self.q(row, col) as f32).mul_add(s, b)
            })
            .collect()
    }

    /// `x · Wᵀ` for `m` rows of `x` (`[m, cols]`, row-major): `[m, rows]`, row-major. Each
    /// output row is a function of its input row alone (see the module docs). Work is split
    /// by panels of output columns over the process's [`Team`].
    pub fn matmul_transposed(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_transposed_with(Kernel::detect(), Team::shared(), x, m)
    }

    /// [`matmul_transposed`](Self::matmul_transposed) on a given kernel and team (tests run
    /// each kernel this CPU has). Panics on a kernel the CPU lacks.
    pub fn matmul_transposed_with(
        &self,
        kernel: Kernel,
        team: &Team,
        x: &[f32],
        m: usize,
    ) -> Vec<f32> {
        assert!(kernel.is_available(), "{kernel:?} is not available");
        assert_eq!(x.len(), m * self.cols, "x must be [m, cols]");
        let mut out = vec![0.0f32; m * self.rows];
        if m == 0 || self.rows == 0 {
            return out;
        }
        let panels = self.rows.div_ceil(PANEL);
        let per_task = panels_per_task(panels, team.threads());
        let target = OutPtr(out.as_mut_ptr());
        let rounded = (self.activations == Activations::Int8)
            .then(|| int8::Rows::new(x, m, self.cols, self.group_size));
        team.for_each(panels.div_ceil(per_task), |t| {
            let range = t * per_task..((t + 1) * per_task).min(panels);
            // SAFETY: every task writes the disjoint columns of its own panels.
            unsafe {
                match &rounded {
                    Some(rows) => kernel.run_int8(self, rows, m, range, target.get()),
                    None => kernel.run(self, x, m, range, target.get()),
                }
            };
        });
        out
    }

    fn panel_bytes(&self) -> usize {
        self.cols / 2 * pair_bytes(self.bits)
    }

    /// The quantized value at `(row, col)`.
    fn q(&self, row: usize, col: usize) -> u8 {
        let (panel, j) = (row / PANEL, row % PANEL);
        let panel = &self.data[panel * self.panel_bytes()..];
        match (self.activations, self.bits) {
            (Activations::Float, 4) => {
                let byte = panel[col / 2 * pair_bytes(4) + j];
                if col.is_multiple_of(2) {
                    byte & 15
                } else {
                    byte >> 4
                }
            }
            (Activations::Float, _) => panel[col / 2 * pair_bytes(8) + (col % 2) * PANEL + j],
            (Activations::Int8, 4) => {
                let byte = panel[col / 8 * int8::STEP_BYTES + 4 * j + col % 4];
                if col % 8 < 4 {
                    byte & 15
                } else {
                    byte >> 4
                }
            }
            (Activations::Int8, _) => panel[col / 4 * int8::STEP_BYTES + 4 * j + col % 4],
        }
    }

    fn affine(&self, row: usize, group: usize) -> (f32, f32) {
        let groups = self.cols / self.group_size;
        self.affine
            .get((row / PANEL * groups + group) * PANEL + row % PANEL)
    }
}

/// What a matrix's codes are and how they are laid out (matrices of one format stack).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Format {
    cols: usize,
    group_size: usize,
    /// Bits a code is held in: 4 or 8.
    bits: u32,
    activations: Activations,
}

/// Bytes of one panel's pair of columns.
fn pair_bytes(bits: u32) -> usize {
    2 * PANEL * bits as usize / 8
}

/// Panels per task: enough tasks to balance the threads, each long enough that scheduling
/// costs little next to its work.
fn panels_per_task(panels: usize, threads: usize) -> usize {
    let tasks = threads * 4;
    panels.div_ceil(tasks).clamp(2, 64)
}

/// The output buffer, shared by tasks that write disjoint columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

// SAFETY: tasks write disjoint elements (see `matmul_transposed`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float16_bits_round_trip_exactly_or_not_at_all() {
        let subnormals = [5.0 * 2f32.powi(-24), -1000.0 * 2f32.powi(-24)];
        for x in [
            0.0f32,
            -0.0,
            1.0,
            -2.5,
            65504.0,
            6.103_515_6e-5,
            5.960_464_5e-8,
        ]
        .into_iter()
        .chain(subnormals)
        {
            let h = half_bits(x).unwrap_or_else(|| panic!("{x} is a float16"));
            assert_eq!(half_value(h).to_bits(), x.to_bits(), "{x}");
        }
        for x in [
            0.1f32,
            65536.0,
            1.0e-8,
            1.0 + 1.0 / 4096.0,
            f32::NAN,
            f32::INFINITY,
        ] {
            assert_eq!(half_bits(x), None, "{x}");
        }
    }
}
