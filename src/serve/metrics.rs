//! The server's counters in the Prometheus text format (`GET /metrics`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use super::engine::EngineGauges;

/// A histogram over fixed bucket bounds (seconds).
pub struct Histogram {
    bounds: &'static [f64],
    /// per bucket (and +Inf), then the sum in µs
    counts: Mutex<(Vec<u64>, f64)>,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: Mutex::new((vec![0; bounds.len() + 1], 0.0)),
        }
    }

    pub fn observe(&self, seconds: f64) {
        let i = self.bounds.partition_point(|&b| b < seconds);
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.0[i] += 1;
        c.1 += seconds;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut acc = 0;
        for (b, n) in self.bounds.iter().zip(&c.0) {
            acc += n;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {acc}");
        }
        acc += c.0[self.bounds.len()];
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {acc}");
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {acc}", c.1);
    }
}

const LATENCY: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const PER_TOKEN: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

pub struct Metrics {
    /// answers by HTTP status
    pub by_status: Mutex<BTreeMap<u16, u64>>,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub request_seconds: Histogram,
    pub first_token_seconds: Histogram,
    pub per_token_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            by_status: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            request_seconds: Histogram::new(LATENCY),
            first_token_seconds: Histogram::new(LATENCY),
            per_token_seconds: Histogram::new(PER_TOKEN),
        }
    }
}

impl Metrics {
    pub fn count_status(&self, status: u16) {
        *self
            .by_status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(status)
            .or_default() += 1;
    }

    /// The text exposition, with the engine's gauges (queue depth, running batch size, prefix
    /// cache, speculative decoding).
    pub fn render(&self, engine: &EngineGauges) -> String {
        let (prefix, u) = (&engine.prefix, |x: &AtomicUsize| {
            x.load(Ordering::Relaxed) as u64
        });
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP difftx_requests_total HTTP answers by status code.\n# TYPE difftx_requests_total counter"
        );
        for (s, n) in self
            .by_status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(out, "difftx_requests_total{{status=\"{s}\"}} {n}");
        }
        let p = |x: &AtomicU64| x.load(Ordering::Relaxed);
        let (counter, gauge) = ("counter", "gauge");
        for (name, kind, help, v) in [
            (
                "difftx_prompt_tokens_total",
                counter,
                "Prompt tokens admitted.",
                p(&self.prompt_tokens),
            ),
            (
                "difftx_generated_tokens_total",
                counter,
                "Tokens generated.",
                p(&self.generated_tokens),
            ),
            (
                "difftx_prefix_cache_lookups_total",
                counter,
                "Requests looked up in the prefix cache.",
                p(&prefix.lookups),
            ),
            (
                "difftx_prefix_cache_hits_total",
                counter,
                "Requests that took at least one block from the prefix cache.",
                p(&prefix.hits),
            ),
            (
                "difftx_prefix_cache_tokens_saved_total",
                counter,
                "Prompt tokens taken from the prefix cache instead of prefilled.",
                p(&prefix.tokens_saved),
            ),
            (
                "difftx_prefix_cache_evictions_total",
                counter,
                "Blocks evicted from the prefix cache.",
                p(&prefix.evictions),
            ),
            (
                "difftx_prefix_cache_blocks",
                gauge,
                "Blocks held by the prefix cache.",
                p(&prefix.blocks),
            ),
            (
                "difftx_prefix_cache_bytes",
                gauge,
                "Bytes held by the prefix cache.",
                p(&prefix.bytes),
            ),
            (
                "difftx_speculative_drafted_tokens_total",
                counter,
                "Tokens drafted by speculative decoding (prompt lookup or a draft model).",
                u(&engine.drafted),
            ),
            (
                "difftx_speculative_accepted_tokens_total",
                counter,
                "Drafted tokens the model accepted.",
                u(&engine.accepted),
            ),
            (
                "difftx_queue_depth",
                gauge,
                "Requests waiting for a batch slot.",
                u(&engine.queued),
            ),
            (
                "difftx_running_sequences",
                gauge,
                "Sequences in the running batch.",
                u(&engine.running),
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
        self.request_seconds.write(
            &mut out,
            "difftx_request_duration_seconds",
            "Time from a completion request to its last token.",
        );
        self.first_token_seconds.write(
            &mut out,
            "difftx_time_to_first_token_seconds",
            "Time from a completion request to its first token.",
        );
        self.per_token_seconds.write(
            &mut out,
            "difftx_time_per_output_token_seconds",
            "Mean time between a request's tokens after the first.",
        );
        out
    }
}
