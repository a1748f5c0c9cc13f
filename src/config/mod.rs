//! `ModelConfig` mirrors the native `config.json` (docs/SPEC.md), plus the presets and the
//! parameter table (`params`) that the config implies.

#[doc(hidden)]
pub mod params;

use crate::error::{Error, Result};
use serde_json::{Map, Value};
use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// Which attention a model uses: the baseline, the paper (V1) or DIFF V2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKind {
    /// The baseline Transformer: one softmax map per head.
    Standard,
    /// DIFF Transformer V1 (the paper): each head subtracts λ times a second softmax map from a first.
    DiffV1,
    /// DIFF V2: a per-token, per-head λ = σ(lambda_proj x), at the baseline's parameter count.
    DiffV2,
}

impl AttentionKind {
    /// Every kind, in the order the reports list them.
    pub const ALL: [AttentionKind; 3] = [Self::Standard, Self::DiffV1, Self::DiffV2];

    /// The name used on the command line and in `config.json`: `standard`, `diff_v1` or `diff_v2`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Standard => "standard",
            Self::DiffV1 => "diff_v1",
            Self::DiffV2 => "diff_v2",
        }
    }

    /// True for the differential kinds (diff_v1 and diff_v2).
    pub fn is_diff(self) -> bool {
        self != Self::Standard
    }
}

impl fmt::Display for AttentionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AttentionKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "standard" => Ok(Self::Standard),
            "diff_v1" => Ok(Self::DiffV1),
            "diff_v2" => Ok(Self::DiffV2),
            _ => Err(format!(
                "unknown attention kind `{s}` (expected standard, diff_v1 or diff_v2)"
            )),
        }
    }
}

/// The native model configuration. Field names are the `config.json` keys.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Which attention the layers use.
    pub attention: AttentionKind,
    /// Number of token ids (256 for the byte-level tokenizer).
    pub vocab_size: usize,
    /// D
    pub hidden_size: usize,
    /// SwiGLU hidden width F
    pub intermediate_size: usize,
    /// L
    pub num_hidden_layers: usize,
    /// H: differential heads for the diff kinds, heads for `standard`
    pub num_attention_heads: usize,
    /// H_kv
    pub num_key_value_heads: usize,
    /// d
    pub head_dim: usize,
    /// Context length: the longest sequence the model runs.
    pub max_position_embeddings: usize,
    /// RoPE base θ.
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Whether `lm_head` shares the input embedding's weights.
    pub tie_word_embeddings: bool,
    /// diff_v1 ablation (paper Table 6): one constant λ_init for every layer; `None` (the key
    /// absent or null) is the paper's schedule, see `lambda_init_at`.
    pub lambda_init: Option<f64>,
    /// diff_v1: the per-head RMSNorm `subln` and its (1 − λ_init) scale; `false` is the Table 6
    /// ablation without them (and without the `self_attn.subln.weight` tensors).
    pub subln: bool,
    /// `"byte"` for the built-in byte-level tokenizer; absent when `tokenizer.json` is used.
    pub tokenizer: Option<String>,
    /// Unknown keys, kept so that a load / save round trip preserves them.
    pub extra: Map<String, Value>,
}

const KNOWN_KEYS: &[&str] = &[
    "model_type",
    "attention",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rope_theta",
    "rms_norm_eps",
    "tie_word_embeddings",
    "lambda_init",
    "subln",
    "tokenizer",
];

/// The preset sizes. Each attention kind gets matched parameters (docs/SPEC.md, "Configuration matching").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// D 128, 2 layers, context 128: trains in seconds (tests, examples).
    Tiny,
    /// D 256, 6 layers, context 512.
    Small,
    /// D 256, 4 layers, context 256: the shape docs/BENCHMARKS.md measures.
    Bench,
    /// D 512, 8 layers, context 1024.
    Medium,
    /// about GPT-2 small's size (D 768, 12 layers, context 2048): 85M parameters at the byte
    /// vocabulary, 134M at a 32,000-token one
    Large,
}

impl Preset {
    /// Every preset, smallest first.
    pub const ALL: [Preset; 5] = [
        Self::Tiny,
        Self::Small,
        Self::Bench,
        Self::Medium,
        Self::Large,
    ];

