//! The paper's experiments, each measured and then rendered (`difftx repro`, `difftx demo`).
//!
//! Each experiment keeps three things apart: its task (episodes and prompts: pure data, no
//! model), its measurements (functions that train or evaluate models and return structs of
//! numbers) and its rendering (Markdown sections, PNG plots and JSON written from those
//! structs). Files depend only downwards:
//!
//! ```text
//! common, corpus                shared helpers; the text corpus and its windows
//! needle/{task, measure}        multi-needle episodes; retrieval of a model
//! attention_stats               attention maps, allocation and outliers of a model
//! icl/{task, plan, measure, render}          many-shot in-context classification
//! lm_scaling/{plan, measure, fit, render}    language modelling at three sizes, ablations
//! repro/{plan, measure, render, run}         the needle experiment, and the whole run
//! long/{plan, measure, run, render}          `repro --long`: long context on a real corpus
//! demo                          `difftx demo`: two tiny models through the real trainer
//! bench                         `difftx bench`: speed and memory of steps, products, decoding
//! ```
//!
//! The report's fixed prose (what the paper reports, why each protocol is so) is in
//! docs/repro-notes.md; the report points there.

pub mod attention_stats;
pub mod bench;
pub mod common;
pub mod corpus;
pub mod demo;
pub mod icl;
pub mod lm_scaling;
pub mod long;
pub mod needle;
pub mod repro;
pub mod serve_load;
