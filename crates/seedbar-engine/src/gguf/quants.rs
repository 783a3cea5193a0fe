//! ggml's tensor types as a GGUF file stores them, decoded from the file's bytes: float
//! tensors as they are; the block-quantized types either re-packed as MLX affine
//! quantization (`w = scale * q + bias` over groups of 32, which the GPU's quantized matmul
//! and the CPU's packed kernels run) or dequantized to dense values.
//!
//! Which types stay quantized: every type whose blocks hold 32-value groups of unsigned codes
//! with one scale and one offset per group. Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 are such groups
//! outright (a signed code `q - 8` becomes offset `-8 d`); Q4_K and Q5_K are eight of them per
//! 256-value super-block, the group's scale `d * sc` and offset `-dmin * m` being the
//! products of the super-block's float16 `d`/`dmin` and the group's 6-bit `sc`/`m`. Q6_K
//! scales groups of 16, a size MLX's quantized ops do not take: it is dequantized, or kept
//! in groups of 16 for the CPU kernels where the caller asks (`small_groups`). Q2_K and Q3_K
//! (groups of 16 too) are dequantized.
//!
//! Exactness: every scale and offset is a product of a float16 and an integer of at most 8
//! bits, exact in f32, so a group's `scale * q + bias` (one rounding, as MLX computes it)
//! equals the reference dequantizer's `d * sc * q - dmin * m` computed in f32; the dense
//! types are computed in the reference's order (`(d * sc) * q`). Q6_K's `fma(q, d sc, -32 d sc)`
//! rounds the exact `d sc (q - 32)` once, as the reference's product does (its zeros are all
//! +0). Values only round when the
//! caller asks for a narrower dtype (float16 scales on the GPU).
//!
//! The block layouts follow the GGUF specification and ggml's block structs: all fields
//! little-endian, the float16 super-block scales of the K-quants at the block's end (Q2_K,
//! Q3_K, Q6_K) or start (Q4_K, Q5_K).

use half::{bf16, f16};

/// Values per MLX affine group built from ggml blocks.
pub const GROUP: usize = 32;

/// The ggml tensor types Seedbar reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
}

/// Each type with its ggml type id and name.
const TYPES: [(GgmlType, u32, &str); 13] = [
    (GgmlType::F32, 0, "F32"),
    (GgmlType::F16, 1, "F16"),
    (GgmlType::Q4_0, 2, "Q4_0"),
    (GgmlType::Q4_1, 3, "Q4_1"),
    (GgmlType::Q5_0, 6, "Q5_0"),
    (GgmlType::Q5_1, 7, "Q5_1"),
    (GgmlType::Q8_0, 8, "Q8_0"),
    (GgmlType::Q2K, 10, "Q2_K"),
    (GgmlType::Q3K, 11, "Q3_K"),
    (GgmlType::Q4K, 12, "Q4_K"),
    (GgmlType::Q5K, 13, "Q5_K"),
    (GgmlType::Q6K, 14, "Q6_K"),
    (GgmlType::Bf16, 30, "BF16"),
];

/// ggml's name of the type `id` (`Q4_K`, `IQ4_NL`...), including types Seedbar does not read.
pub fn type_name(id: u32) -> String {
    const NAMES: [&str; 31] = [
        "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K",
        "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL",
        "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16",
    ];
    NAMES
        .get(id as usize)
        .map_or_else(|| format!("type {id}"), |name| name.to_string())
}

/// A tensor's values once decoded, row-major.
pub enum Decoded {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    /// MLX affine quantization: codes of `bits` bits packed little-endian into 32-bit words
    /// (a row's codes as one bit stream), a scale and a bias per group of `group` values
    /// ([`GROUP`], or Q6_K's 16 where asked for).
    Affine {
        words: Vec<u32>,
        scales: Vec<f32>,
        biases: Vec<f32>,
        bits: u32,
        group: usize,
    },
}

impl GgmlType {
    pub fn from_id(id: u32) -> Option<Self> {
        TYPES.iter().find(|t| t.1 == id).map(|t| t.0)
    }