    /// The preset's name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tiny => "tiny",
            Self::Small => "small",
            Self::Bench => "bench",
            Self::Medium => "medium",
            Self::Large => "large",
        }
    }
}

impl FromStr for Preset {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                format!("unknown preset `{s}` (expected tiny, small, bench, medium or large)")
            })
    }
}

/// SwiGLU width: 8/3 D rounded up to a multiple of 64.
pub fn swiglu_width(d_model: usize) -> usize {
    (8 * d_model).div_ceil(3).div_ceil(64) * 64
}

impl ModelConfig {
    /// A preset for one attention kind. `h` is the number of differential heads; the baseline gets
    /// 2h heads of the same d (V1 matches it), and V2 gets 2h heads sharing h K/V heads, which
    /// matches the baseline's parameters up to `lambda_proj`.
    pub fn preset(preset: Preset, attention: AttentionKind) -> Self {
        // (D, L, d, context, h)
        let (d_model, layers, head_dim, ctx, h) = match preset {
            Preset::Tiny => (128, 2, 32, 128, 2),
            Preset::Small => (256, 6, 32, 512, 4),
            Preset::Bench => (256, 4, 32, 256, 4),
            Preset::Medium => (512, 8, 64, 1024, 4),
            Preset::Large => (768, 12, 64, 2048, 6),
        };
        let (heads, kv_heads) = match attention {
            AttentionKind::Standard => (2 * h, 2 * h),
            AttentionKind::DiffV1 => (h, h),
            AttentionKind::DiffV2 => (2 * h, h),
        };
        ModelConfig {
            attention,
            vocab_size: 256,
            hidden_size: d_model,
            intermediate_size: swiglu_width(d_model),
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            max_position_embeddings: ctx,
            rope_theta: 10000.0,
            rms_norm_eps: 1e-5,
            tie_word_embeddings: false,
            lambda_init: None,
            subln: true,
            tokenizer: Some("byte".into()),
            extra: Map::new(),
        }
    }

