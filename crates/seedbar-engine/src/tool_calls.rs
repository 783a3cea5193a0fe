//! Tool calls in model output: a streaming parser that splits a reply into plain text and
//! the function calls of the formats our chat templates teach — Hermes / Qwen
//! `<tool_call>` blocks, Mistral `[TOOL_CALLS]` lists and Llama 3.1 bare JSON replies.

use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::{Deserializer, Value};

const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";
const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
const PYTHON_TAG: &str = "<|python_tag|>";
/// Markers recognised anywhere in a reply.
const TEXT_MARKERS: [&str; 2] = [CALL_OPEN, MISTRAL_CALLS];
/// Markers recognised at the start of a reply only (which may also be bare JSON).
const START_MARKERS: [&str; 3] = [CALL_OPEN, MISTRAL_CALLS, PYTHON_TAG];

/// A function call the model asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// `call_` and 24 alphanumerics, unique within a reply.
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments object as compact JSON text.
    pub arguments: String,
}

impl ToolCall {
    /// The reply's `index`-th call, its id derived from its position and content (so a
    /// seeded reply's ids are the same each time).
    pub fn new(index: usize, name: String, arguments: String) -> ToolCall {
        ToolCall {
            id: call_id(index, &name, &arguments),
            name,
            arguments,
        }
    }
}

/// A piece of a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOutput {
    /// Text to show as the reply's content.
    Text(String),
    /// A complete call.
    Call(ToolCall),
}

/// Splits a reply, fed in deltas, into text and tool calls.
///
/// Calls are `<tool_call>{"name", "arguments"}</tool_call>` blocks anywhere,
/// `[TOOL_CALLS]` followed by a JSON list (or object) of calls anywhere, or — at the very
/// start of the reply, optionally after `<|python_tag|>` — a bare JSON call object or list of
/// them (Llama 3.1, and Mistral when its marker was decoded away). A call object has a
/// string `name` and an `arguments` (or `parameters`) object, or a string holding one.
/// Whitespace between calls and the surrounding text is dropped; any other text, including
/// an unterminated or unparsable call, comes out as [`ToolOutput::Text`]. How the reply is
/// split into deltas never changes the result.
#[derive(Debug, Default)]
pub struct ToolCallParser {
    /// Received text not yet emitted.
    buf: String,
    /// Whether the start of the reply (where bare JSON counts as a call) is behind us.
    started: bool,
    /// Whether the last output was a call, so that whitespace following it is dropped.
    after_call: bool,
    /// Calls emitted so far.
    calls: usize,
}

/// What the front of the buffer turned out to be.
enum Step {
    /// Undecided until more text arrives.
    Wait,
    /// The first `len` bytes are text.
    Text(usize),
    /// The first `len` bytes are these `(name, arguments)` calls.
    Calls(usize, Vec<(String, String)>),
    /// The reply does not start with a bare JSON call.
    Started,
}

impl ToolCallParser {
    /// A parser at the start of a reply.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed the next text delta; returns text that is certainly not part of a tool call and
    /// any calls completed.
    pub fn push(&mut self, delta: &str) -> Vec<ToolOutput> {
        self.buf.push_str(delta);
        self.drain(false)
    }

    /// End of reply: returns held-back text (an unterminated or unparsable "call" is returned
    /// as plain text, never lost) and any last call.
    pub fn finish(&mut self) -> Vec<ToolOutput> {
        self.drain(true)
    }

    /// A whole reply at once (non-streamed responses).
    pub fn parse(reply: &str) -> Vec<ToolOutput> {
        let mut parser = Self::new();
        let mut outputs = parser.push(reply);
        outputs.extend(parser.finish());
        outputs
    }

    fn drain(&mut self, end: bool) -> Vec<ToolOutput> {
        let mut out = Vec::new();
        loop {
            let step = if self.started {
                self.scan_text(end)
            } else {
                self.scan_start(end)
            };
            match step {
                Step::Wait | Step::Text(0) => return out,
                Step::Started => self.started = true,
                Step::Text(len) => {
                    let text: String = self.buf.drain(..len).collect();
                    let text = if self.after_call {
                        text.trim_start()
                    } else {
                        &text
                    };
                    if !text.is_empty() {
                        self.after_call = false;
                        out.push(ToolOutput::Text(text.to_string()));
                    }
                }
                Step::Calls(len, calls) => {
                    self.buf.drain(..len);
                    self.started = true;
                    self.after_call = true;
                    for (name, arguments) in calls {
                        out.push(ToolOutput::Call(ToolCall::new(self.calls, name, arguments)));
                        self.calls += 1;
                    }
                }
            }
        }
    }

    /// At the start of the reply: a bare JSON call, possibly after `<|python_tag|>`?
    fn scan_start(&self, end: bool) -> Step {
        let body = self.buf.trim_start();
        if !end
            && START_MARKERS
                .iter()
                .any(|m| m.len() > body.len() && m.starts_with(body))
        {
            return Step::Wait;
        }
        let json = body.strip_prefix(PYTHON_TAG).unwrap_or(body).trim_start();
        if json.is_empty() || json.starts_with(['{', '[']) {
            match json_prefix(json) {
                Json::Incomplete if !end => return Step::Wait,
                Json::Value(value, used) => {
                    if let Some(calls) = calls_in(value) {
                        return Step::Calls(self.buf.len() - json.len() + used, calls);
                    }
                }
                _ => {}
            }
        }
        Step::Started
    }

