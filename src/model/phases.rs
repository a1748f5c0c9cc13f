//! Where a forward's time goes, phase by phase (`bench decode --phases`). Off unless switched
//! on; then each block adds the wall time of each of its phases here, and the stack its final
//! norm and LM head. A lap is one clock reading (a few tens of nanoseconds), so a decoding step
//! of `medium` pays a few microseconds for it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// The phases, in the order of a block: the RMSNorms (and the final one), the q/k/v products
/// (one product), RoPE with the attention and its combination (cache writes, the decoding
/// attention, diff's A1 − λ·A2 and subln), `o_proj`, the MLP (gate and up, SwiGLU, down) and the
/// LM head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Norms,
    Qkv,
    Attention,
    OProj,
    Mlp,
    LmHead,
}

impl Phase {
    pub const ALL: [Phase; 6] = [
        Phase::Norms,
        Phase::Qkv,
        Phase::Attention,
        Phase::OProj,
        Phase::Mlp,
        Phase::LmHead,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Norms => "norms",
            Phase::Qkv => "qkv",
            Phase::Attention => "attention",
            Phase::OProj => "o_proj",
            Phase::Mlp => "mlp",
            Phase::LmHead => "lm_head",
        }
    }
}

static ON: AtomicBool = AtomicBool::new(false);
static NANOS: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];

/// Starts (or stops) timing the phases, from zero.
pub fn switch(on: bool) {
    reset();
    ON.store(on, Ordering::Relaxed);
}

/// Zeroes the phases' times.
pub fn reset() {
    NANOS.iter().for_each(|n| n.store(0, Ordering::Relaxed));
}

/// Each phase's time since the last reset, in seconds, in the order of `Phase::ALL`.
pub fn seconds() -> [f64; 6] {
    std::array::from_fn(|i| NANOS[i].load(Ordering::Relaxed) as f64 * 1e-9)
}

/// A forward's clock: `lap(phase)` adds the time since the last lap (or the start) to the
/// phase. Reads no clock while timing is off.
pub struct Clock(Option<Instant>);

impl Clock {
    pub fn start() -> Clock {
        Clock(ON.load(Ordering::Relaxed).then(Instant::now))
    }

    #[inline]
    pub fn lap(&mut self, phase: Phase) {
        if let Some(t0) = self.0 {
            let now = Instant::now();
            NANOS[phase as usize].fetch_add((now - t0).as_nanos() as u64, Ordering::Relaxed);
            self.0 = Some(now);
        }
    }
}
