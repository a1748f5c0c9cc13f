//! Token embedding lookup.

use super::ROW_CHUNK;
use rayon::prelude::*;

/// wte: (V, C), tokens: (N); out (N, C) = wte[tokens].
pub fn embedding_forward(out: &mut [f32], tokens: &[u32], wte: &[f32], c: usize) {
    out.par_chunks_mut(c * ROW_CHUNK)
        .zip(tokens.par_chunks(ROW_CHUNK))
        .for_each(|(out, tokens)| {
            for (o, &t) in out.chunks_mut(c).zip(tokens) {
                o.copy_from_slice(&wte[t as usize * c..(t as usize + 1) * c]);
            }
        });
}

/// Accumulates dwte[tokens[n]] += dout[n], in token order (repeated tokens add up deterministically).
pub fn embedding_backward(dwte: &mut [f32], dout: &[f32], tokens: &[u32], c: usize) {
    for (d, &t) in dout.chunks(c).zip(tokens) {
        for (w, &g) in dwte[t as usize * c..(t as usize + 1) * c].iter_mut().zip(d) {
            *w += g;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_tokens_accumulate_their_gradients() {
        let c = 2;
        let wte = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0];
        let mut out = [0.0; 6];
        embedding_forward(&mut out, &[2, 0, 2], &wte, c);
        assert_eq!(out, [4.0, 5.0, 0.0, 1.0, 4.0, 5.0]);
        let mut d = [0.0; 6];
        embedding_backward(&mut d, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 0, 2], c);
        assert_eq!(d, [3.0, 4.0, 0.0, 0.0, 6.0, 8.0]);
    }
}