    /// Past the start: text up to the next marker, then the call the marker opens.
    fn scan_text(&self, end: bool) -> Step {
        let buf = &self.buf;
        let Some((at, marker)) = TEXT_MARKERS
            .iter()
            .filter_map(|&m| buf.find(m).map(|at| (at, m)))
            .min()
        else {
            return if end {
                Step::Text(buf.len())
            } else {
                // Hold back what may still become a marker, and the whitespace before it.
                Step::Text(buf[..partial_marker_start(buf)].trim_end().len())
            };
        };
        let text = buf[..at].trim_end().len();
        if text > 0 {
            return Step::Text(text);
        }
        let after = at + marker.len();
        if marker == CALL_OPEN {
            return match buf[after..].find(CALL_CLOSE) {
                Some(close) => {
                    let len = after + close + CALL_CLOSE.len();
                    let calls = serde_json::from_str(buf[after..after + close].trim())
                        .ok()
                        .and_then(calls_in);
                    calls.map_or(Step::Text(len), |calls| Step::Calls(len, calls))
                }
                None if end => Step::Text(buf.len()),
                None => Step::Wait,
            };
        }
        let json = buf[after..].trim_start();
        match json_prefix(json) {
            Json::Incomplete if !end => Step::Wait,
            Json::Value(value, used) => match calls_in(value) {
                Some(calls) => Step::Calls(buf.len() - json.len() + used, calls),
                None => Step::Text(after),
            },
            _ => Step::Text(after),
        }
    }
}

/// Where the tail of `text` that is the beginning of a marker starts (`text.len()` if none).
fn partial_marker_start(text: &str) -> usize {
    let longest = TEXT_MARKERS.iter().map(|m| m.len()).max().unwrap_or(0);
    (text.len().saturating_sub(longest)..text.len())
        .filter(|&i| text.is_char_boundary(i))
        .find(|&i| TEXT_MARKERS.iter().any(|m| m.starts_with(&text[i..])))
        .unwrap_or(text.len())
}

/// The JSON value at the front of a text.
enum Json {
    /// The value and the bytes it spans.
    Value(Value, usize),
    /// Valid so far but unfinished (or empty).
    Incomplete,
    Invalid,
}

fn json_prefix(text: &str) -> Json {
    let mut values = Deserializer::from_str(text).into_iter::<Value>();
    match values.next() {
        Some(Ok(value)) => Json::Value(value, values.byte_offset()),
        Some(Err(e)) if e.is_eof() => Json::Incomplete,
        None => Json::Incomplete,
        Some(Err(_)) => Json::Invalid,
    }
}

/// The `(name, compact arguments)` calls in a call object or a non-empty list of them.
fn calls_in(value: Value) -> Option<Vec<(String, String)>> {
    match value {
        Value::Array(items) if !items.is_empty() => items.into_iter().map(call_in).collect(),
        Value::Array(_) => None,
        call => call_in(call).map(|call| vec![call]),
    }
}

fn call_in(value: Value) -> Option<(String, String)> {
    let Value::Object(mut call) = value else {
        return None;
    };
    let Some(Value::String(name)) = call.remove("name") else {
        return None;
    };
    let arguments = match call
        .remove("arguments")
        .or_else(|| call.remove("parameters"))?
    {
        Value::String(text) => serde_json::from_str(&text).ok()?,
        arguments => arguments,
    };
    (!name.is_empty() && arguments.is_object()).then(|| (name, arguments.to_string()))
}