    /// Parses and validates a `config.json` text; `path` only names the file in errors.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self> {
        let value: Value = serde_json::from_str(text).map_err(|e| Error::Config {
            path: path.to_path_buf(),
            msg: format!("malformed JSON ({e})"),
        })?;
        Self::from_json(&value, path)
    }

    /// Validates a parsed `config.json`; `path` only names the file in errors.
    pub fn from_json(value: &Value, path: &Path) -> Result<Self> {
        let err = |msg: String| Error::Config {
            path: path.to_path_buf(),
            msg,
        };
        let obj = value
            .as_object()
            .ok_or_else(|| err("expected a JSON object".into()))?;
        let model_type = get_str(obj, "model_type").map_err(err)?;
        if model_type != "difftx" {
            return Err(err(format!(
                "model_type `{model_type}` is not supported (expected difftx, llama, diffllama or difftx_diffv2)"
            )));
        }
        let attention = get_str(obj, "attention")
            .map_err(err)?
            .parse::<AttentionKind>()
            .map_err(|e| err(format!("key `attention`: {e}")))?;
        let u = |k: &str| get_usize(obj, k).map_err(err);
        let cfg = ModelConfig {
            attention,
            vocab_size: u("vocab_size")?,
            hidden_size: u("hidden_size")?,
            intermediate_size: u("intermediate_size")?,
            num_hidden_layers: u("num_hidden_layers")?,
            num_attention_heads: u("num_attention_heads")?,
            num_key_value_heads: u("num_key_value_heads")?,
            head_dim: u("head_dim")?,
            max_position_embeddings: u("max_position_embeddings")?,
            rope_theta: get_f64_or(obj, "rope_theta", 10000.0).map_err(err)?,
            rms_norm_eps: get_f64_or(obj, "rms_norm_eps", 1e-5).map_err(err)?,
            tie_word_embeddings: match obj.get("tie_word_embeddings") {
                None => false,
                Some(v) => v
                    .as_bool()
                    .ok_or_else(|| err("key `tie_word_embeddings` must be true or false".into()))?,
            },
            lambda_init: match obj.get("lambda_init") {
                None | Some(Value::Null) => None,
                Some(v) => Some(v.as_f64().ok_or_else(|| {
                    err(format!(
                        "key `lambda_init` must be a number or null, got {v}"
                    ))
                })?),
            },
            subln: match obj.get("subln") {
                None => true,
                Some(v) => v
                    .as_bool()
                    .ok_or_else(|| err(format!("key `subln` must be true or false, got {v}")))?,
            },
            tokenizer: match obj.get("tokenizer") {
                None | Some(Value::Null) => None,
                Some(v) => Some(
                    v.as_str()
                        .ok_or_else(|| err("key `tokenizer` must be a string".into()))?
                        .to_string(),
                ),
            },
            extra: obj
                .iter()
                .filter(|(k, _)| !KNOWN_KEYS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        };
        cfg.validate().map_err(err)?;
        Ok(cfg)
    }

    /// Reads a `config.json` (native keys).
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_json_str(&text, path)
    }

    /// The config as the `config.json` object that `save` writes.
    pub fn to_json(&self) -> Value {
        let mut obj = self.extra.clone();
        let mut put = |k: &str, v: Value| {
            obj.insert(k.to_string(), v);
        };
        put("model_type", "difftx".into());
        put("attention", self.attention.as_str().into());
        put("vocab_size", self.vocab_size.into());
        put("hidden_size", self.hidden_size.into());
        put("intermediate_size", self.intermediate_size.into());
        put("num_hidden_layers", self.num_hidden_layers.into());
        put("num_attention_heads", self.num_attention_heads.into());
        put("num_key_value_heads", self.num_key_value_heads.into());
        put("head_dim", self.head_dim.into());
        put(
            "max_position_embeddings",
            self.max_position_embeddings.into(),
        );
        put("rope_theta", self.rope_theta.into());
        put("rms_norm_eps", self.rms_norm_eps.into());
        put("tie_word_embeddings", self.tie_word_embeddings.into());
        // Written only when they differ from the paper, so other configs stay byte-identical.
        if let Some(l) = self.lambda_init {
            put("lambda_init", l.into());
        }
        if !self.subln {
            put("subln", false.into());
        }
        if let Some(t) = &self.tokenizer {
            put("tokenizer", t.clone().into());
        }
        Value::Object(obj)
    }

    /// Checks that the numbers describe a model that can exist; the message names the key.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (k, v) in positive {
            if v == 0 {
                return Err(format!("key `{k}` must be positive"));
            }
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!(
                "head_dim ({}) must be even: RoPE rotates pairs of dimensions",
                self.head_dim
            ));
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(format!(
                "num_attention_heads ({}) must divide by num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.rope_theta.is_nan() || self.rope_theta <= 0.0 {
            return Err(format!("rope_theta ({}) must be positive", self.rope_theta));
        }
        if self.rms_norm_eps.is_nan() || self.rms_norm_eps <= 0.0 {
            return Err(format!(
                "rms_norm_eps ({}) must be positive",
                self.rms_norm_eps
            ));
        }
        if self.vocab_size > u32::MAX as usize {
            return Err(format!("vocab_size ({}) is too large", self.vocab_size));
        }
        let diff_v1_only = |key: &str, what: &str| {
            format!(
                "key `{key}` applies to diff_v1 only ({} has no {what})",
                self.attention
            )
        };
        if let Some(l) = self.lambda_init {
            if self.attention != AttentionKind::DiffV1 {
                return Err(diff_v1_only("lambda_init", "λ_init"));
            }
            // λ_init = 1 would zero the (1 − λ_init)·subln output, above 1 flip its sign; the
            // paper's values (schedule 0.2 → 0.8, constants 0.8 and 0.5) lie well inside.
            if !(0.0..1.0).contains(&l) {
                return Err(format!("lambda_init ({l}) must be in [0, 1)"));
            }
        }
        if !self.subln && self.attention != AttentionKind::DiffV1 {
            return Err(diff_v1_only("subln", "per-head norm"));
        }
        self.check_fits_in_memory()
    }

    /// Refuses, before anything is allocated, a model whose weights, RoPE table and per-layer
    /// bookkeeping alone would exceed this machine's memory (a config claiming 2^60 layers or
    /// heads). Counted in f64, so no product overflows.
    fn check_fits_in_memory(&self) -> std::result::Result<(), String> {
        let f = |x: usize| x as f64;
        let (dm, d, l) = (
            f(self.hidden_size),
            f(self.head_dim),
            f(self.num_hidden_layers),
        );
        // q and o over at most 2H heads of d, k and v over at most 2H_kv (n_query_heads and
        // the like would overflow a usize on such a config)
        let (h, kv) = (f(self.num_attention_heads), f(self.num_key_value_heads));
        let attn = dm * 4.0 * (h + kv) * d + 3.0 * dm * f(self.intermediate_size);
        let embed = f(self.vocab_size) * dm * if self.tie_word_embeddings { 1.0 } else { 2.0 };
        let params = l * attn + embed;
        // 4 bytes a parameter, the RoPE table, about 2 KiB of names and shapes a layer
        let bytes = 4.0 * params + 4.0 * f(self.max_position_embeddings) * d + 2048.0 * l;
        let detail = format!(
            "for its weights alone ({params:.3e} parameters, {} layers)",
            self.num_hidden_layers
        );
        check_memory("the model", bytes, &detail)
    }

    /// Number of query heads the attention kernel runs: 2H sub-heads for the diff kinds.
    pub fn n_query_heads(&self) -> usize {
        match self.attention {
            AttentionKind::Standard => self.num_attention_heads,
            AttentionKind::DiffV1 | AttentionKind::DiffV2 => 2 * self.num_attention_heads,
        }
    }

    /// Number of d-dim key heads: V1 keeps two sub-heads per K/V head.
    pub fn n_key_heads(&self) -> usize {
        match self.attention {
            AttentionKind::DiffV1 => 2 * self.num_key_value_heads,
            _ => self.num_key_value_heads,
        }
    }

    /// Width of one value head: 2d for V1, d otherwise.
    pub fn value_head_dim(&self) -> usize {
        match self.attention {
            AttentionKind::DiffV1 => 2 * self.head_dim,
            _ => self.head_dim,
        }
    }

    /// Width of the o_proj input.
    pub fn attn_out_dim(&self) -> usize {
        match self.attention {
            AttentionKind::Standard => self.num_attention_heads * self.head_dim,
            AttentionKind::DiffV1 => self.num_attention_heads * 2 * self.head_dim,
            AttentionKind::DiffV2 => self.num_attention_heads * self.head_dim,
        }
    }

    /// diff_v1's λ_init of one layer: the config's constant `lambda_init` if set, else the
    /// paper's schedule.
    pub fn lambda_init_at(&self, layer: usize) -> f32 {
        lambda_init_at(self.lambda_init, layer)
    }

    /// Total number of parameters (every tensor in the checkpoint).
    pub fn num_params(&self) -> usize {
        params::ParamLayout::new(self).total
    }
}

