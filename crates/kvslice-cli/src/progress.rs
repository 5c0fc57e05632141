//! A progress line over long prefills on a terminal: tokens done, tok/s, time left. Nothing
//! when stderr is not a terminal (logs and pipes stay as they were).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use kvslice_runtime::progress::{self, LayerDone};

/// Prompts shorter than this prefill too fast to need a line.
const MIN_TOKENS: usize = 1024;
/// The line is redrawn at most this often.
const REDRAW: Duration = Duration::from_millis(250);

/// Shows the progress of prefilling `total` tokens until the returned guard drops (which
/// clears the line). `None` when stderr is not a terminal or the prompt is short.
pub fn prefill(label: &str, total: usize) -> Option<Bar> {
    if total < MIN_TOKENS || !std::io::stderr().is_terminal() {
        return None;
    }
    let label = label.to_string();
    let start = Instant::now();
    let mut drawn: Option<Instant> = None;
    // tokens of the forwards finished before the current one
    let mut base = 0usize;
    let guard = progress::observe(move |step: LayerDone| {
        let done = (base + step.tokens * (step.layer + 1) / step.layers.max(1)).min(total);
        if step.layer + 1 == step.layers {
            base += step.tokens;
        }
        if drawn.is_some_and(|t| t.elapsed() < REDRAW) && done < total {
            return;
        }
        drawn = Some(Instant::now());
        eprint!("\r\x1b[2K{}", line(&label, done, total, start.elapsed().as_secs_f64()));
        let _ = std::io::stderr().flush();
    });
    Some(Bar { _guard: guard })
}

/// The text of the line: `label  3,072/7,936 tokens  130 tok/s  ETA 37 s`.
fn line(label: &str, done: usize, total: usize, seconds: f64) -> String {
    let rate = if seconds > 0.0 { done as f64 / seconds } else { 0.0 };
    let eta =
        if rate > 0.0 && done < total { format!("  ETA {:.0} s", (total - done) as f64 / rate) } else { String::new() };
    format!("{label}  {}/{} tokens  {rate:.0} tok/s{eta}", thousands(done), thousands(total))
}

fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Clears the progress line when dropped.
pub struct Bar {
    _guard: progress::Guard,
}

impl Drop for Bar {
    fn drop(&mut self) {
        eprint!("\r\x1b[2K");
        let _ = std::io::stderr().flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_counts_tokens_rate_and_time_left() {
        assert_eq!(line("prefill", 3072, 7936, 24.0), "prefill  3,072/7,936 tokens  128 tok/s  ETA 38 s");
        assert_eq!(line("prefill", 7936, 7936, 62.0), "prefill  7,936/7,936 tokens  128 tok/s");
        assert_eq!(line("x", 0, 1_000_000, 0.0), "x  0/1,000,000 tokens  0 tok/s");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
    }
}