/// `call_` and 24 alphanumerics derived from the call's position and content.
fn call_id(index: usize, name: &str, arguments: &str) -> String {
    const ALPHANUMERIC: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut id = String::from("call_");
    for round in 0..3u8 {
        let mut hasher = DefaultHasher::new();
        (round, index, name, arguments).hash(&mut hasher);
        let mut bits = hasher.finish();
        for _ in 0..8 {
            id.push(ALPHANUMERIC[(bits % 62) as usize] as char);
            bits /= 62;
        }
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The outputs for `deltas`, adjacent text merged.
    fn parse<'a>(deltas: impl IntoIterator<Item = &'a str>) -> Vec<ToolOutput> {
        let mut parser = ToolCallParser::new();
        let mut outputs: Vec<ToolOutput> = deltas
            .into_iter()
            .flat_map(|delta| parser.push(delta))
            .collect();
        outputs.extend(parser.finish());
        let mut merged: Vec<ToolOutput> = Vec::new();
        for output in outputs {
            match (merged.last_mut(), output) {
                (Some(ToolOutput::Text(last)), ToolOutput::Text(text)) => last.push_str(&text),
                (_, output) => merged.push(output),
            }
        }
        merged
    }

    fn calls(outputs: &[ToolOutput]) -> Vec<(&str, &str)> {
        outputs
            .iter()
            .filter_map(|o| match o {
                ToolOutput::Call(c) => Some((c.name.as_str(), c.arguments.as_str())),
                ToolOutput::Text(_) => None,
            })
            .collect()
    }

    fn text(outputs: &[ToolOutput]) -> String {
        outputs
            .iter()
            .filter_map(|o| match o {
                ToolOutput::Text(t) => Some(t.as_str()),
                ToolOutput::Call(_) => None,
            })
            .collect()
    }

    const SAMPLES: &[&str] = &[
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        "Let me check.\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\n",
        "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {\"y\": [2]}}]",
        "[{\"name\": \"a\", \"arguments\": {\"x\": 1}}]",
        "  <|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"rust\"}}",
        "{\"name\": \"Bob\", \"age\": 3}",
        "[1] is a citation, {\"name\": \"f\", \"arguments\": {}} is not a call here",
        "a < b and [TOOL] and <tool_ too, é😀",
        "<tool_call>{not json}</tool_call> done",
        "ok <tool_call>\n{\"name\": \"f\", \"arguments\": {\"unterminated\": true}}",
        "[TOOL_CALLS] not json",
        "  \n",
    ];

    #[test]
    fn hermes_calls_with_text_before_them() {
        let out = parse([SAMPLES[0]]);
        assert_eq!(calls(&out), [("get_weather", r#"{"city":"Paris"}"#)]);
        assert_eq!(text(&out), "");
        let out = parse([SAMPLES[1]]);
        assert_eq!(calls(&out), [("a", r#"{"x":1}"#), ("b", "{}")]);
        assert!(matches!(&out[0], ToolOutput::Text(t) if t == "Let me check."));
        assert_eq!(out.len(), 3);
    }

    #[test]
    fn mistral_lists_with_or_without_their_marker() {
        let out = parse([SAMPLES[2]]);
        assert_eq!(calls(&out), [("a", r#"{"x":1}"#), ("b", r#"{"y":[2]}"#)]);
        assert_eq!(text(&out), "");
        assert_eq!(calls(&parse([SAMPLES[3]])), [("a", r#"{"x":1}"#)]);
        assert_eq!(parse([SAMPLES[10]]), [ToolOutput::Text(SAMPLES[10].into())]);
    }

    #[test]
    fn llama_json_replies_only_at_the_start() {
        let out = parse([SAMPLES[4]]);
        assert_eq!(calls(&out), [("search", r#"{"q":"rust"}"#)]);
        assert_eq!(text(&out), "");
        // JSON that is no call, or a call not at the start, is text.
        for sample in [SAMPLES[5], SAMPLES[6]] {
            assert_eq!(parse([sample]), [ToolOutput::Text(sample.into())]);
        }
    }

    #[test]
    fn bad_or_unfinished_calls_stay_text() {
        assert_eq!(parse([SAMPLES[8]]), [ToolOutput::Text(SAMPLES[8].into())]);
        assert_eq!(parse([SAMPLES[9]]), [ToolOutput::Text(SAMPLES[9].into())]);
    }

    #[test]
    fn partial_markers_are_released_once_they_cannot_be_one() {
        let mut parser = ToolCallParser::new();
        assert_eq!(parser.push("a <"), [ToolOutput::Text("a".into())]);
        assert_eq!(parser.push(" b <tool_"), [ToolOutput::Text(" < b".into())]);
        assert_eq!(parser.push("x"), [ToolOutput::Text(" <tool_x".into())]);
        assert_eq!(parser.finish(), []);
    }

    #[test]
    fn any_split_gives_the_same_result() {
        for sample in SAMPLES {
            let whole = parse([*sample]);
            let chars: Vec<String> = sample.chars().map(String::from).collect();
            assert_eq!(parse(chars.iter().map(String::as_str)), whole, "{sample:?}");
            for cut in (1..sample.len()).filter(|&i| sample.is_char_boundary(i)) {
                assert_eq!(
                    parse([&sample[..cut], &sample[cut..]]),
                    whole,
                    "{sample:?} at {cut}"
                );
            }
        }
    }

    #[test]
    fn arguments_are_canonical_and_ids_unique() {
        let reply = "<tool_call>{\"name\": \"f\", \"arguments\": {\n  \"a\" : [1, 2],\n  \"b\": \"é\"\n}}</tool_call><tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": [1, 2], \\\"b\\\": \\\"é\\\"}\"}</tool_call>";
        let out = parse([reply]);
        assert_eq!(calls(&out), [("f", r#"{"a":[1,2],"b":"é"}"#); 2]);
        let ids: Vec<&str> = out
            .iter()
            .filter_map(|o| match o {
                ToolOutput::Call(c) => Some(c.id.as_str()),
                ToolOutput::Text(_) => None,
            })
            .collect();
        assert_ne!(ids[0], ids[1]);
        for id in ids {
            let suffix = id.strip_prefix("call_").unwrap();
            assert_eq!(suffix.len(), 24);
            assert!(suffix.chars().all(|c| c.is_ascii_alphanumeric()));
        }
    }
}
