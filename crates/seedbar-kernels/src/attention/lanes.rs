//! The float lanes the attention panels run on: one trait, [`Lanes`], with a portable
//! implementation (one lane, plain `f32`) and, on x86-64, AVX-512 (16 lanes) and AVX2 (8).
//! Every operation gives each lane the bits the portable one gives: IEEE operations rounded
//! once (`mul_add` is fused in every build), and a maximum and selects defined per lane.

/// `W` float lanes and the per-lane operations the panels use.
pub(super) trait Lanes: Copy {
    const W: usize;
    /// Every lane `x`.
    unsafe fn splat(x: f32) -> Self;
    /// `W` floats from `from` (no alignment needed).
    unsafe fn load(from: *const f32) -> Self;
    /// The lanes to `to` (`W` floats, no alignment needed).
    unsafe fn store(self, to: *mut f32);
    /// `self · b + c`, rounded once.
    unsafe fn mul_add(self, b: Self, c: Self) -> Self;
    unsafe fn mul(self, b: Self) -> Self;
    unsafe fn add(self, b: Self) -> Self;
    unsafe fn sub(self, b: Self) -> Self;
    unsafe fn div(self, b: Self) -> Self;
    /// `self` where `self > b`, else `b` (so `b` where either is NaN, or on a tie).
    unsafe fn max(self, b: Self) -> Self;
    /// The whole number at or below.
    unsafe fn floor(self) -> Self;
    /// `then` where `self < b`, else `otherwise`.
    unsafe fn select_lt(self, b: Self, then: Self, otherwise: Self) -> Self;
    /// `2^n` for a whole number `n`, clamped to `-126..=127` (NaN: `2^-126`).
    unsafe fn pow2(self) -> Self;
}

/// One lane: the portable build, and the reference the SIMD builds equal.
impl Lanes for f32 {
    const W: usize = 1;
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        x
    }
    #[inline(always)]
    unsafe fn load(from: *const f32) -> Self {
        *from
    }
    #[inline(always)]
    unsafe fn store(self, to: *mut f32) {
        *to = self;
    }
    #[inline(always)]
    unsafe fn mul_add(self, b: Self, c: Self) -> Self {
        f32::mul_add(self, b, c)
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        self * b
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        self + b
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        self - b
    }
    #[inline(always)]
    unsafe fn div(self, b: Self) -> Self {
        self / b
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        if self > b {
            self
        } else {
            b
        }
    }
    #[inline(always)]
    unsafe fn floor(self) -> Self {
        f32::floor(self)
    }
    #[inline(always)]
    unsafe fn select_lt(self, b: Self, then: Self, otherwise: Self) -> Self {
        if self < b {
            then
        } else {
            otherwise
        }
    }
    #[inline(always)]
    unsafe fn pow2(self) -> Self {
        let n = Lanes::max(self, -126.0).min(127.0) as i32;
        f32::from_bits(((n + 127) as u32) << 23)
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) use x86::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Lanes;

    /// 16 lanes; only inside a function compiled with AVX-512F.
    #[derive(Clone, Copy)]
    pub struct Avx512(__m512);

    impl Lanes for Avx512 {
        const W: usize = 16;
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            Avx512(_mm512_set1_ps(x))
        }
        #[inline(always)]
        unsafe fn load(from: *const f32) -> Self {
            Avx512(_mm512_loadu_ps(from))
        }
        #[inline(always)]
        unsafe fn store(self, to: *mut f32) {
            _mm512_storeu_ps(to, self.0)
        }
        #[inline(always)]
        unsafe fn mul_add(self, b: Self, c: Self) -> Self {
            Avx512(_mm512_fmadd_ps(self.0, b.0, c.0))
        }
        #[inline(always)]
        unsafe fn mul(self, b: Self) -> Self {
            Avx512(_mm512_mul_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn add(self, b: Self) -> Self {
            Avx512(_mm512_add_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn sub(self, b: Self) -> Self {
            Avx512(_mm512_sub_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn div(self, b: Self) -> Self {
            Avx512(_mm512_div_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn max(self, b: Self) -> Self {
            // MAXPS gives its second operand on a tie or a NaN.
            Avx512(_mm512_max_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn floor(self) -> Self {
            Avx512(_mm512_roundscale_ps::<
                { _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC },
            >(self.0))
        }
        #[inline(always)]
        unsafe fn select_lt(self, b: Self, then: Self, otherwise: Self) -> Self {
            let lt = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(self.0, b.0);
            Avx512(_mm512_mask_blend_ps(lt, otherwise.0, then.0))
        }
        #[inline(always)]
        unsafe fn pow2(self) -> Self {
            let n = _mm512_min_ps(
                _mm512_max_ps(self.0, _mm512_set1_ps(-126.0)),
                _mm512_set1_ps(127.0),
            );
            let n = _mm512_cvttps_epi32(n);
            let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(n, _mm512_set1_epi32(127)));
            Avx512(_mm512_castsi512_ps(bits))
        }
    }

    /// 8 lanes; only inside a function compiled with AVX2 and FMA.
    #[derive(Clone, Copy)]
    pub struct Avx2(__m256);

    impl Lanes for Avx2 {
        const W: usize = 8;
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            Avx2(_mm256_set1_ps(x))
        }
        #[inline(always)]
        unsafe fn load(from: *const f32) -> Self {
            Avx2(_mm256_loadu_ps(from))
        }
        #[inline(always)]
        unsafe fn store(self, to: *mut f32) {
            _mm256_storeu_ps(to, self.0)
        }
        #[inline(always)]
        unsafe fn mul_add(self, b: Self, c: Self) -> Self {
            Avx2(_mm256_fmadd_ps(self.0, b.0, c.0))
        }
        #[inline(always)]
        unsafe fn mul(self, b: Self) -> Self {
            Avx2(_mm256_mul_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn add(self, b: Self) -> Self {
            Avx2(_mm256_add_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn sub(self, b: Self) -> Self {
            Avx2(_mm256_sub_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn div(self, b: Self) -> Self {
            Avx2(_mm256_div_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn max(self, b: Self) -> Self {
            // MAXPS gives its second operand on a tie or a NaN.
            Avx2(_mm256_max_ps(self.0, b.0))
        }
        #[inline(always)]
        unsafe fn floor(self) -> Self {
            Avx2(_mm256_floor_ps(self.0))
        }
        #[inline(always)]
        unsafe fn select_lt(self, b: Self, then: Self, otherwise: Self) -> Self {
            let lt = _mm256_cmp_ps::<_CMP_LT_OQ>(self.0, b.0);
            Avx2(_mm256_blendv_ps(otherwise.0, then.0, lt))
        }
        #[inline(always)]
        unsafe fn pow2(self) -> Self {
            let n = _mm256_min_ps(
                _mm256_max_ps(self.0, _mm256_set1_ps(-126.0)),
                _mm256_set1_ps(127.0),
            );
            let n = _mm256_cvttps_epi32(n);
            let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(n, _mm256_set1_epi32(127)));
            Avx2(_mm256_castsi256_ps(bits))
        }
    }
}
