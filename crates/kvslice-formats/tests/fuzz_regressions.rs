//! Inputs the fuzzers (crates/kvslice-fuzz) found crashing the parsers: each must now be an
//! ordinary error.

use kvslice_formats::{FormatError, HfTokenizerFiles, Tokenizer};

fn from_hf(json: &[u8]) -> kvslice_formats::Result<Tokenizer> {
    Tokenizer::from_hf(HfTokenizerFiles {
        tokenizer_json: json,
        tokenizer_config_json: None,
        chat_template_jinja: None,
    })
}

/// `tokenizers` panics (`expect("Helper")`) where the `decoder` value is not valid JSON
/// instead of returning its error.
#[test]
fn malformed_json_in_the_decoder_is_an_error() {
    for json in [
        &br#"{"decoder":x}"#[..],
        br#"{"decoder":{"type":"ByteLevel",}}"#,
        b"{\"decoder\":\"\x01\"}",
        br#"{"decoder":["#,
        // Valid syntax, but invalid UTF-8 and a lone surrogate in a string.
        b"{\"decoder\":{\"type\":\"\xe7(\"}}",
        br#"{"decoder":{"type":"\ud800"}}"#,
    ] {
        match from_hf(json) {
            Err(FormatError::Tokenizer { .. }) => {}
            other => panic!("{}: {other:?}", String::from_utf8_lossy(json)),
        }
    }
}
