//! The GGUF block formats Q8_0 and Q4_0: 32 values share one f16 scale `d`.
//!
//! - Q8_0, 34 bytes: `d` (f16, little-endian), then 32 i8 `q`; value `q·d`, with
//!   `d = max|x| / 127` and `q = round(x / d)` (half away from zero).
//! - Q4_0, 18 bytes: `d`, then 16 bytes; element j sits in the low nibble of byte j and element
//!   j + 16 in its high nibble; value `(q − 8)·d`, with `d = m / −8` for the element m of largest
//!   magnitude (the first such) and `q = min(15, trunc(x / d + 8.5))`.
//!
//! Rounding follows ggml's reference quantiser as gguf-py's `gguf.quants.quantize` writes it
//! (f32 arithmetic, the reciprocal of the unrounded scale), so the bytes match bit for bit
//! (tests/fixtures/quant_blocks.json, from scripts/gguf_fixtures.py).

use half::f16;

/// Values per block in both formats.
pub const BLOCK: usize = 32;

/// A block format of quantised weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantKind {
    Q8_0,
    Q4_0,
}

impl QuantKind {
    pub const ALL: [QuantKind; 2] = [QuantKind::Q8_0, QuantKind::Q4_0];

    pub fn as_str(self) -> &'static str {
        match self {
            QuantKind::Q8_0 => "q8_0",
            QuantKind::Q4_0 => "q4_0",
        }
    }

    /// Bytes of one block: the f16 scale and the quants.
    pub fn block_bytes(self) -> usize {
        2 + self.quant_bytes()
    }

    /// Bytes of one block's quants.
    pub fn quant_bytes(self) -> usize {
        match self {
            QuantKind::Q8_0 => BLOCK,
            QuantKind::Q4_0 => BLOCK / 2,
        }
    }

    /// ggml's type number (`GGMLQuantizationType`), which a GGUF tensor header records.
    pub fn ggml_type(self) -> u32 {
        match self {
            QuantKind::Q8_0 => 8,
            QuantKind::Q4_0 => 2,
        }
    }
}

impl std::fmt::Display for QuantKind {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for QuantKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown quantisation `{s}` (expected q8_0 or q4_0)"))
    }
}

/// Q8_0's scale for a block whose largest magnitude is `amax`, and the factor its values are
/// multiplied by before rounding: the weights' blocks here and the inputs' (every quantiser,
/// scalar or vector, `super::quantize_row`) take both from this one rule.
#[inline(always)]
pub(crate) fn q8_scale(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    (d, inverse(d))
}

/// Up to 32 values (zeros past them) by Q8_0's rule, one element at a time: the scale and
/// the quants. The weights' blocks (`quantize_block`), the inputs' scalar quantiser and the
/// q8_0 KV cache's (`kernels::Q8Block`) all take it.
pub(crate) fn q8_quants(x: &[f32]) -> (f32, [i8; BLOCK]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (d, id) = q8_scale(amax);
    let mut qs = [0i8; BLOCK];
    qs.iter_mut()
        .zip(x)
        .for_each(|(q, &v)| *q = (v * id).round() as i8);
    (d, qs)
}

/// 1 / d, or 0 where d is 0 (a block of zeros, whose quants are then all 0).
#[inline(always)]
fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// One block's scale (as f16 bits) and quants, written into `qs` (`kind.quant_bytes()` bytes,
/// in the GGUF layout).
pub fn quantize_block(kind: QuantKind, x: &[f32; BLOCK], qs: &mut [u8]) -> u16 {
    match kind {
        QuantKind::Q8_0 => {
            let (d, q) = q8_quants(x);
            for (qs, q) in qs[..BLOCK].iter_mut().zip(q) {
                *qs = q as u8;
            }
            f16::from_f32(d).to_bits()
        }
        QuantKind::Q4_0 => {
            // the first element of largest magnitude, with its sign
            let m = x
                .iter()
                .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
            let d = m / -8.0;
            let id = inverse(d);
            let q = |v: f32| ((v * id + 8.5).trunc() as u8).min(15);
            for j in 0..BLOCK / 2 {
                qs[j] = q(x[j]) | (q(x[j + BLOCK / 2]) << 4);
            }
            f16::from_f32(d).to_bits()
        }
    }
}

