//! The per-ISA kernels behind [`QuantizedMatrix::matmul_transposed`]: AVX-512 and AVX2 with
//! FMA on x86-64, and a portable loop elsewhere. The SIMD ones compute tiles of `MR` input
//! rows × `NR` panels (16 output columns each): a panel's column pair is widened once per
//! tile, then every input row's two values are broadcast into one fused multiply-add per
//! lane. Each `(row, column)` is one FMA chain over the columns in order in every kernel and
//! tile shape (the crate docs), so all of them agree bit for bit.

use std::ops::Range;

use super::{QuantizedMatrix, PANEL};
use crate::Kernel;

impl Kernel {
    /// Write `out[i · w.rows + n]` for every input row `i < m` and every weight row `n` of
    /// the panels `panels`.
    ///
    /// # Safety
    /// `out` holds `m · w.rows` floats, no other thread writes these panels' columns
    /// meanwhile, and the kernel [is available](Kernel::is_available).
    pub(crate) unsafe fn run(
        self,
        w: &QuantizedMatrix,
        x: &[f32],
        m: usize,
        panels: Range<usize>,
        out: *mut f32,
    ) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => {
                let wide = x86::wide(m, x86::AVX512_ROWS);
                x86::tiles(m, panels, x86::AVX512_ROWS, wide, |i0, mr, p0, np| {
                    x86::avx512(w, x, i0, mr, p0, np, out)
                })
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                let wide = x86::wide(m, x86::AVX2_ROWS);
                x86::tiles(m, panels, x86::AVX2_ROWS, wide, |i0, mr, p0, np| {
                    x86::avx2(w, x, i0, mr, p0, np, out)
                })
            }
            _ => portable(w, x, m, panels, out),
        }
    }
}

/// The same chains in plain loops (`mul_add` is the fused, singly rounded operation).
unsafe fn portable(w: &QuantizedMatrix, x: &[f32], m: usize, panels: Range<usize>, out: *mut f32) {
    for n in panels.start * PANEL..(panels.end * PANEL).min(w.rows) {
        let weights = w.dequantize_row(n);
        for i in 0..m {
            let row = &x[i * w.cols..(i + 1) * w.cols];
            let sum = weights
                .iter()
                .zip(row)
                .fold(0.0f32, |acc, (a, b)| a.mul_add(*b, acc));
            *out.add(i * w.rows + n) = sum;
        }
    }
}

// The tiles index their register arrays by row and panel on purpose: fixed-size loops that
// the compiler unrolls into registers.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)]
pub(super) mod x86 {
    use std::{arch::x86_64::*, ops::Range};

    use crate::quantized::{pair_bytes, Affine, QuantizedMatrix, PANEL};

    /// Input rows per tile: `MR · NR` accumulators stay in registers (32 zmm, 16 ymm).
    pub const AVX512_ROWS: usize = 8;
    pub const AVX2_ROWS: usize = 4;

    /// Panels a tile takes for `m` rows: few rows take four (independent chains to hide the
    /// FMA latency), more take two.
    pub fn wide(m: usize, max_rows: usize) -> usize {
        if m.min(max_rows) <= 2 {
            4
        } else {
            2
        }
    }

    /// Cover `[0, m) × panels` with tiles `tile(first row, rows, first panel, panels)` of at
    /// most `max_rows` rows and `wide` panels (one at the end where fewer are left).
    pub unsafe fn tiles(
        m: usize,
        panels: Range<usize>,
        max_rows: usize,
        wide: usize,
        mut tile: impl FnMut(usize, usize, usize, usize),
    ) {
        let mut p = panels.start;
        while p < panels.end {
            let np = if panels.end - p >= wide { wide } else { 1 };
            let mut i = 0;
            while i < m {
                let mr = (m - i).min(max_rows);
                tile(i, mr, p, np);
                i += mr;
            }
            p += np;
        }
    }

    /// Pick the tiles for the matrix's affine type.
    macro_rules! dispatch {
        ($name:ident, $affine:ident) => {
            pub unsafe fn $name(
                w: &QuantizedMatrix,
                x: &[f32],
                i0: usize,
                mr: usize,
                p0: usize,
                np: usize,
                out: *mut f32,
            ) {
                if matches!(w.affine, Affine::Half { .. }) {
                    $affine::<true>(w, x, i0, mr, p0, np, out)
                } else {
                    $affine::<false>(w, x, i0, mr, p0, np, out)
                }
            }
        };
    }