    pub fn name(self) -> &'static str {
        TYPES.iter().find(|t| t.0 == self).map_or("", |t| t.2)
    }

    /// The names of every type Seedbar reads, comma-separated (for error messages).
    pub fn supported() -> String {
        TYPES.map(|t| t.2).join(", ")
    }

    /// Values per block and bytes per block.
    pub fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::Bf16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q2K => (256, 84),
            GgmlType::Q3K => (256, 110),
            GgmlType::Q4K => (256, 144),
            GgmlType::Q5K => (256, 176),
            GgmlType::Q6K => (256, 210),
        }
    }

    /// Decode `bytes`, whole blocks of this type. `small_groups`: Q6_K stays quantized in
    /// groups of 16 (which the CPU kernels take and MLX's quantized ops do not) instead of
    /// being dequantized.
    pub fn decode(self, bytes: &[u8], small_groups: bool) -> Decoded {
        let (per_block, size) = self.block();
        let blocks = bytes.chunks_exact(size);
        let quantized = |bits: u32, group: usize, f: AffineBlock| {
            affine(bytes.chunks_exact(size), per_block, bits, group, f)
        };
        match self {
            GgmlType::F32 => Decoded::F32(
                blocks
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            ),
            GgmlType::F16 => Decoded::F16(blocks.map(|b| half_at(b, 0)).collect()),
            GgmlType::Bf16 => Decoded::Bf16(
                blocks
                    .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])))
                    .collect(),
            ),
            GgmlType::Q4_0 => quantized(4, GROUP, q4_0),
            GgmlType::Q4_1 => quantized(4, GROUP, q4_1),
            GgmlType::Q5_0 => quantized(5, GROUP, q5_0),
            GgmlType::Q5_1 => quantized(5, GROUP, q5_1),
            GgmlType::Q8_0 => quantized(8, GROUP, q8_0),
            GgmlType::Q4K => quantized(4, GROUP, q4_k),
            GgmlType::Q5K => quantized(5, GROUP, q5_k),
            GgmlType::Q6K if small_groups => quantized(6, 16, q6_k),
            GgmlType::Q6K => affine_values(blocks, per_block, 16, q6_k),
            GgmlType::Q2K => dense(blocks, q2_k),
            GgmlType::Q3K => dense(blocks, q3_k),
        }
    }
}

/// The float16 at `bytes[at..at + 2]`.
fn half_at(bytes: &[u8], at: usize) -> f16 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
}

fn f32_at(bytes: &[u8], at: usize) -> f32 {
    half_at(bytes, at).to_f32()
}

/// One block as affine groups: `codes` gets each value's unsigned code, `groups` each
/// group's (scale, bias).
type AffineBlock = fn(block: &[u8], codes: &mut [u8], groups: &mut [(f32, f32)]);

/// Each block decoded by `f` into its codes and groups, handed to `take` in order.
fn each_affine_block<'a>(
    blocks: impl Iterator<Item = &'a [u8]>,
    per_block: usize,
    group: usize,
    f: AffineBlock,
    mut take: impl FnMut(&[u8], &[(f32, f32)]),
) {
    let mut codes = vec![0u8; per_block];
    let mut groups = vec![(0.0, 0.0); per_block / group];
    for block in blocks {
        f(block, &mut codes, &mut groups);
        take(&codes, &groups);
    }
}

fn affine<'a>(
    blocks: impl ExactSizeIterator<Item = &'a [u8]>,
    per_block: usize,
    bits: u32,
    group: usize,
    f: AffineBlock,
) -> Decoded {
    let values = blocks.len() * per_block;
    let mut words = Vec::with_capacity(values * bits as usize / 32);
    let mut scales = Vec::with_capacity(values / group);
    let mut biases = Vec::with_capacity(values / group);
    each_affine_block(blocks, per_block, group, f, |codes, groups| {
        for group in codes.chunks_exact(group) {
            pack(group, bits, &mut words);
        }
        scales.extend(groups.iter().map(|g| g.0));
        biases.extend(groups.iter().map(|g| g.1));
    });
    Decoded::Affine {
        words,
        scales,
        biases,
        bits,
        group,
    }
}

