//! Reports: loss-curve plots, line plots with error bars and heatmaps.

pub mod axis;
pub mod heatmap;
pub mod lines;
pub mod plot;
