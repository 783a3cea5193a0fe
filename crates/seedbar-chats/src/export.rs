//! A conversation exported for use elsewhere: Markdown to read or share, and JSON that keeps
//! everything needed to reproduce a pinned-seed reply (each reply's seed, model and sampling,
//! the conversation's settings, what fixed each reply besides: its `provenance`, and the
//! images the user sent). The JSON is versioned (`seedbar.conversation`, version 1; images
//! are an addition older readers skip).

use base64::Engine as _;
use serde::Serialize;

use crate::{Conversation, Image, Message, Role, Status};

/// The JSON export's format name and version.
pub const FORMAT: &str = "seedbar.conversation";
pub const VERSION: u32 = 1;

/// The JSON export: the conversation as the app API lists it, its messages, and the images
/// they name (`Message::images`).
#[derive(Debug, Serialize)]
pub struct Export<'a> {
    pub format: &'static str,
    pub version: u32,
    pub conversation: &'a Conversation,
    pub messages: &'a [Message],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub images: &'a [ExportedImage],
}

impl<'a> Export<'a> {
    pub fn new(
        conversation: &'a Conversation,
        messages: &'a [Message],
        images: &'a [ExportedImage],
    ) -> Self {
        Export {
            format: FORMAT,
            version: VERSION,
            conversation,
            messages,
            images,
        }
    }
}

/// An image as the exports carry it: its id and the image itself as a data URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExportedImage {
    pub id: i64,
    pub url: String,
}

impl ExportedImage {
    pub fn new(id: i64, image: &Image) -> Self {
        let data = base64::engine::general_purpose::STANDARD.encode(&image.data);
        ExportedImage {
            id,
            url: format!("data:{};base64,{data}", image.media_type),
        }
    }
}

/// The conversation as Markdown: its title and settings, then each message under its
/// author (a user's images before the text, inline as data URLs), a reply with the seed and
/// sampling it used and how it ended if not complete.
pub fn markdown(
    conversation: &Conversation,
    messages: &[Message],
    images: &[ExportedImage],
) -> String {
    let settings = &conversation.settings;
    let mut out = format!("# {}\n\n", one_line(&conversation.title));
    out.push_str(&format!(
        "Model `{}` · temperature {} · top-p {} · max tokens {} · seed {}\n",
        settings.model,
        settings.temperature,
        settings.top_p,
        settings.max_tokens,
        settings
            .seed
            .map_or_else(|| "drawn per reply".to_string(), |s| format!("pinned {s}")),
    ));
    if !settings.system_prompt.is_empty() {
        out.push_str(&format!(
            "\n> System: {}\n",
            quoted(&settings.system_prompt)
        ));
    }
    for message in messages {
        let heading = match message.role {
            Role::User => "User".to_string(),
            Role::Assistant => {
                let mut about = Vec::new();
                if let Some(sampling) = &message.sampling {
                    about.push(format!("`{}`", sampling.model));
                    about.push(format!("temperature {}", sampling.temperature));
                }
                if let Some(seed) = message.seed {
                    about.push(format!("seed {seed}"));
                }
                let fingerprint = message.provenance.as_ref().map(|p| &p["fingerprint"]);
                if let Some(fingerprint) = fingerprint.and_then(|f| f.as_str()) {
                    about.push(format!("`{fingerprint}`"));
                }
                if message.status != Status::Complete {
                    about.push(message.status.as_str().to_string());
                }
                if about.is_empty() {
                    "Assistant".to_string()
                } else {
                    format!("Assistant ({})", about.join(", "))
                }
            }
        };
        let thinking = match &message.reasoning {
            Some(reasoning) => format!(
                "<details><summary>Thinking</summary>\n\n{}\n\n</details>\n\n",
                reasoning.trim_end()
            ),
            None => String::new(),
        };
        let pictures: String = message
            .images
            .iter()
            .filter_map(|id| images.iter().find(|image| image.id == *id))
            .map(|image| format!("![image {}]({})\n\n", image.id, image.url))
            .collect();
        out.push_str(&format!(
            "\n## {heading}\n\n{thinking}{pictures}{}\n",
            message.content.trim_end()
        ));
    }
    out
}