    /// The monomorphized tile for `(rows, panels, bits)` with float16 affines or not.
    macro_rules! dispatch_affine {
        ($name:ident, $tile:ident, [$($mr:literal),+], [$($narrow:literal),+]) => {
            unsafe fn $name<const HALF: bool>(
                w: &QuantizedMatrix,
                x: &[f32],
                i0: usize,
                mr: usize,
                p0: usize,
                np: usize,
                out: *mut f32,
            ) {
                match (mr, np, w.bits == 4) {
                    $(
                        ($mr, 1, true) => $tile::<$mr, 1, true, HALF>(w, x, i0, p0, out),
                        ($mr, 1, false) => $tile::<$mr, 1, false, HALF>(w, x, i0, p0, out),
                        ($mr, 2, true) => $tile::<$mr, 2, true, HALF>(w, x, i0, p0, out),
                        ($mr, 2, false) => $tile::<$mr, 2, false, HALF>(w, x, i0, p0, out),
                    )+
                    $(
                        ($narrow, 4, true) => $tile::<$narrow, 4, true, HALF>(w, x, i0, p0, out),
                        ($narrow, 4, false) => $tile::<$narrow, 4, false, HALF>(w, x, i0, p0, out),
                    )+
                    _ => unreachable!("tile {mr}×{np}"),
                }
            }
        };
    }

    dispatch!(avx512, avx512_affine);
    dispatch!(avx2, avx2_affine);
    dispatch_affine!(avx512_affine, tile512, [1, 2, 3, 4, 5, 6, 7, 8], [1, 2]);
    dispatch_affine!(avx2_affine, tile256, [1, 2, 3, 4], [1, 2]);

    /// 16 scales or biases from `at` as f32: float16 widened (exact) where `HALF`.
    #[inline(always)]
    pub(crate) unsafe fn affine16<const HALF: bool>(w: &QuantizedMatrix, at: usize) -> [__m512; 2] {
        match &w.affine {
            // (No closures: they would not be compiled with the tile's target features.)
            Affine::Half { scales, biases } if HALF => [
                _mm512_cvtph_ps(_mm256_loadu_si256(scales.as_ptr().add(at).cast())),
                _mm512_cvtph_ps(_mm256_loadu_si256(biases.as_ptr().add(at).cast())),
            ],
            Affine::Single { scales, biases } if !HALF => [
                _mm512_loadu_ps(scales.as_ptr().add(at)),
                _mm512_loadu_ps(biases.as_ptr().add(at)),
            ],
            _ => unreachable!("the tile was picked for the matrix's affine type"),
        }
    }

    /// 8 scales or biases from `at` as f32 (AVX2 with F16C).
    #[inline(always)]
    pub(crate) unsafe fn affine8<const HALF: bool>(w: &QuantizedMatrix, at: usize) -> [__m256; 2] {
        match &w.affine {
            Affine::Half { scales, biases } if HALF => [
                _mm256_cvtph_ps(_mm_loadu_si128(scales.as_ptr().add(at).cast())),
                _mm256_cvtph_ps(_mm_loadu_si128(biases.as_ptr().add(at).cast())),
            ],
            Affine::Single { scales, biases } if !HALF => [
                _mm256_loadu_ps(scales.as_ptr().add(at)),
                _mm256_loadu_ps(biases.as_ptr().add(at)),
            ],
            _ => unreachable!("the tile was picked for the matrix's affine type"),
        }
    }

    /// Where a tile's operands start, and the matrix's group geometry.
    struct Operands<const MR: usize, const NR: usize> {
        xs: [*const f32; MR],
        panels: [*const u8; NR],
        groups: usize,
        pairs_per_group: usize,
        pair_bytes: usize,
    }

    impl<const MR: usize, const NR: usize> Operands<MR, NR> {
        #[inline(always)]
        unsafe fn new(w: &QuantizedMatrix, x: &[f32], i0: usize, p0: usize) -> Self {
            let mut xs = [std::ptr::null(); MR];
            for (i, p) in xs.iter_mut().enumerate() {
                *p = x.as_ptr().add((i0 + i) * w.cols);
            }
            let mut panels = [std::ptr::null(); NR];
            for (r, p) in panels.iter_mut().enumerate() {
                *p = w.data.as_ptr().add((p0 + r) * w.panel_bytes());
            }
            Operands {
                xs,
                panels,
                groups: w.cols / w.group_size,
                pairs_per_group: w.group_size / 2,
                pair_bytes: pair_bytes(w.bits),
            }
        }

        /// Offset of panel `p`'s lanes for group `g` in the scales and biases.
        #[inline(always)]
        fn affine_at(&self, p: usize, g: usize) -> usize {
            (p * self.groups + g) * PANEL
        }
    }

