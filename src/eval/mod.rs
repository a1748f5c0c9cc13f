//! Evaluations of trained models.

pub mod attention_stats;
pub mod icl;
pub mod lm_scaling;
pub mod loss;
pub mod lowbit;
pub mod needle;
pub mod repro;

pub use loss::{evaluate_loss, EvalResult};
