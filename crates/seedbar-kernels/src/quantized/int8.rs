//! Products over int8 activations ([`Activations::Int8`](super::Activations)). Each input
//! row is first rounded per block of [`BLOCK`] columns to `d · a`, `d = amax / 127` and `a`
//! in −127..=127 ([`Rows`]); then for output `(i, n)`, over weight `n`'s groups in order:
//!
//! - for each unit of the group (its columns within one block): `s = Σ q · a`, an exact
//!   integer sum, and `acc = fma(s as f32, scale · d, acc)`;
//! - then `acc = fma(bias, Σ d · Σ a, acc)`, the second factor the row's own sum over the
//!   group ([`Rows`] holds it).
//!
//! An integer sum is the same whichever instruction adds it (AVX-512 VNNI's `vpdpbusd`, AVX2's
//! `vpmaddubsw` pairs, a plain loop) and the float steps are the same in every kernel, so
//! every kernel and tile shape gives the same bits, and a row's result depends on its own row
//! alone. Per 64 weights at 4 bits, one `vpdpbusd` per input row replaces 64 float FMAs and
//! their conversions: the weights' codes are never widened to floats.

use std::ops::Range;

use super::{Activations, Format, QuantizedMatrix, PANEL};
use crate::Kernel;

/// Columns that share one activation scale.
pub const BLOCK: usize = 32;

/// Bytes of a panel's step: 16 lanes of 4 bytes (4 columns at 8 bits, 8 at 4).
pub const STEP_BYTES: usize = 4 * PANEL;

/// Columns one step of a panel covers.
fn step_columns(bits: u32) -> usize {
    if bits == 4 {
        8
    } else {
        4
    }
}

/// Columns of a unit: what a group shares with one block.
fn unit(group_size: usize) -> usize {
    let (mut a, mut b) = (group_size, BLOCK);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Whether int8 products hold this format: whole blocks, units of whole steps.
pub(super) fn holds(format: Format) -> bool {
    format.cols.is_multiple_of(BLOCK)
        && unit(format.group_size).is_multiple_of(step_columns(format.bits))
}

/// `v` rounded to the nearest integer, ties to even, for `|v| < 2^22` (NaN stays NaN): adding
/// and taking away 1.5 · 2^23 rounds in the default rounding mode. (`round_ties_even` is a
/// libm call per value on x86-64's baseline.)
#[inline(always)]
fn nearest(v: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0;
    (v + SHIFT) - SHIFT
}

/// `m` input rows rounded to int8, with what the products need of each row.
pub(crate) struct Rows {
    cols: usize,
    groups: usize,
    /// `[m, cols]`.
    values: Vec<i8>,
    /// `[m, cols / BLOCK]`: each block's `d`.
    scales: Vec<f32>,
    /// `[m, groups]`: `Σ d · Σ a` over each group's units, an FMA chain in order.
    group_sums: Vec<f32>,
}

impl Rows {
    /// Round `x` (`[m, cols]`) for products of groups of `group_size` columns.
    pub fn new(x: &[f32], m: usize, cols: usize, group_size: usize) -> Rows {
        let unit = unit(group_size);
        let mut values = vec![0i8; m * cols];
        let mut scales = Vec::with_capacity(m * cols / BLOCK);
        for (row, rounded) in x.chunks_exact(cols).zip(values.chunks_exact_mut(cols)) {
            for (block, out) in row.chunks_exact(BLOCK).zip(rounded.chunks_exact_mut(BLOCK)) {
                // A block with a NaN or an infinity makes its products NaN, as floats would.
                let (amax, finite) = block.iter().fold((0.0f32, true), |(a, finite), v| {
                    (a.max(v.abs()), finite && v.is_finite())
                });
                let d = if finite { amax / 127.0 } else { f32::NAN };
                let inverse = if amax == 0.0 { 0.0 } else { 127.0 / amax };
                for (v, a) in block.iter().zip(out) {
                    *a = nearest(v * inverse).clamp(-127.0, 127.0) as i8;
                }
                scales.push(d);
            }
        }
        let groups = cols / group_size;
        let mut group_sums = Vec::with_capacity(m * groups);
        for (row, d) in values
            .chunks_exact(cols)
            .zip(scales.chunks_exact(cols / BLOCK))
        {
            for g in 0..groups {
                let units = (g * group_size..(g + 1) * group_size).step_by(unit);
                group_sums.push(units.fold(0.0f32, |sum, c| {
                    let s: i32 = row[c..c + unit].iter().map(|&a| i32::from(a)).sum();
                    d[c / BLOCK].mul_add(s as f32, sum)
                }));
            }
        }
        Rows {
            cols,
            groups,
            values,
            scales,
            group_sums,
        }
    }

    /// Row `i`'s `d` for column `col`'s block.
    fn scale(&self, i: usize, col: usize) -> f32 {
        self.scales[i * (self.cols / BLOCK) + col / BLOCK]
    }

    fn group_sum(&self, i: usize, g: usize) -> f32 {
        self.group_sums[i * self.groups + g]
    }
}

impl Kernel {
    /// [`Kernel::run`] for a matrix laid out for int8 activations, over `rows` rounded.
    ///
    /// # Safety
    /// As [`Kernel::run`].
    pub(crate) unsafe fn run_int8(
        self,
        w: &QuantizedMatrix,
        rows: &Rows,
        m: usize,
        panels: Range<usize>,
        out: *mut f32,
    ) {
        debug_assert_eq!(w.activations, Activations::Int8);
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 if x86::has_vnni() => {
                let wide = if m == 1 { 4 } else { 2 };
                super::kernels::x86::tiles(m, panels, x86::VNNI_ROWS, wide, |i0, mr, p0, np| {
                    x86::vnni(w, rows, i0, mr, p0, np, out)
                })
            }
            // An AVX-512 CPU without VNNI has AVX2.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 | Kernel::Avx2 => {
                super::kernels::x86::tiles(m, panels, x86::AVX2_ROWS, 1, |i0, mr, p0, np| {
                    x86::avx2(w, rows, i0, mr, p0, np, out)
                })
            }
            _ => portable(w, rows, m, panels, out),
        }
    }
}

