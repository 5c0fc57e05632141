//! Where fetched models live (native targets).

use std::path::PathBuf;

/// File name of the default model, SmolLM2-135M-Instruct quantised to Q4_1.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The cache folder: `$KVSLICE_CACHE_DIR`, else the user cache dir's `kvslice/`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("KVSLICE_CACHE_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    dirs_cache().map(|d| d.join("kvslice"))
}

/// Where the default model lives once fetched.
pub fn default_model_path() -> Option<PathBuf> {
    cache_dir().map(|d| d.join("models").join(DEFAULT_MODEL_FILE))
}

fn dirs_cache() -> Option<PathBuf> {
    // XDG on Linux, the platform's own elsewhere.
    if cfg!(target_os = "macos") {
        return std::env::var_os("HOME").map(|h| PathBuf::from(h).join("Library/Caches"));
    }
    if cfg!(windows) {
        return std::env::var_os("LOCALAPPDATA").map(PathBuf::from);
    }
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
}