/// An affine type's values, `fma(q, scale, bias)` each (Q6_K where its groups of 16 are not
/// kept).
fn affine_values<'a>(
    blocks: impl ExactSizeIterator<Item = &'a [u8]>,
    per_block: usize,
    group: usize,
    f: AffineBlock,
) -> Decoded {
    let mut values = Vec::with_capacity(blocks.len() * per_block);
    each_affine_block(blocks, per_block, group, f, |codes, groups| {
        values.extend(codes.iter().enumerate().map(|(i, &q)| {
            let (scale, bias) = groups[i / group];
            f32::from(q).mul_add(scale, bias)
        }));
    });
    Decoded::F32(values)
}

/// A group's codes appended to `words` as a little-endian bit stream (a group of 32 fills
/// `bits` words exactly, a group of 16 at 6 bits three, so groups and rows start on word
/// boundaries).
fn pack(codes: &[u8], bits: u32, words: &mut Vec<u32>) {
    let mut acc = 0u64;
    let mut filled = 0;
    for &code in codes {
        acc |= u64::from(code) << filled;
        filled += bits;
        if filled >= 32 {
            words.push(acc as u32);
            acc >>= 32;
            filled -= 32;
        }
    }
}

/// Q4_0: float16 `d`, 16 bytes of 4-bit codes (value `i` in byte `i`'s low nibble, value
/// `i + 16` in its high one); `x = d * (q - 8)`.
fn q4_0(b: &[u8], codes: &mut [u8], groups: &mut [(f32, f32)]) {
    let d = f32_at(b, 0);
    nibbles(&b[2..18], codes);
    groups[0] = (d, -8.0 * d);
}

/// Q4_1: float16 `d` and `m`, then Q4_0's codes; `x = d * q + m`.
fn q4_1(b: &[u8], codes: &mut [u8], groups: &mut [(f32, f32)]) {
    nibbles(&b[4..20], codes);
    groups[0] = (f32_at(b, 0), f32_at(b, 2));
}

/// Q5_0: float16 `d`, a 32-bit word of fifth bits (bit `i` for value `i`), Q4_0's low
/// nibbles; `x = d * (q - 16)`.
fn q5_0(b: &[u8], codes: &mut [u8], groups: &mut [(f32, f32)]) {
    let d = f32_at(b, 0);
    five_bits(&b[2..6], &b[6..22], codes);
    groups[0] = (d, -16.0 * d);
}

/// Q5_1: float16 `d` and `m`, then Q5_0's high bits and nibbles; `x = d * q + m`.
fn q5_1(b: &[u8], codes: &mut [u8], groups: &mut [(f32, f32)]) {
    five_bits(&b[4..8], &b[8..24], codes);
    groups[0] = (f32_at(b, 0), f32_at(b, 2));
}

/// Q8_0: float16 `d`, 32 signed bytes; `x = d * q`, as codes `q + 128` with offset `-128 d`.
fn q8_0(b: &[u8], codes: &mut [u8], groups: &mut [(f32, f32)]) {
    let d = f32_at(b, 0);
    for (code, &q) in codes.iter_mut().zip(&b[2..34]) {
        *code = q ^ 0x80;
    }
    groups[0] = (d, -128.0 * d);
}

/// Q4_K: float16 `d` and `dmin`, 12 bytes of 6-bit scales and mins for the eight groups of
/// 32, 128 bytes of codes (64 values per 32 bytes: low nibbles first, then high);
/// `x = (d * sc) * q - dmin * m`.
fn q4_k(b: &[u8], codes: &mut [u8], groups: &mut [(f32, f32)]) {
    k_groups(b, groups);
    q4_k_codes_at(b, 16, codes);
}