/// The same sums and steps in plain loops.
unsafe fn portable(
    w: &QuantizedMatrix,
    rows: &Rows,
    m: usize,
    panels: Range<usize>,
    out: *mut f32,
) {
    let (cols, group_size) = (w.cols, w.group_size);
    let unit = unit(group_size);
    for n in panels.start * PANEL..(panels.end * PANEL).min(w.rows) {
        let codes: Vec<u8> = (0..cols).map(|k| w.q(n, k)).collect();
        for i in 0..m {
            let a = &rows.values[i * cols..(i + 1) * cols];
            let mut acc = 0.0f32;
            for g in 0..cols / group_size {
                let (scale, bias) = w.affine(n, g);
                for c in (g * group_size..(g + 1) * group_size).step_by(unit) {
                    let s: i32 = codes[c..c + unit]
                        .iter()
                        .zip(&a[c..c + unit])
                        .map(|(&q, &a)| i32::from(q) * i32::from(a))
                        .sum();
                    acc = (s as f32).mul_add(scale * rows.scale(i, c), acc);
                }
                acc = bias.mul_add(rows.group_sum(i, g), acc);
            }
            *out.add(i * w.rows + n) = acc;
        }
    }
}

// Fixed-size register arrays indexed by row and panel, as in the float kernels.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)]
mod x86 {
    use std::arch::x86_64::*;

    use super::{step_columns, unit, Rows, STEP_BYTES};
    use crate::quantized::{
        kernels::x86::{affine16, affine8, lanes},
        Affine, QuantizedMatrix, PANEL,
    };

    /// Input rows per tile: `MR · NR` integer sums and as many float accumulators, with
    /// the panels' codes, scales and biases, in 32 zmm (16 ymm for AVX2, one panel).
    pub const VNNI_ROWS: usize = 4;
    pub const AVX2_ROWS: usize = 2;

    pub fn has_vnni() -> bool {
        is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw")
    }

    /// Where a tile's operands start, and the matrix's geometry.
    struct Operands<const MR: usize, const NR: usize> {
        a: [*const i8; MR],
        panels: [*const u8; NR],
        groups: usize,
        unit: usize,
        step: usize,
    }

