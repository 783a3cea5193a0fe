//! Reply text with stop strings: text is released only once it cannot be the start of a
//! stop string, and a matched stop string ends the reply without being emitted.

pub struct StopMatcher {
    stops: Vec<String>,
    text: String,
    released: usize,
}

pub enum Released {
    /// Text safe to emit now.
    More(String),
    /// A stop string matched: the last text before it, and which one (its index in the
    /// request's stop strings).
    Stopped(String, usize),
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops,
            text: String::new(),
            released: 0,
        }
    }

    pub fn push(&mut self, delta: &str) -> Released {
        // A match can only start where up to (longest stop - 1) bytes were held back.
        let search_from = self.released;
        self.text.push_str(delta);
        let found = self
            .stops
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
            .filter_map(|(index, s)| {
                self.text[search_from..]
                    .find(s.as_str())
                    .map(|i| (search_from + i, index))
            })
            .min();
        if let Some((at, index)) = found {
            let last = self.text[self.released..at].to_string();
            self.released = at;
            return Released::Stopped(last, index);
        }
        let hold = self
            .stops
            .iter()
            .map(|s| {
                (1..s.len())
                    .rev()
                    .find(|&k| s.is_char_boundary(k) && self.text.ends_with(&s[..k]))
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let safe = self.text.len() - hold;
        let out = self.text[self.released..safe].to_string();
        self.released = safe;
        Released::More(out)
    }

    /// Whatever is still held back (the reply ended without a stop string).
    pub fn finish(&mut self) -> String {
        let out = self.text[self.released..].to_string();
        self.released = self.text.len();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            match m.push(p) {
                Released::More(t) => out.push_str(&t),
                Released::Stopped(t, _) => {
                    out.push_str(&t);
                    return (out, true);
                }
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_across_token_boundaries_is_not_emitted() {
        assert_eq!(
            run(&["END"], &["hello E", "N", "D more"]),
            ("hello ".into(), true)
        );
    }

    #[test]
    fn partial_match_that_fails_is_released() {
        assert_eq!(run(&["END"], &["an E", "ND", "X"]), ("an ".into(), true));
        assert_eq!(run(&["END"], &["an E", "Nx"]), ("an ENx".into(), false));
    }

    #[test]
    fn the_earliest_match_names_its_stop_string() {
        let mut m = StopMatcher::new(vec!["".into(), "zz".into(), "b".into(), "a".into()]);
        assert!(matches!(m.push("xab zz"), Released::Stopped(t, 3) if t == "x"));
    }

    #[test]
    fn no_stops_passes_everything() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }
}
