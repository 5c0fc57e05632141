//! The OpenAI wire format: request bodies, their checks, and the error body.

use serde::Deserialize;
use serde_json::{Value, json};

/// An error as OpenAI sends it: an HTTP status and `{"error": {"message", "type", "param",
/// "code"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
}

impl ApiError {
    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        ApiError { status: 400, message: message.into(), kind: "invalid_request_error", param }
    }

    pub fn server(message: impl Into<String>) -> Self {
        ApiError { status: 500, message: message.into(), kind: "server_error", param: None }
    }

    pub fn body(&self) -> Value {
        let code = match self.status {
            400 => Some("invalid_request"),
            404 => Some("not_found"),
            429 => Some("rate_limit_exceeded"),
            _ => None,
        };
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": code}})
    }
}

/// `stop`: one string or up to four.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The sampling, length, streaming and KV fields both endpoints share.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Common {
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<u64>,
    /// kvslice's extensions: an eviction policy with its options (`snapkv:window=32`, or
    /// `none` for the full cache) and a budget (`10%`, `128L`, `2048`), as on the command line.
    pub kv_policy: Option<String>,
    pub kv_budget: Option<String>,
}

/// A message's content: a string, or OpenAI's list of parts (text parts only).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    #[serde(flatten)]
    pub common: Common,
}

/// `/v1/completions`' prompt: a string, a list of one string, or token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    #[serde(flatten)]
    pub common: Common,
}

/// A request's generation settings, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub max_tokens: Option<usize>,
    pub temperature: f32,
    pub top_p: f32,
    pub seed: u64,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// `None`: the server's default; `Some(None)`: the full cache; `Some(Some((policy, budget)))`.
    pub kv: Option<Option<(String, String)>>,
}

/// Parses a JSON body into `T`, with the parser's message as a 400.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() { "the body is not valid JSON" } else { "invalid request" };
        ApiError::invalid(format!("{what}: {e}"), None)
    })
}

impl Common {
    /// The checked settings; `default_kv` is the server's `--policy`/`--budget`.
    pub fn settings(&self) -> Result<Settings, ApiError> {
        if let Some(n) = self.n
            && n != 1
        {
            return Err(ApiError::invalid(format!("n = {n}: only one choice per request is supported"), Some("n")));
        }
        let max_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) | (None, Some(m)) => {
                Some(usize::try_from(m).map_err(|_| ApiError::invalid("max_tokens is too large", Some("max_tokens")))?)
            }
            (None, None) => None,
        };
        // OpenAI's defaults: temperature 1, top_p 1
        let temperature = self.temperature.unwrap_or(1.0);
        if !(temperature.is_finite() && (0.0..=2.0).contains(&temperature)) {
            return Err(ApiError::invalid(format!("temperature {temperature} is outside [0, 2]"), Some("temperature")));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid(format!("top_p {top_p} is outside (0, 1]"), Some("top_p")));
        }
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > 4 {
            return Err(ApiError::invalid(format!("{} stop sequences: at most 4", stop.len()), Some("stop")));
        }
        let seed = match self.seed {
            Some(s) => s as u64,
            // OpenAI samples differently each time when no seed is given
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
        };
        let kv = match (self.kv_policy.as_deref(), self.kv_budget.as_deref()) {
            (None, None) => None,
            (Some("none" | "full"), None) => Some(None),
            (Some(p), Some(b)) => Some(Some((p.to_string(), b.to_string()))),
            (Some(p), None) => {
                return Err(ApiError::invalid(format!("kv_policy `{p}` needs a kv_budget"), Some("kv_budget")));
            }
            (None, Some(b)) => {
                return Err(ApiError::invalid(format!("kv_budget `{b}` needs a kv_policy"), Some("kv_policy")));
            }
        };
        Ok(Settings {
            max_tokens,
            temperature,
            top_p,
            seed,
            stop,
            stream: self.stream.unwrap_or(false),
            include_usage: self.stream_options.as_ref().is_some_and(|o| o.include_usage),
            kv,
        })
    }
}

impl Message {
    /// The message's text (text parts joined).
    pub fn text(&self) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(Content::Text(t)) => Ok(t.clone()),
            Some(Content::Parts(parts)) => {
                let mut out = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => out.push_str(t),
                        (kind, _) => {
                            return Err(ApiError::invalid(
                                format!("content part of type `{kind}`: only text is supported"),
                                Some("messages"),
                            ));
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_openai() {
        let r: ChatRequest = parse(br#"{"model":"x","messages":[{"role":"user","content":"hi"}],"seed":-1}"#).unwrap();
        let s = r.common.settings().unwrap();
        assert_eq!((s.temperature, s.top_p, s.max_tokens, s.stream, s.kv.clone()), (1.0, 1.0, None, false, None));
        assert_eq!(s.seed, u64::MAX);
        let r: ChatRequest = parse(
            br#"{"messages":[],"max_completion_tokens":5,"max_tokens":9,"stop":"x","kv_policy":"snapkv","kv_budget":"10%"}"#,
        )
        .unwrap();
        let s = r.common.settings().unwrap();
        assert_eq!(s.max_tokens, Some(5));
        assert_eq!(s.stop, vec!["x".to_string()]);
        assert_eq!(s.kv, Some(Some(("snapkv".into(), "10%".into()))));
    }

    #[test]
    fn bad_fields_are_400_with_the_parameter() {
        let bad = |body: &str| {
            let r: ChatRequest = parse(body.as_bytes()).unwrap();
            r.common.settings().unwrap_err()
        };
        assert_eq!(bad(r#"{"messages":[],"n":2}"#).param, Some("n"));
        assert_eq!(bad(r#"{"messages":[],"temperature":3}"#).param, Some("temperature"));
        assert_eq!(bad(r#"{"messages":[],"top_p":0}"#).param, Some("top_p"));
        assert_eq!(bad(r#"{"messages":[],"stop":["a","b","c","d","e"]}"#).param, Some("stop"));
        assert_eq!(bad(r#"{"messages":[],"kv_policy":"snapkv"}"#).param, Some("kv_budget"));
        assert_eq!(bad(r#"{"messages":[],"kv_budget":"10%"}"#).param, Some("kv_policy"));
        let e = parse::<ChatRequest>(b"{not json").unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.starts_with("the body is not valid JSON"), "{}", e.message);
        let e = parse::<ChatRequest>(br#"{"messages":"hi"}"#).unwrap_err();
        assert!(e.message.starts_with("invalid request"), "{}", e.message);
        assert_eq!(e.body()["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn content_parts_join_and_other_parts_are_refused() {
        let m: Message = serde_json::from_str(
            r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}"#,
        )
        .unwrap();
        assert_eq!(m.text().unwrap(), "ab");
        let m: Message = serde_json::from_str(r#"{"role":"user","content":[{"type":"image_url"}]}"#).unwrap();
        assert_eq!(m.text().unwrap_err().status, 400);
    }
}