    impl<const MR: usize, const NR: usize> Operands<MR, NR> {
        #[inline(always)]
        unsafe fn new(w: &QuantizedMatrix, rows: &Rows, i0: usize, p0: usize) -> Self {
            let mut a = [std::ptr::null(); MR];
            for (i, p) in a.iter_mut().enumerate() {
                *p = rows.values.as_ptr().add((i0 + i) * w.cols);
            }
            let mut panels = [std::ptr::null(); NR];
            for (r, p) in panels.iter_mut().enumerate() {
                *p = w.data.as_ptr().add((p0 + r) * w.panel_bytes());
            }
            Operands {
                a,
                panels,
                groups: w.cols / w.group_size,
                unit: unit(w.group_size),
                step: step_columns(w.bits),
            }
        }

        /// Row `i`'s 4 values from column `c` as one 32-bit lane.
        #[inline(always)]
        unsafe fn quad(&self, i: usize, c: usize) -> i32 {
            self.a[i].add(c).cast::<i32>().read_unaligned()
        }

        /// Panel `r`'s step holding column `c`.
        #[inline(always)]
        unsafe fn step_at(&self, r: usize, c: usize) -> *const u8 {
            self.panels[r].add(c / self.step * STEP_BYTES)
        }
    }

    /// Pick the tile for `(rows, panels, bits)` and the matrix's affine type.
    macro_rules! dispatch {
        ($name:ident, $tile:ident, [$(($mr:literal, $np:literal)),+]) => {
            pub unsafe fn $name(
                w: &QuantizedMatrix,
                rows: &Rows,
                i0: usize,
                mr: usize,
                p0: usize,
                np: usize,
                out: *mut f32,
            ) {
                let half = matches!(w.affine, Affine::Half { .. });
                match (mr, np, w.bits == 4, half) {
                    $(
                        ($mr, $np, true, true) => $tile::<$mr, $np, true, true>(w, rows, i0, p0, out),
                        ($mr, $np, true, false) => $tile::<$mr, $np, true, false>(w, rows, i0, p0, out),
                        ($mr, $np, false, true) => $tile::<$mr, $np, false, true>(w, rows, i0, p0, out),
                        ($mr, $np, false, false) => $tile::<$mr, $np, false, false>(w, rows, i0, p0, out),
                    )+
                    _ => unreachable!("tile {mr}×{np}"),
                }
            }
        };
    }