/// λ_init of layer l (0-based): `constant` if given, else 0.8 − 0.6·exp(−0.3·l) (paper Eq. 2).
pub fn lambda_init_at(constant: Option<f64>, layer: usize) -> f32 {
    constant.unwrap_or_else(|| 0.8 - 0.6 * (-0.3 * layer as f64).exp()) as f32
}

fn get_str<'a>(obj: &'a Map<String, Value>, key: &str) -> std::result::Result<&'a str, String> {
    match obj.get(key) {
        None => Err(format!("missing key `{key}`")),
        Some(v) => v
            .as_str()
            .ok_or_else(|| format!("key `{key}` must be a string, got {v}")),
    }
}

fn get_usize(obj: &Map<String, Value>, key: &str) -> std::result::Result<usize, String> {
    match obj.get(key) {
        None => Err(format!("missing key `{key}`")),
        Some(v) => v
            .as_u64()
            .map(|x| x as usize)
            .ok_or_else(|| format!("key `{key}` must be a non-negative integer, got {v}")),
    }
}

fn get_f64_or(
    obj: &Map<String, Value>,
    key: &str,
    default: f64,
) -> std::result::Result<f64, String> {
    match obj.get(key) {
        None => Ok(default),
        Some(v) => v
            .as_f64()
            .ok_or_else(|| format!("key `{key}` must be a number, got {v}")),
    }
}

/// Refuses, in one line, what would need `bytes` of memory when this machine has less:
/// "`what` would need 3.0 GiB `detail`, more than this machine's 2.0 GiB of memory". Called
/// before allocating, with a figure counted in f64 (or saturated), so nothing overflows.
pub fn check_memory(what: &str, bytes: f64, detail: &str) -> std::result::Result<(), String> {
    let have = physical_memory() as f64;
    if bytes <= have {
        return Ok(());
    }
    let gib = |b: f64| b / f64::from(1u32 << 30);
    Err(format!(
        "{what} would need {:.1} GiB {detail}, more than this machine's {:.1} GiB of memory",
        gib(bytes),
        gib(have)
    ))
}