    /// The output columns panel `p` covers (fewer than 16 in a short last panel).
    #[inline(always)]
    pub(crate) fn lanes(w: &QuantizedMatrix, p: usize) -> usize {
        (w.rows - p * PANEL).min(PANEL)
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn tile512<const MR: usize, const NR: usize, const FOUR_BITS: bool, const HALF: bool>(
        w: &QuantizedMatrix,
        x: &[f32],
        i0: usize,
        p0: usize,
        out: *mut f32,
    ) {
        let o = Operands::<MR, NR>::new(w, x, i0, p0);
        let mut acc = [[_mm512_setzero_ps(); NR]; MR];
        let fifteen = _mm512_set1_epi32(15);
        for g in 0..o.groups {
            let mut scale = [_mm512_setzero_ps(); NR];
            let mut bias = [_mm512_setzero_ps(); NR];
            for r in 0..NR {
                let at = o.affine_at(p0 + r, g);
                [scale[r], bias[r]] = affine16::<HALF>(w, at);
            }
            for pair in g * o.pairs_per_group..(g + 1) * o.pairs_per_group {
                let mut w0 = [_mm512_setzero_ps(); NR];
                let mut w1 = [_mm512_setzero_ps(); NR];
                for r in 0..NR {
                    let p = o.panels[r].add(pair * o.pair_bytes);
                    let (q0, q1) = if FOUR_BITS {
                        let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast()));
                        (_mm512_and_si512(v, fifteen), _mm512_srli_epi32::<4>(v))
                    } else {
                        (
                            _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast())),
                            _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(PANEL).cast())),
                        )
                    };
                    w0[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q0), scale[r], bias[r]);
                    w1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q1), scale[r], bias[r]);
                }
                for i in 0..MR {
                    let x0 = _mm512_set1_ps(*o.xs[i].add(2 * pair));
                    let x1 = _mm512_set1_ps(*o.xs[i].add(2 * pair + 1));
                    for r in 0..NR {
                        acc[i][r] = _mm512_fmadd_ps(w0[r], x0, acc[i][r]);
                        acc[i][r] = _mm512_fmadd_ps(w1[r], x1, acc[i][r]);
                    }
                }
            }
        }
        for i in 0..MR {
            for r in 0..NR {
                let n = (p0 + r) * PANEL;
                let at = out.add((i0 + i) * w.rows + n);
                let mask = (1u32 << lanes(w, p0 + r)) - 1;
                _mm512_mask_storeu_ps(at, mask as u16, acc[i][r]);
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile256<const MR: usize, const NR: usize, const FOUR_BITS: bool, const HALF: bool>(
        w: &QuantizedMatrix,
        x: &[f32],
        i0: usize,
        p0: usize,
        out: *mut f32,
    ) {
        // Each panel is two vectors: rows 0..8 and 8..16.
        let o = Operands::<MR, NR>::new(w, x, i0, p0);
        let mut acc = [[[_mm256_setzero_ps(); 2]; NR]; MR];
        let fifteen = _mm256_set1_epi32(15);
        for g in 0..o.groups {
            for pair in g * o.pairs_per_group..(g + 1) * o.pairs_per_group {
                let mut w0 = [[_mm256_setzero_ps(); 2]; NR];
                let mut w1 = [[_mm256_setzero_ps(); 2]; NR];
                for r in 0..NR {
                    let at = o.affine_at(p0 + r, g);
                    let p = o.panels[r].add(pair * o.pair_bytes);
                    for h in 0..2 {
                        let widen =
                            |at: usize| _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(at).cast()));
                        let (q0, q1) = if FOUR_BITS {
                            let v = widen(8 * h);
                            (_mm256_and_si256(v, fifteen), _mm256_srli_epi32::<4>(v))
                        } else {
                            (widen(8 * h), widen(PANEL + 8 * h))
                        };
                        let [scale, bias] = affine8::<HALF>(w, at + 8 * h);
                        w0[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q0), scale, bias);
                        w1[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q1), scale, bias);
                    }
                }
                for i in 0..MR {
                    let x0 = _mm256_set1_ps(*o.xs[i].add(2 * pair));
                    let x1 = _mm256_set1_ps(*o.xs[i].add(2 * pair + 1));
                    for r in 0..NR {
                        for h in 0..2 {
                            acc[i][r][h] = _mm256_fmadd_ps(w0[r][h], x0, acc[i][r][h]);
                            acc[i][r][h] = _mm256_fmadd_ps(w1[r][h], x1, acc[i][r][h]);
                        }
                    }
                }
            }
        }
        for i in 0..MR {
            for r in 0..NR {
                let mut lanes16 = [0.0f32; PANEL];
                _mm256_storeu_ps(lanes16.as_mut_ptr(), acc[i][r][0]);
                _mm256_storeu_ps(lanes16.as_mut_ptr().add(8), acc[i][r][1]);
                let n = (p0 + r) * PANEL;
                let at = out.add((i0 + i) * w.rows + n);
                std::ptr::copy_nonoverlapping(lanes16.as_ptr(), at, lanes(w, p0 + r));
            }
        }
    }
}