    dispatch!(
        vnni,
        tile_vnni,
        [
            (1, 1),
            (2, 1),
            (3, 1),
            (4, 1),
            (1, 2),
            (2, 2),
            (3, 2),
            (4, 2),
            (1, 4)
        ]
    );
    dispatch!(avx2, tile_avx2, [(1, 1), (2, 1)]);

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tile_vnni<
        const MR: usize,
        const NR: usize,
        const FOUR_BITS: bool,
        const HALF: bool,
    >(
        w: &QuantizedMatrix,
        rows: &Rows,
        i0: usize,
        p0: usize,
        out: *mut f32,
    ) {
        let o = Operands::<MR, NR>::new(w, rows, i0, p0);
        let nibble = _mm512_set1_epi8(0x0f);
        let mut acc = [[_mm512_setzero_ps(); NR]; MR];
        for g in 0..o.groups {
            let mut scale = [_mm512_setzero_ps(); NR];
            let mut bias = [_mm512_setzero_ps(); NR];
            for r in 0..NR {
                [scale[r], bias[r]] = affine16::<HALF>(w, ((p0 + r) * o.groups + g) * PANEL);
            }
            let start = g * w.group_size;
            for c0 in (start..start + w.group_size).step_by(o.unit) {
                let mut sums = [[_mm512_setzero_si512(); NR]; MR];
                for c in (c0..c0 + o.unit).step_by(o.step) {
                    for r in 0..NR {
                        let v = _mm512_loadu_si512(o.step_at(r, c).cast());
                        if FOUR_BITS {
                            let low = _mm512_and_si512(v, nibble);
                            let high = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble);
                            for i in 0..MR {
                                let x0 = _mm512_set1_epi32(o.quad(i, c));
                                let x1 = _mm512_set1_epi32(o.quad(i, c + 4));
                                sums[i][r] = _mm512_dpbusd_epi32(sums[i][r], low, x0);
                                sums[i][r] = _mm512_dpbusd_epi32(sums[i][r], high, x1);
                            }
                        } else {
                            for i in 0..MR {
                                let x = _mm512_set1_epi32(o.quad(i, c));
                                sums[i][r] = _mm512_dpbusd_epi32(sums[i][r], v, x);
                            }
                        }
                    }
                }
                for i in 0..MR {
                    let d = _mm512_set1_ps(rows.scale(i0 + i, c0));
                    for r in 0..NR {
                        let s = _mm512_cvtepi32_ps(sums[i][r]);
                        acc[i][r] = _mm512_fmadd_ps(s, _mm512_mul_ps(scale[r], d), acc[i][r]);
                    }
                }
            }
            for i in 0..MR {
                let sum = _mm512_set1_ps(rows.group_sum(i0 + i, g));
                for r in 0..NR {
                    acc[i][r] = _mm512_fmadd_ps(bias[r], sum, acc[i][r]);
                }
            }
        }
        for i in 0..MR {
            for r in 0..NR {
                let at = out.add((i0 + i) * w.rows + (p0 + r) * PANEL);
                let mask = (1u32 << lanes(w, p0 + r)) - 1;
                _mm512_mask_storeu_ps(at, mask as u16, acc[i][r]);
            }
        }
    }

    /// `Σ q · a` of 4 columns per 32-bit lane, added to `sums`: `vpmaddubsw` makes pairs
    /// (codes of 4 bits at most, so no pair saturates), `vpmaddwd` adds them.
    #[inline(always)]
    unsafe fn dot4(sums: __m256i, q: __m256i, a: __m256i) -> __m256i {
        let pairs = _mm256_maddubs_epi16(q, a);
        _mm256_add_epi32(sums, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile_avx2<
        const MR: usize,
        const NR: usize,
        const FOUR_BITS: bool,
        const HALF: bool,
    >(
        w: &QuantizedMatrix,
        rows: &Rows,
        i0: usize,
        p0: usize,
        out: *mut f32,
    ) {
        // One panel, as two vectors: lanes 0..8 and 8..16.
        let o = Operands::<MR, 1>::new(w, rows, i0, p0);
        let nibble = _mm256_set1_epi8(0x0f);
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for g in 0..o.groups {
            let at = (p0 * o.groups + g) * PANEL;
            let [s0, b0] = affine8::<HALF>(w, at);
            let [s1, b1] = affine8::<HALF>(w, at + 8);
            let (scale, bias) = ([s0, s1], [b0, b1]);
            let start = g * w.group_size;
            for c0 in (start..start + w.group_size).step_by(o.unit) {
                let mut sums = [[_mm256_setzero_si256(); 2]; MR];
                for c in (c0..c0 + o.unit).step_by(o.step) {
                    for h in 0..2 {
                        let v = _mm256_loadu_si256(o.step_at(0, c).add(32 * h).cast());
                        let low = _mm256_and_si256(v, nibble);
                        let high = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble);
                        for i in 0..MR {
                            let x0 = _mm256_set1_epi32(o.quad(i, c));
                            sums[i][h] = if FOUR_BITS {
                                let x1 = _mm256_set1_epi32(o.quad(i, c + 4));
                                dot4(dot4(sums[i][h], low, x0), high, x1)
                            } else {
                                // q = 16 · high + low, each a 4-bit code.
                                let z = _mm256_setzero_si256();
                                let top = _mm256_slli_epi32::<4>(dot4(z, high, x0));
                                dot4(_mm256_add_epi32(sums[i][h], top), low, x0)
                            };
                        }
                    }
                }
                for i in 0..MR {
                    let d = _mm256_set1_ps(rows.scale(i0 + i, c0));
                    for h in 0..2 {
                        let s = _mm256_cvtepi32_ps(sums[i][h]);
                        acc[i][h] = _mm256_fmadd_ps(s, _mm256_mul_ps(scale[h], d), acc[i][h]);
                    }
                }
            }
            for i in 0..MR {
                let sum = _mm256_set1_ps(rows.group_sum(i0 + i, g));
                for h in 0..2 {
                    acc[i][h] = _mm256_fmadd_ps(bias[h], sum, acc[i][h]);
                }
            }
        }
        for i in 0..MR {
            let mut lanes16 = [0.0f32; PANEL];
            _mm256_storeu_ps(lanes16.as_mut_ptr(), acc[i][0]);
            _mm256_storeu_ps(lanes16.as_mut_ptr().add(8), acc[i][1]);
            let at = out.add((i0 + i) * w.rows + p0 * PANEL);
            std::ptr::copy_nonoverlapping(lanes16.as_ptr(), at, lanes(w, p0));
        }
    }
}
