//! Reasoning kept apart from the answer: which chat templates make a model think (a
//! `<think>` … `</think>` block before the answer, as Qwen3, SmolLM3, QwQ and the DeepSeek-R1
//! distills write it), whether a rendered prompt leaves the reply inside that block (templates
//! that open it themselves), and the streaming parser that splits a reply into its thinking
//! and its answer.

/// Opens a thinking block.
pub const THINK_OPEN: &str = "<think>";
/// Closes a thinking block.
pub const THINK_CLOSE: &str = "</think>";

/// What a chat template says about thinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Thinking {
    /// The model writes a thinking block before its answer (the template knows the closing
    /// tag: it strips earlier turns' thinking, or closes an empty block to turn it off).
    pub thinks: bool,
    /// The template reads `enable_thinking`, so a request can turn thinking off (or on).
    pub switchable: bool,
}

impl Thinking {
    /// What the template `source` says.
    pub fn of_template(source: &str) -> Self {
        Thinking {
            thinks: source.contains(THINK_CLOSE),
            switchable: source.contains("enable_thinking"),
        }
    }
}

/// Whether `prompt` (rendered up to where the reply starts) leaves the reply inside a
/// thinking block: it ends with the opening tag, and perhaps whitespace.
pub fn opens_in_thinking(prompt: &str) -> bool {
    prompt.trim_end().ends_with(THINK_OPEN)
}

/// A piece of a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReasoningOutput {
    /// Text of the model's thinking.
    Thinking(String),
    /// Text of its answer.
    Answer(String),
}

/// Where the parser is in the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: a thinking block may still open.
    Start,
    /// Inside the thinking block.
    Thinking,
    /// After the closing tag, before the answer's first non-blank character.
    Closed,
    /// In the answer.
    Answer,
}

/// Splits a reply, fed in deltas, into its thinking and its answer.
///
/// The thinking is a block that opens the reply (`<think>` after nothing but whitespace, or
/// at once when the prompt opened it: [`ReasoningParser::in_thinking`]) and runs to `</think>`
/// or the end of the reply. Blank space around the thinking and between it and the answer
/// is dropped; a `<think>` later in the answer is answer text. Text that might be the start
/// of a tag is held back until it is known, so how the reply is split into deltas never
/// changes the result.
#[derive(Debug, Clone)]
pub struct ReasoningParser {
    /// Received text not yet emitted.
    buf: String,
    state: State,
    /// Whether some thinking text has been emitted.
    shown_thinking: bool,
}

impl ReasoningParser {
    /// A parser at the start of a reply whose prompt did not open a thinking block.
    pub fn new() -> Self {
        ReasoningParser {
            buf: String::new(),
            state: State::Start,
            shown_thinking: false,
        }
    }

    /// A parser at the start of a reply whose prompt opened the thinking block.
    pub fn in_thinking() -> Self {
        ReasoningParser {
            buf: String::new(),
            state: State::Thinking,
            shown_thinking: false,
        }
    }

    /// Whether the reply is inside its thinking now.
    pub fn thinking(&self) -> bool {
        self.state == State::Thinking
    }

    /// Feed the next delta; returns what is certainly thinking or answer.
    pub fn push(&mut self, delta: &str) -> Vec<ReasoningOutput> {
        self.buf.push_str(delta);
        self.drain(false)
    }

    /// End of reply: what was held back (an unclosed block's last text is thinking).
    pub fn finish(&mut self) -> Vec<ReasoningOutput> {
        self.drain(true)
    }

    /// A whole reply at once.
    pub fn parse(mut self, reply: &str) -> Vec<ReasoningOutput> {
        let mut outputs = self.push(reply);
        outputs.extend(self.finish());
        outputs
    }

    fn drain(&mut self, end: bool) -> Vec<ReasoningOutput> {
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let blank = self.buf.len() - self.buf.trim_start().len();
                    let rest = &self.buf[blank..];
                    if rest.starts_with(THINK_OPEN) {
                        self.buf.drain(..blank + THINK_OPEN.len());
                        self.state = State::Thinking;
                    } else if THINK_OPEN.starts_with(rest) && !end {
                        return out;
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Thinking => {
                    let (stop, closed) = match self.buf.find(THINK_CLOSE) {
                        Some(at) => (at, true),
                        None if end => (self.buf.len(), false),
                        None => (self.buf.len() - partial_tag(&self.buf, THINK_CLOSE), false),
                    };
                    let block = &self.buf[..stop];
                    // Blank space opening the block is dropped; blank space that may end it
                    // is held back until text follows.
                    let lead = if self.shown_thinking {
                        0
                    } else {
                        block.len() - block.trim_start().len()
                    };
                    let body_end = block.trim_end().len().max(lead);
                    if body_end > lead {
                        out.push(ReasoningOutput::Thinking(block[lead..body_end].to_string()));
                        self.shown_thinking = true;
                    }
                    if closed {
                        self.buf.drain(..stop + THINK_CLOSE.len());
                        self.state = State::Closed;
                    } else {
                        let held = if end { self.buf.len() } else { body_end };
                        self.buf.drain(..held);
                        return out;
                    }
                }
                State::Closed => {
                    let blank = self.buf.len() - self.buf.trim_start().len();
                    self.buf.drain(..blank);
                    if self.buf.is_empty() {
                        return out;
                    }
                    self.state = State::Answer;
                }
                State::Answer => {
                    if !self.buf.is_empty() {
                        out.push(ReasoningOutput::Answer(std::mem::take(&mut self.buf)));
                    }
                    return out;
                }
            }
        }
    }
}