/// One block's 32 values from its scale (f16 bits) and quants.
pub fn dequantize_block(kind: QuantKind, d: u16, qs: &[u8], out: &mut [f32]) {
    let d = f16::from_bits(d).to_f32();
    match kind {
        QuantKind::Q8_0 => {
            for (o, &q) in out[..BLOCK].iter_mut().zip(qs) {
                *o = (q as i8) as f32 * d;
            }
        }
        QuantKind::Q4_0 => {
            for j in 0..BLOCK / 2 {
                out[j] = ((qs[j] & 15) as f32 - 8.0) * d;
                out[j + BLOCK / 2] = ((qs[j] >> 4) as f32 - 8.0) * d;
            }
        }
    }
}

/// `x` as GGUF blocks (`x.len() / 32` of `kind.block_bytes()` bytes), or `None` when its length
/// is not a multiple of 32.
pub fn quantize(kind: QuantKind, x: &[f32]) -> Option<Vec<u8>> {
    if !x.len().is_multiple_of(BLOCK) {
        return None;
    }
    let mut out = vec![0u8; x.len() / BLOCK * kind.block_bytes()];
    for (blk, v) in out
        .chunks_exact_mut(kind.block_bytes())
        .zip(x.chunks_exact(BLOCK))
    {
        let d = quantize_block(kind, v.try_into().expect("a block"), &mut blk[2..]);
        blk[..2].copy_from_slice(&d.to_le_bytes());
    }
    Some(out)
}

/// The values of GGUF blocks, or `None` when `bytes` is not a whole number of blocks.
pub fn dequantize(kind: QuantKind, bytes: &[u8]) -> Option<Vec<f32>> {
    if !bytes.len().is_multiple_of(kind.block_bytes()) {
        return None;
    }
    let mut out = vec![0f32; bytes.len() / kind.block_bytes() * BLOCK];
    for (blk, o) in bytes
        .chunks_exact(kind.block_bytes())
        .zip(out.chunks_exact_mut(BLOCK))
    {
        dequantize_block(kind, u16::from_le_bytes([blk[0], blk[1]]), &blk[2..], o);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every case of tests/fixtures/quant_blocks.json (scripts/gguf_fixtures.py, gguf-py's
    /// `quantize` and `dequantize`): the same bytes, and the same values back, bit for bit.
    #[test]
    fn blocks_match_gguf_py_bit_for_bit() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/quant_blocks.json"
        );
        let j: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut checked = 0;
        for case in j["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let x: Vec<f32> = hex_words(case["x"].as_str().unwrap())
                .map(f32::from_bits)
                .collect();
            for kind in QuantKind::ALL {
                let want = hex_bytes(case[kind.as_str()].as_str().unwrap());
                let got = quantize(kind, &x).unwrap();
                assert_eq!(got, want, "{name} {kind}: bytes");
                // a NaN as one pattern: the CPU's default NaN from inf · 0 is 0xffc00000 on
                // x86-64 (as gguf-py wrote it) and 0x7fc00000 on ARM64
                let bits = |v: f32| {
                    if v.is_nan() {
                        f32::NAN.to_bits()
                    } else {
                        v.to_bits()
                    }
                };
                let back: Vec<u32> = hex_words(case[&format!("{kind}_deq")].as_str().unwrap())
                    .map(|w| bits(f32::from_bits(w)))
                    .collect();
                let got: Vec<u32> = dequantize(kind, &got)
                    .unwrap()
                    .iter()
                    .map(|&v| bits(v))
                    .collect();
                assert_eq!(got, back, "{name} {kind}: values");
                checked += 1;
            }
        }
        assert!(checked >= 10, "only {checked} cases");
    }

    #[test]
    fn a_length_off_the_block_is_refused() {
        assert!(quantize(QuantKind::Q8_0, &[1.0; 33]).is_none());
        assert!(dequantize(QuantKind::Q4_0, &[0; 19]).is_none());
        assert_eq!(
            "q5_0".parse::<QuantKind>().unwrap_err(),
            "unknown quantisation `q5_0` (expected q8_0 or q4_0)"
        );
    }

    fn hex_bytes(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Little-endian 32-bit words.
    fn hex_words(s: &str) -> impl Iterator<Item = u32> + '_ {
        hex_bytes(s)
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect::<Vec<_>>()
            .into_iter()
    }
}