/// This machine's physical memory in bytes (64 GiB where the OS does not say).
fn physical_memory() -> u64 {
    // SAFETY: sysconf reads two constants and has no preconditions.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages > 0 && size > 0 {
        (pages as u64).saturating_mul(size as u64)
    } else {
        64 << 30
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_too_big_for_memory_is_refused_before_allocating() {
        // found by tests/fuzz_loaders.rs: num_hidden_layers 2^60 in config.json overflowed a
        // Vec's capacity (a panic) instead of being refused
        let tiny = ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1);
        assert!(tiny.validate().is_ok());
        for c in [
            ModelConfig {
                num_hidden_layers: 1 << 60,
                ..tiny.clone()
            },
            ModelConfig {
                hidden_size: 1 << 40,
                ..tiny.clone()
            },
            ModelConfig {
                num_attention_heads: 1 << 62,
                num_key_value_heads: 1,
                ..tiny.clone()
            },
            ModelConfig {
                vocab_size: 1 << 31,
                ..tiny.clone()
            },
            ModelConfig {
                max_position_embeddings: usize::MAX,
                ..tiny.clone()
            },
        ] {
            let e = c.validate().unwrap_err();
            assert!(e.contains("more than this machine's"), "{e}");
        }
    }

    #[test]
    fn bench_preset_diff_v1_has_the_spec_parameter_count() {
        let c = ModelConfig::preset(Preset::Bench, AttentionKind::DiffV1);
        assert_eq!(c.num_params(), 3_345_408);
        assert_eq!(c.intermediate_size, 704);
    }

    #[test]
    fn presets_match_parameters_across_kinds() {
        for p in Preset::ALL {
            let s = ModelConfig::preset(p, AttentionKind::Standard).num_params() as f64;
            for k in [AttentionKind::DiffV1, AttentionKind::DiffV2] {
                let n = ModelConfig::preset(p, k).num_params() as f64;
                assert!((n / s - 1.0).abs() < 0.01, "{p:?} {k}: {n} vs {s}");
            }
        }
    }

    #[test]
    fn missing_key_is_named() {
        let mut j = ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1).to_json();
        j.as_object_mut().unwrap().remove("hidden_size");
        let e = ModelConfig::from_json_str(&j.to_string(), Path::new("x/config.json"))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "x/config.json: missing key `hidden_size`");
    }

    #[test]
    fn impossible_heads_are_rejected_with_both_values() {
        let mut c = ModelConfig::preset(Preset::Tiny, AttentionKind::Standard);
        c.num_attention_heads = 6;
        c.num_key_value_heads = 4;
        let e = ModelConfig::from_json_str(&c.to_json().to_string(), Path::new("config.json"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "config.json: num_attention_heads (6) must divide by num_key_value_heads (4)"
        );
    }

    /// The config of a tiny diff_v1 as `from_json_str` reads it (and errors name `c.json`).
    fn parse(j: &Value) -> std::result::Result<ModelConfig, String> {
        ModelConfig::from_json_str(&j.to_string(), Path::new("c.json")).map_err(|e| e.to_string())
    }

    fn tiny_v1_with(key: &str, v: Value) -> Value {
        let mut j = ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1).to_json();
        j.as_object_mut().unwrap().insert(key.into(), v);
        j
    }

    #[test]
    fn default_config_serialises_exactly_as_before_the_ablation_keys() {
        let c = ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1);
        assert_eq!(
            serde_json::to_string(&c.to_json()).unwrap(),
            r#"{"attention":"diff_v1","head_dim":32,"hidden_size":128,"intermediate_size":384,"max_position_embeddings":128,"model_type":"difftx","num_attention_heads":2,"num_hidden_layers":2,"num_key_value_heads":2,"rms_norm_eps":0.00001,"rope_theta":10000.0,"tie_word_embeddings":false,"tokenizer":"byte","vocab_size":256}"#
        );
        assert_eq!((c.lambda_init, c.subln), (None, true));
        // λ_init follows the paper's schedule: 0.2 at layer 0, → 0.8 with depth.
        assert_eq!(c.lambda_init_at(0), 0.2);
        assert!((c.lambda_init_at(3) - (0.8 - 0.6 * (-0.9f64).exp()) as f32).abs() < 1e-7);
    }

    #[test]
    fn ablation_keys_round_trip_and_are_written_only_when_set() {
        let mut c = ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1);
        c.lambda_init = Some(0.8);
        c.subln = false;
        let j = c.to_json();
        assert_eq!(j["lambda_init"], 0.8);
        assert_eq!(j["subln"], false);
        let back = parse(&j).unwrap();
        assert_eq!(back, c);
        assert!(back.extra.is_empty(), "{:?}", back.extra);
        assert_eq!((back.lambda_init_at(0), back.lambda_init_at(5)), (0.8, 0.8));
        // null is the schedule, as if the key were absent; true is the default
        let c = parse(&tiny_v1_with("lambda_init", Value::Null)).unwrap();
        assert_eq!(c.lambda_init, None);
        let c = parse(&tiny_v1_with("subln", true.into())).unwrap();
        assert!(c.subln);
        assert!(c.to_json().get("subln").is_none() && c.to_json().get("lambda_init").is_none());
    }

    #[test]
    fn bad_ablation_values_are_errors_naming_the_key() {
        let cases: [(&str, Value, &str); 6] = [
            (
                "lambda_init",
                "0.8".into(),
                "c.json: key `lambda_init` must be a number or null, got \"0.8\"",
            ),
            (
                "lambda_init",
                1.0.into(),
                "c.json: lambda_init (1) must be in [0, 1)",
            ),
            (
                "lambda_init",
                (-0.1).into(),
                "c.json: lambda_init (-0.1) must be in [0, 1)",
            ),
            (
                "subln",
                "no".into(),
                "c.json: key `subln` must be true or false, got \"no\"",
            ),
            (
                "subln",
                0.into(),
                "c.json: key `subln` must be true or false, got 0",
            ),
            ("lambda_init", 0.0.into(), ""),
        ];
        for (key, v, want) in cases {
            match parse(&tiny_v1_with(key, v.clone())) {
                Ok(c) => assert!(want.is_empty() && c.lambda_init == Some(0.0), "{key} = {v}"),
                Err(e) => assert_eq!(e, want, "{key} = {v}"),
            }
        }
        for kind in [AttentionKind::Standard, AttentionKind::DiffV2] {
            let mut c = ModelConfig::preset(Preset::Tiny, kind);
            c.lambda_init = Some(0.5);
            assert_eq!(
                c.validate().unwrap_err(),
                format!("key `lambda_init` applies to diff_v1 only ({kind} has no λ_init)")
            );
            c.lambda_init = None;
            c.subln = false;
            assert_eq!(
                c.validate().unwrap_err(),
                format!("key `subln` applies to diff_v1 only ({kind} has no per-head norm)")
            );
        }
    }

    #[test]
    fn without_subln_a_diff_v1_layer_has_2d_fewer_parameters() {
        let c = ModelConfig::preset(Preset::Bench, AttentionKind::DiffV1);
        let no_subln = ModelConfig {
            subln: false,
            ..c.clone()
        };
        // bench: L = 4 layers of d = 32
        assert_eq!(no_subln.num_params(), 3_345_408 - 4 * 2 * 32);
        let layout = params::ParamLayout::new(&no_subln);
        assert!(layout.layers.iter().all(|p| p.subln.is_none()));
        assert!(layout.specs.iter().all(|s| !s.name.contains("subln")));
        // a constant λ_init changes no tensor
        let constant = ModelConfig {
            lambda_init: Some(0.5),
            ..c.clone()
        };
        assert_eq!(constant.num_params(), c.num_params());
    }

    #[test]
    fn unknown_keys_survive_a_round_trip() {
        let mut j = ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV2).to_json();
        j.as_object_mut()
            .unwrap()
            .insert("my_note".into(), "kept".into());
        let c = ModelConfig::from_json_str(&j.to_string(), Path::new("c")).unwrap();
        assert_eq!(c.extra["my_note"], "kept");
        assert_eq!(c.to_json()["my_note"], "kept");
    }
}
