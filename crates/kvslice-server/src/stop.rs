//! OpenAI's `stop` sequences over streamed text: text is released only once it cannot be the
//! start of a stop sequence, and a generation that produces one ends before it.

/// Text held back until it is known not to begin a stop sequence.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    found: bool,
}

impl StopMatcher {
    /// `stops`: the sequences (empty ones are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
            found: false,
        }
    }

    /// Adds `text`; returns the text that can be released and whether a stop sequence was
    /// found (the text before it is released, the sequence and anything after it are not).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.found {
            return (String::new(), true);
        }
        self.pending.push_str(text);
        if let Some(at) = self.stops.iter().filter_map(|s| self.pending.find(s.as_str())).min() {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            self.found = true;
            return (out, true);
        }
        // the longest tail of the pending text that some stop sequence starts with stays back
        let keep = self
            .stops
            .iter()
            .flat_map(|s| {
                let p = &self.pending;
                (1..s.len().min(p.len() + 1))
                    .filter(|&n| p.is_char_boundary(p.len() - n) && s.is_char_boundary(n) && p.ends_with(&s[..n]))
                    .max()
            })
            .max()
            .unwrap_or(0);
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    /// Whether a stop sequence was found.
    pub fn found(&self) -> bool {
        self.found
    }

    /// What is still held back, released at the end of a generation that found no stop
    /// sequence.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (t, stop) = m.push(p);
            out.push_str(&t);
            if stop {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn a_stop_sequence_split_across_tokens_is_found_and_cut() {
        assert_eq!(run(&["\n\n"], &["Hello", "\n", "\nWorld"]), ("Hello".into(), true));
        assert_eq!(run(&["END"], &["abc E", "N", "D tail"]), ("abc ".into(), true));
        // the earliest of several wins
        assert_eq!(run(&["b", "a"], &["xxab"]), ("xx".into(), true));
    }

    #[test]
    fn text_that_only_looks_like_a_start_is_released() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("the E"), ("the ".into(), false));
        assert_eq!(m.push("N"), ("".into(), false));
        assert_eq!(m.push("x"), ("ENx".into(), false));
        assert_eq!(run(&["END"], &["an E"]), ("an E".into(), false));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&[""], &["a"]), ("a".into(), false));
    }

    #[test]
    fn multi_byte_text_is_cut_on_character_boundaries() {
        assert_eq!(run(&["é!"], &["café", "!"]), ("caf".into(), true));
        assert_eq!(run(&["éa"], &["xé", "b"]), ("xéb".into(), false));
    }
}