/// Q5_K: Q4_K's header, 32 bytes of fifth bits (bit `g` of byte `i` for value `32 g + i`),
/// then Q4_K's nibbles.
fn q5_k(b: &[u8], codes: &mut [u8], groups: &mut [(f32, f32)]) {
    q4_k_codes_at(b, 48, codes);
    k_groups(b, groups);
    let high = &b[16..48];
    for (i, code) in codes.iter_mut().enumerate() {
        *code |= ((high[i % 32] >> (i / 32)) & 1) << 4;
    }
}

/// Q4_K's nibble layout read from `b[at..at + 128]`.
fn q4_k_codes_at(b: &[u8], at: usize, codes: &mut [u8]) {
    for (i, code) in codes.iter_mut().enumerate() {
        let byte = b[at + (i / 64) * 32 + i % 32];
        *code = if (i / 32) % 2 == 0 {
            byte & 0x0F
        } else {
            byte >> 4
        };
    }
}

/// The eight (scale, bias) pairs of a Q4_K/Q5_K super-block: its 6-bit scales and mins are
/// packed as (for group `j < 4`) the low 6 bits of bytes `j` and `j + 4`, and (for `j >= 4`)
/// byte `j + 4`'s nibbles below the top 2 bits of bytes `j - 4` and `j`.
fn k_groups(b: &[u8], groups: &mut [(f32, f32)]) {
    let (d, dmin) = (f32_at(b, 0), f32_at(b, 2));
    let s = &b[4..16];
    for (j, group) in groups.iter_mut().enumerate() {
        let (sc, m) = if j < 4 {
            (s[j] & 0x3F, s[j + 4] & 0x3F)
        } else {
            (
                (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
                (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
            )
        };
        *group = (d * f32::from(sc), -(dmin * f32::from(m)));
    }
}

/// Value `i` in the low nibble of byte `i`, value `i + 16` in its high nibble.
fn nibbles(bytes: &[u8], codes: &mut [u8]) {
    let (low, high) = codes.split_at_mut(16);
    for ((l, h), &byte) in low.iter_mut().zip(high).zip(bytes) {
        *l = byte & 0x0F;
        *h = byte >> 4;
    }
}

/// Q5_0/Q5_1's codes: [`nibbles`] plus bit `i` of the little-endian word `high` as bit 4.
fn five_bits(high: &[u8], low: &[u8], codes: &mut [u8]) {
    nibbles(low, codes);
    let high = u32::from_le_bytes([high[0], high[1], high[2], high[3]]);
    for (i, code) in codes.iter_mut().enumerate() {
        *code |= (((high >> i) & 1) as u8) << 4;
    }
}

/// A dense decoder: one block's 256 values into `out`.
type DenseBlock = fn(block: &[u8], out: &mut [f32]);

fn dense<'a>(blocks: impl ExactSizeIterator<Item = &'a [u8]>, f: DenseBlock) -> Decoded {
    let mut values = vec![0.0; blocks.len() * 256];
    for (block, out) in blocks.zip(values.chunks_exact_mut(256)) {
        f(block, out);
    }
    Decoded::F32(values)
}

/// The 2-bit codes of Q2_K and Q3_K: value `128 h + 32 s + i` in bits `2 s` of byte
/// `32 h + i` of `bytes` (64 bytes).
fn two_bits(bytes: &[u8], i: usize) -> u8 {
    (bytes[(i / 128) * 32 + i % 32] >> (2 * ((i / 32) % 4))) & 3
}

/// Q2_K: 16 bytes of 4-bit scale (low) and min (high) for each group of 16, 64 bytes of
/// 2-bit codes, float16 `d` and `dmin`; `x = (d * sc) * q - dmin * m`.
fn q2_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f32_at(b, 80), f32_at(b, 82));
    for (i, x) in out.iter_mut().enumerate() {
        let s = b[i / 16];
        let scale = d * f32::from(s & 0x0F);
        let min = dmin * f32::from(s >> 4);
        *x = scale * f32::from(two_bits(&b[16..80], i)) - min;
    }
}

