//! Hugging Face chat templates (Jinja) rendered with minijinja, with the Python-isms
//! templates rely on: string methods (pycompat), `raise_exception`, Python-style `tojson`.

use minijinja::{value::Kwargs, Environment, Error as JinjaError, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};

/// ChatML, used when a model ships no template of its own.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// One chat turn as templates see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// A compiled chat template with the special tokens it may reference.
pub struct ChatTemplate {
    env: Environment<'static>,
    pub source: String,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> std::result::Result<Value, JinjaError> {
                Err(JinjaError::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_filter("tojson", python_tojson);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| EngineError::ChatTemplate(e.to_string()))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// Render `messages`; with `add_generation_prompt` the text ends where the reply starts.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| EngineError::ChatTemplate(e.to_string()))?;
        template
            .render(minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            })
            .map_err(|e| {
                let mut message = e.to_string();
                if let Some(detail) = e.detail() {
                    message = format!("{message}: {detail}");
                }
                EngineError::ChatTemplate(message)
            })
    }
}

/// `tojson` as Hugging Face defines it: `json.dumps(x, ensure_ascii=False, indent=indent)`,
/// so `", "` and `": "` separators and no HTML escaping.
fn python_tojson(value: Value, kwargs: Kwargs) -> std::result::Result<Value, JinjaError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    write_python_json(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write_python_json(v: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_python_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                out.push_str(&J::String(key.clone()).to_string());
                out.push_str(": ");
                write_python_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, messages: &[ChatMessage]) -> Result<String> {
        ChatTemplate::new(source, "<s>", "</s>")?.render(messages, true)
    }

    #[test]
    fn chatml_fallback_ends_with_the_generation_prompt() {
        let out = render(CHATML_TEMPLATE, &[ChatMessage::new("user", "hi")]).unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn python_string_methods_work() {
        let src = "{{ messages[0].content.strip().upper() }}|{{ messages[0].content.startswith(' a') }}|{{ bos_token }}";
        let out = render(src, &[ChatMessage::new("user", " abc ")]).unwrap();
        assert_eq!(out, "ABC|True|<s>");
    }

    #[test]
    fn raise_exception_becomes_an_error_with_its_message() {
        let err = render("{{ raise_exception('roles must alternate') }}", &[]).unwrap_err();
        assert!(err.to_string().contains("roles must alternate"), "{err}");
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let src = "{{ {'b': [1, 'x<y'], 'a': {'k': none}} | tojson }}";
        assert_eq!(
            render(src, &[]).unwrap(),
            r#"{"b": [1, "x<y"], "a": {"k": null}}"#
        );
        let indented = "{{ {'a': [1]} | tojson(indent=2) }}";
        assert_eq!(
            render(indented, &[]).unwrap(),
            "{\n  \"a\": [\n    1\n  ]\n}"
        );
    }
}
