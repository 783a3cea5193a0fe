//! Why a reply ended, as every protocol reports it.

/// Why a reply ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// One of the request's stop strings (this index in its list) matched.
    StopString(usize),
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop | FinishReason::StopString(_) => "stop",
            FinishReason::Length => "length",
        }
    }
}