/// A title on one line (a heading ends at the line's end).
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Text kept inside a block quote, line by line.
fn quoted(text: &str) -> String {
    text.lines().collect::<Vec<_>>().join("\n> ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Sampling, Settings};

    fn message(id: i64, role: Role, content: &str, seed: Option<u64>, status: Status) -> Message {
        Message {
            id,
            conversation_id: 1,
            role,
            content: content.into(),
            seed,
            sampling: seed.map(|_| Sampling {
                model: "SmolLM2".into(),
                temperature: 0.7,
                top_p: 1.0,
                max_tokens: 64,
                system_prompt: String::new(),
            }),
            status,
            created_at: "2026-12-01T10:00:00Z".into(),
            reasoning: None,
            reasoning_ms: None,
            provenance: None,
            images: Vec::new(),
        }
    }

    fn conversation(seed: Option<u64>) -> Conversation {
        Conversation {
            id: 1,
            title: "Capitals\nof Europe".into(),
            created_at: "2026-12-01T10:00:00Z".into(),
            updated_at: "2026-12-01T10:01:00Z".into(),
            settings: Settings {
                seed,
                system_prompt: "Be brief.\nUse English.".into(),
                ..Settings::for_model("SmolLM2")
            },
        }
    }

    #[test]
    fn markdown_names_each_author_and_the_seed_of_each_reply() {
        let messages = [
            message(1, Role::User, "Capital of France?", None, Status::Complete),
            message(2, Role::Assistant, "Paris.\n", Some(42), Status::Complete),
            message(3, Role::User, "And Spain?", None, Status::Complete),
            message(4, Role::Assistant, "Mad", Some(43), Status::Stopped),
        ];
        let text = markdown(&conversation(Some(42)), &messages, &[]);
        assert_eq!(
            text,
            "# Capitals of Europe\n\n\
             Model `SmolLM2` · temperature 0.7 · top-p 1 · max tokens 512 · seed pinned 42\n\n\
             > System: Be brief.\n> Use English.\n\n\
             ## User\n\nCapital of France?\n\n\
             ## Assistant (`SmolLM2`, temperature 0.7, seed 42)\n\nParis.\n\n\
             ## User\n\nAnd Spain?\n\n\
             ## Assistant (`SmolLM2`, temperature 0.7, seed 43, stopped)\n\nMad\n"
        );
        assert!(markdown(&conversation(None), &[], &[]).contains("seed drawn per reply"));
    }

    #[test]
    fn json_keeps_what_reproduces_a_reply() {
        let messages = [message(
            2,
            Role::Assistant,
            "Paris.",
            Some(42),
            Status::Complete,
        )];
        let conversation = conversation(Some(42));
        let value = serde_json::to_value(Export::new(&conversation, &messages, &[])).unwrap();
        assert_eq!(value["format"], FORMAT);
        assert_eq!(value["version"], 1);
        assert_eq!(value["conversation"]["settings"]["seed"], 42);
        assert_eq!(value["messages"][0]["seed"], 42);
        assert_eq!(value["messages"][0]["sampling"]["temperature"], 0.7);
        assert_eq!(value["messages"][0]["content"], "Paris.");
        assert!(value.get("images").is_none());
    }

    #[test]
    fn both_exports_carry_a_users_images() {
        let image = Image {
            media_type: "image/png".into(),
            data: vec![1, 2, 3],
        };
        let exported = [ExportedImage::new(7, &image)];
        assert_eq!(exported[0].url, "data:image/png;base64,AQID");
        let mut asked = message(1, Role::User, "What is this?", None, Status::Complete);
        asked.images = vec![7];
        let messages = [asked];
        let conversation = conversation(None);
        let text = markdown(&conversation, &messages, &exported);
        assert!(
            text.contains("## User\n\n![image 7](data:image/png;base64,AQID)\n\nWhat is this?"),
            "{text}"
        );
        let value = serde_json::to_value(Export::new(&conversation, &messages, &exported)).unwrap();
        assert_eq!(value["messages"][0]["images"], serde_json::json!([7]));
        assert_eq!(value["images"][0]["url"], "data:image/png;base64,AQID");
    }
}