impl Default for ReasoningParser {
    fn default() -> Self {
        Self::new()
    }
}

/// The length of the longest end of `text` that starts `tag` (and is shorter than it).
fn partial_tag(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&k| text.ends_with(&tag[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ReasoningOutput::{Answer, Thinking as Thought};

    /// The reply split by a parser fed `deltas`, adjacent pieces of a kind merged.
    fn split(mut parser: ReasoningParser, deltas: &[&str]) -> Vec<ReasoningOutput> {
        let mut merged: Vec<ReasoningOutput> = Vec::new();
        let mut outputs: Vec<ReasoningOutput> =
            deltas.iter().flat_map(|d| parser.push(d)).collect();
        outputs.extend(parser.finish());
        for output in outputs {
            match (merged.last_mut(), output) {
                (Some(Thought(a)), Thought(b)) | (Some(Answer(a)), Answer(b)) => a.push_str(&b),
                (_, output) => merged.push(output),
            }
        }
        merged
    }

    /// Every way of cutting `reply` into two or three deltas gives the same split.
    fn same_at_every_cut(parser: fn() -> ReasoningParser, reply: &str) -> Vec<ReasoningOutput> {
        let whole = split(parser(), &[reply]);
        let cuts: Vec<usize> = (0..=reply.len())
            .filter(|&i| reply.is_char_boundary(i))
            .collect();
        for &i in &cuts {
            for &j in cuts.iter().filter(|&&j| j >= i) {
                let pieces = [&reply[..i], &reply[i..j], &reply[j..]];
                assert_eq!(
                    split(parser(), &pieces),
                    whole,
                    "cut at {i}, {j} of {reply:?}"
                );
            }
        }
        whole
    }

    #[test]
    fn a_thinking_block_that_opens_the_reply_is_kept_apart() {
        let reply = "\n<think>\nLet me see: 2 + 2.\n</think>\n\nIt is 4.";
        assert_eq!(
            same_at_every_cut(ReasoningParser::new, reply),
            [
                Thought("Let me see: 2 + 2.".into()),
                Answer("It is 4.".into())
            ]
        );
    }

    #[test]
    fn a_prompt_that_opened_the_block_starts_the_reply_inside_it() {
        let reply = "\nhmm… ünïcode </th not yet\n\n</think>\n\nDone. <think> stays";
        assert_eq!(
            same_at_every_cut(ReasoningParser::in_thinking, reply),
            [
                Thought("hmm… ünïcode </th not yet".into()),
                Answer("Done. <think> stays".into())
            ]
        );
    }

    #[test]
    fn a_reply_without_a_block_is_all_answer() {
        for reply in ["Paris.", "  <thin", "a <think>b</think>", "<", ""] {
            let expected: Vec<ReasoningOutput> = if reply.is_empty() {
                vec![]
            } else {
                vec![Answer(reply.into())]
            };
            assert_eq!(same_at_every_cut(ReasoningParser::new, reply), expected);
        }
    }

    #[test]
    fn an_unclosed_block_is_all_thinking_and_an_empty_one_gives_none() {
        assert_eq!(
            same_at_every_cut(ReasoningParser::new, "<think>still going  </thi"),
            [Thought("still going  </thi".into())]
        );
        assert_eq!(
            same_at_every_cut(ReasoningParser::new, "<think>\n\n</think>\n\nHi"),
            [Answer("Hi".into())]
        );
    }

    #[test]
    fn the_parser_says_when_the_reply_is_thinking() {
        let mut parser = ReasoningParser::new();
        assert!(!parser.thinking());
        parser.push("<think>a");
        assert!(parser.thinking());
        parser.push("</think>b");
        assert!(!parser.thinking());
    }

    #[test]
    fn templates_and_prompts_say_whether_a_model_thinks() {
        let qwen3 = "{% if enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}";
        assert_eq!(
            Thinking::of_template(qwen3),
            Thinking {
                thinks: true,
                switchable: true
            }
        );
        assert_eq!(Thinking::of_template("{{ messages }}"), Thinking::default());
        assert!(opens_in_thinking("<|im_start|>assistant\n<think>\n"));
        assert!(!opens_in_thinking(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        assert!(!opens_in_thinking("<|im_start|>assistant\n"));
    }
}
