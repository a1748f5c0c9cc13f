//! `difftx repro`: the paper's claims measured side by side on models a 2-core CPU can train.
//!
//! Each attention kind (standard, diff_v1, diff_v2) is trained at matched parameters on the
//! same multi-needle episodes (experiments/needle) with the same seeds, steps and token budget,
//! then measured: retrieval accuracy per (depth, context length), attention allocation and
//! activation outliers (experiments/attention_stats.rs). The run folder gets:
//!
//! ```text
//! OUT/REPRO.md            tables (mean ± std over seeds), parameter counts, command, wall time, protocol
//! OUT/needle_heatmap.png  retrieval accuracy per (depth, length), one panel per kind
//! OUT/results.json        every number behind the tables, per kind and seed
//! OUT/models/KIND-seedS/  the trained models (model directories)
//! ```
//!
//! `plan` says what runs, `measure` trains one model and measures it, `run` orchestrates the
//! whole plan into a run folder, `render` writes the report, the plots and the JSON.

pub mod measure;
pub mod plan;
pub mod render;
pub mod run;

pub use measure::{
    head_lambda_stats, measure, train_needle, weight_quant_rows, HeadLambda, KindRun, Measurements,
    WeightQuantRow,
};
pub use plan::{NeedleLoss, ReproPlan};
pub use render::{
    render_report, results_json, HEATMAP_FILE, ICL_PLOT, LOWBIT_PLOT, NEEDLES_PLOT, REPORT_FILE,
    RESULTS_FILE,
};
pub use run::run_repro;