/// Q3_K: 32 bytes of high-bit masks (bit `g` of byte `i` for value `32 g + i`; a clear bit
/// subtracts 4), 64 bytes of Q2_K's 2-bit codes, 12 bytes of 6-bit signed scales (offset
/// 32) for the groups of 16, float16 `d`; `x = (d * sc) * q`.
fn q3_k(b: &[u8], out: &mut [f32]) {
    let d = f32_at(b, 108);
    let s = &b[96..108];
    for (i, x) in out.iter_mut().enumerate() {
        let g = i / 16;
        let low = if g < 8 { s[g] & 0x0F } else { s[g - 8] >> 4 };
        let high = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
        let sc = i32::from(low | (high << 4)) - 32;
        let hbit = (b[i % 32] >> (i / 32)) & 1;
        let q = i32::from(two_bits(&b[32..96], i)) - if hbit == 0 { 4 } else { 0 };
        *x = (d * sc as f32) * q as f32;
    }
}

/// Q6_K: 128 bytes of low nibbles (value `128 h + 64 n + i` in nibble `n` of byte
/// `64 h + i`), 64 bytes of 2-bit high parts (value `128 h + 32 s + i` in bits `2 s` of byte
/// `32 h + i`), 16 signed 8-bit scales for the groups of 16, float16 `d`;
/// `x = (d * sc) * (q - 32)`, as codes `q` with offset `-32 d sc`.
fn q6_k(b: &[u8], codes: &mut [u8], groups: &mut [(f32, f32)]) {
    let d = f32_at(b, 208);
    for (i, code) in codes.iter_mut().enumerate() {
        let (h, r) = (i / 128, i % 128);
        let low = (b[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
        *code = low | (two_bits(&b[128..192], i) << 4);
    }
    for (g, group) in groups.iter_mut().enumerate() {
        let scale = d * f32::from(b[192 + g] as i8);
        *group = (scale, -32.0 * scale);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use seedbar_kernels::Activations;

    /// Two Q6_K blocks of pseudo-random bytes with a float16 `d` of either sign.
    fn q6_k_blocks() -> Vec<u8> {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut bytes: Vec<u8> = (0..2 * 210)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        for (block, d) in bytes.chunks_exact_mut(210).zip([3.1e-5f32, -1.7e-4]) {
            block[208..].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        }
        bytes
    }

    #[test]
    fn q6_k_in_groups_of_16_holds_the_reference_values() {
        let bytes = q6_k_blocks();
        let Decoded::Affine {
            words,
            scales,
            biases,
            bits,
            group,
        } = GgmlType::Q6K.decode(&bytes, true)
        else {
            panic!("Q6_K with small groups stays quantized");
        };
        assert_eq!((bits, group), (6, 16));
        let Decoded::F32(dense) = GgmlType::Q6K.decode(&bytes, false) else {
            panic!("Q6_K without small groups is dequantized");
        };
        // The held values as the CPU kernels read them (a block as a row of 256).
        let mlx = seedbar_kernels::MlxAffine {
            words: &words,
            scales: &scales,
            biases: &biases,
            rows: 2,
            cols: 256,
            group_size: group,
            bits,
        };
        let held = seedbar_kernels::QuantizedMatrix::from_mlx_affine(mlx, Activations::Float)
            .expect("the kernels hold 6-bit groups of 16");
        let held: Vec<f32> = (0..2).flat_map(|r| held.dequantize_row(r)).collect();
        // ggml's reference: x = (d * sc) * (q - 32), one product in f32.
        for (i, (&a, &b)) in dense.iter().zip(&held).enumerate() {
            let block = &bytes[i / 256 * 210..][..210];
            let (h, r) = (i % 256 / 128, i % 128);
            let low = (block[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
            let q = i32::from(low | (two_bits(&block[128..192], i % 256) << 4)) - 32;
            let sc = f32::from(block[192 + i % 256 / 16] as i8);
            let reference = (f32_at(block, 208) * sc) * q as f32;
            // Equal values (a zero is +0 here where the product's may be -0).
            assert_eq!(a, reference, "value {i}");
            assert_eq!(b, reference, "value {i}");
        }
    }
}
