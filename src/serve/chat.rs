//! Chat messages to a prompt: the model directory's `tokenizer_config.json` `chat_template`
//! (Jinja, rendered with minijinja) where it has one, else the plain template
//!
//! ```text
//! system: You are terse.
//! user: Hello
//! assistant:
//! ```
//!
//! one `role: content` line per message and `assistant:` to answer after.

use crate::error::{Error, Result};
use serde_json::Value;
use std::path::Path;

pub struct ChatTemplate {
    /// the Jinja source, or None for the plain template
    jinja: Option<String>,
    bos: String,
    eos: String,
}

/// A special token's text in tokenizer_config.json: a string or `{"content": …}`.
fn token_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        _ => String::new(),
    }
}

impl ChatTemplate {
    pub const PLAIN: &'static str = "plain";

    /// The template of model directory `dir`.
    pub fn for_model(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer_config.json");
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(ChatTemplate {
                jinja: None,
                bos: String::new(),
                eos: String::new(),
            });
        };
        let cfg: Value = serde_json::from_str(&text).map_err(|e| Error::Data {
            path: path.clone(),
            msg: format!("not valid JSON ({e})"),
        })?;
        // a string, or a list of named templates of which "default" is taken
        let jinja = match cfg.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
            _ => None,
        };
        let t = ChatTemplate {
            jinja,
            bos: token_text(cfg.get("bos_token")),
            eos: token_text(cfg.get("eos_token")),
        };
        if let Some(src) = &t.jinja {
            let mut env = minijinja::Environment::new();
            env.add_template("chat", src).map_err(|e| Error::Data {
                path,
                msg: format!("chat_template does not parse ({e})"),
            })?;
        }
        Ok(t)
    }

    /// The template's source as `/tokenizer_info` reports it (None for the plain one).
    pub fn source(&self) -> Option<&str> {
        self.jinja.as_deref()
    }

    /// The prompt for `messages` (each an object with `role` and string `content`), ending
    /// where the assistant's answer begins.
    pub fn render(&self, messages: &[Value]) -> std::result::Result<String, String> {
        for m in messages {
            if !m.get("role").is_some_and(Value::is_string) {
                return Err("each message needs a string \"role\"".into());
            }
        }
        let Some(src) = &self.jinja else {
            let mut out = String::new();
            for m in messages {
                let role = m["role"].as_str().unwrap_or("");
                let content = m.get("content").and_then(Value::as_str).unwrap_or("");
                out.push_str(&format!("{role}: {content}\n"));
            }
            out.push_str("assistant:");
            return Ok(out);
        };
        let mut env = minijinja::Environment::new();
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template("chat", src).map_err(|e| e.to_string())?;
        let tmpl = env.get_template("chat").map_err(|e| e.to_string())?;
        tmpl.render(minijinja::context! {
            messages => minijinja::Value::from(minijinja::value::Serde(messages)),
            add_generation_prompt => true,
            bos_token => self.bos.clone(),
            eos_token => self.eos.clone(),
        })
        .map_err(|e| format!("the chat template failed: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn plain_and_jinja_templates_render_the_messages() {
        let msgs = [
            json!({"role": "system", "content": "Be terse."}),
            json!({"role": "user", "content": "Hi"}),
        ];
        let plain = ChatTemplate {
            jinja: None,
            bos: String::new(),
            eos: String::new(),
        };
        assert_eq!(
            plain.render(&msgs).unwrap(),
            "system: Be terse.\nuser: Hi\nassistant:"
        );
        let dir = tempfile::tempdir().unwrap();
        let src = "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            json!({"chat_template": src, "bos_token": {"content": "<s>"}}).to_string(),
        )
        .unwrap();
        let t = ChatTemplate::for_model(dir.path()).unwrap();
        assert_eq!(
            t.render(&msgs).unwrap(),
            "<s><|system|>Be terse.<|user|>Hi<|assistant|>"
        );
        assert!(plain.render(&[json!({"content": "x"})]).is_err());
    }
}
