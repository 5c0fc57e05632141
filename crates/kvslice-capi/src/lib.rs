//! kvslice's C ABI (`include/kvslice.h`, generated from this file by cbindgen).
//!
//! - **Handles** (`KvsliceModel *`, `KvsliceSession *`) are opaque numbers, not addresses: the
//!   library looks each one up in its registry and never dereferences it, so a null, freed or
//!   made-up handle is answered `KVSLICE_STATUS_INVALID_HANDLE` instead of corrupting memory.
//! - **Errors** are status codes; the message of the last failure on the calling thread is
//!   `kvslice_last_error()`. No panic crosses the boundary (`KVSLICE_STATUS_PANIC`).
//! - **Sessions** are conversations: each `kvslice_session_generate` continues the same KV
//!   cache (compressed by the session's policy after its first prompt), feeding only the new
//!   turn. A session is used by one thread at a time (`KVSLICE_STATUS_BUSY` otherwise);
//!   different sessions may run on different threads.
//! - A model is freed once no session uses it (`KVSLICE_STATUS_BUSY` before).
#![allow(unsafe_code)] // the C boundary: C strings, out-pointers and `no_mangle` exports

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use kvslice_runtime::{
    ChatMessage, Compression, DeviceChoice, GenerateOptions, Generator, LoadedModel, RuntimeError, Sampler, Session,
    init_device, reusable_prefix,
};

/// What every function returns.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvsliceStatus {
    Ok = 0,
    /// A pointer argument that must not be null was null.
    NullArgument = 1,
    /// A handle that is not a live model or session of this library.
    InvalidHandle = 2,
    /// An argument that makes no sense: a string that is not UTF-8, an unknown policy or
    /// budget syntax, an unknown device, a temperature out of range.
    InvalidArgument = 3,
    /// The model file is missing, corrupt or unsupported.
    Model = 4,
    /// The prompt and the new tokens do not fit the model's context.
    Context = 5,
    /// The device failed, was lost or is too small.
    Device = 6,
    /// Any other failure while generating.
    Runtime = 7,
    /// The model still has sessions, or the session is generating on another thread.
    Busy = 8,
    /// A bug inside the library (a panic, caught at the boundary).
    Panic = 9,
}

/// A model loaded on a device. Opaque.
pub struct KvsliceModel {
    _opaque: [u8; 0],
}

/// A conversation over one model: its KV cache, kept between calls. Opaque.
pub struct KvsliceSession {
    _opaque: [u8; 0],
}

/// Settings of one `kvslice_session_generate` call; start from
/// `kvslice_generate_options_default()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KvsliceGenerateOptions {
    /// Tokens to generate at most (the reply stops earlier at an end-of-sequence token).
    pub max_new_tokens: u32,
    /// 0 = greedy.
    pub temperature: f32,
    /// Nucleus sampling: (0, 1].
    pub top_p: f32,
    pub seed: u64,
    /// Treat the prompt as a user message of the model's chat template (the session keeps the
    /// conversation's messages) instead of raw text appended to the session's tokens.
    pub chat: bool,
}

/// Called with each generated piece of text (`text`, `len` bytes, NUL-terminated, valid during
/// the call) and its token id; return `false` to stop the generation there.
pub type KvsliceTokenCallback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, token: u32, text: *const c_char, len: usize) -> bool>;

struct ModelEntry {
    loaded: LoadedModel,
}

/// A session's state. `session` borrows the model that `SessionEntry::model` keeps alive.
struct SessionState {
    session: Option<Session<'static>>,
    compression: Option<Compression>,
    /// The chat so far (chat mode).
    messages: Vec<ChatMessage>,
}

struct SessionEntry {
    // Field order is drop order: the state (and the session borrowing the model) goes first.
    state: Mutex<SessionState>,
    model: Arc<ModelEntry>,
    model_handle: usize,
}

#[derive(Default)]
struct Registry {
    models: HashMap<usize, Arc<ModelEntry>>,
    sessions: HashMap<usize, Arc<SessionEntry>>,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);
/// Handles are numbers from here on, spaced so a stray small integer or an address is not one.
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(0x4b56_0010);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    // a panic while the lock was held left nothing half-written that matters: go on
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

struct Failure(KvsliceStatus, String);

type Outcome = Result<(), Failure>;

fn fail<T>(status: KvsliceStatus, message: impl Into<String>) -> Result<T, Failure> {
    Err(Failure(status, message.into()))
}

impl From<RuntimeError> for Failure {
    fn from(e: RuntimeError) -> Self {
        let status = match &e {
            RuntimeError::ContextOverflow { .. } => KvsliceStatus::Context,
            RuntimeError::Options(_) => KvsliceStatus::InvalidArgument,
            RuntimeError::Model(_) | RuntimeError::Format(_) => KvsliceStatus::Model,
            RuntimeError::Device(_) | RuntimeError::DeviceLimit { .. } | RuntimeError::Readback(_) => {
                KvsliceStatus::Device
            }
            _ => KvsliceStatus::Runtime,
        };
        Failure(status, e.to_string())
    }
}

/// Runs `f`, records its error message, and turns a panic into `KVSLICE_STATUS_PANIC`.
fn guard(f: impl FnOnce() -> Outcome) -> KvsliceStatus {
    let (status, message) = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => (KvsliceStatus::Ok, String::new()),
        Ok(Err(Failure(status, message))) => (status, message),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            (KvsliceStatus::Panic, format!("internal error: {what}"))
        }
    };
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = message);
    status
}

/// A C string argument as UTF-8; `None` for null.
///
/// SAFETY (of the callers): a non-null `s` points to a NUL-terminated string that stays valid
/// during the call, as the header documents.
unsafe fn text_arg<'a>(s: *const c_char, what: &str) -> Result<Option<&'a str>, Failure> {
    if s.is_null() {
        return Ok(None);
    }
    let c = unsafe { CStr::from_ptr(s) };
    match c.to_str() {
        Ok(t) => Ok(Some(t)),
        Err(_) => fail(KvsliceStatus::InvalidArgument, format!("{what} is not valid UTF-8")),
    }
}

fn new_handle() -> usize {
    NEXT_HANDLE.fetch_add(0x10, Ordering::Relaxed)
}

/// The message of the last failure on this thread (empty after a success). Valid until the
/// next kvslice call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn kvslice_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The library's version, e.g. "0.1.0". Static.
#[unsafe(no_mangle)]
pub extern "C" fn kvslice_version() -> *const c_char {
    static VERSION: LazyLock<CString> = LazyLock::new(|| CString::new(env!("CARGO_PKG_VERSION")).unwrap_or_default());
    VERSION.as_ptr()
}

/// Greedy, 128 new tokens, raw text.
#[unsafe(no_mangle)]
pub extern "C" fn kvslice_generate_options_default() -> KvsliceGenerateOptions {
    KvsliceGenerateOptions { max_new_tokens: 128, temperature: 0.0, top_p: 1.0, seed: 0, chat: false }
}

/// Opens `path` (a `.gguf` file or an HF model folder) on `device` (`"cpu"`, `"wgpu"`,
/// `"wgpu:vulkan"`, ..., `"auto"`; null = `"auto"`) and writes its handle to `*out`.
///
/// # Safety
/// `path` and `device` are null or NUL-terminated strings; `out` is null or points to writable
/// memory for one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvslice_model_open(
    path: *const c_char,
    device: *const c_char,
    out: *mut *mut KvsliceModel,
) -> KvsliceStatus {
    guard(|| {
        if out.is_null() {
            return fail(KvsliceStatus::NullArgument, "out is null");
        }
        let Some(path) = (unsafe { text_arg(path, "path") })? else {
            return fail(KvsliceStatus::NullArgument, "path is null");
        };
        let device = (unsafe { text_arg(device, "device") })?.unwrap_or("auto");
        let choice: DeviceChoice =
            device.parse().map_err(|e: RuntimeError| Failure(KvsliceStatus::InvalidArgument, e.to_string()))?;
        let (device, _) = pollster::block_on(init_device(choice))?;
        let loaded = LoadedModel::open(std::path::Path::new(path), &device)?;
        let handle = new_handle();
        registry().models.insert(handle, Arc::new(ModelEntry { loaded }));
        unsafe { *out = handle as *mut KvsliceModel };
        Ok(())
    })
}

/// Frees a model. `KVSLICE_STATUS_BUSY` while sessions of it remain (free them first).
#[unsafe(no_mangle)]
pub extern "C" fn kvslice_model_free(model: *mut KvsliceModel) -> KvsliceStatus {
    guard(|| {
        let handle = model as usize;
        let mut r = registry();
        if !r.models.contains_key(&handle) {
            return fail(KvsliceStatus::InvalidHandle, format!("{handle:#x} is not a model handle"));
        }
        let users = r.sessions.values().filter(|s| s.model_handle == handle).count();
        if users > 0 {
            return fail(KvsliceStatus::Busy, format!("the model still has {users} session(s): free them first"));
        }
        r.models.remove(&handle);
        Ok(())
    })
}

/// A new session over `model`. `policy` and `budget` (both null for the full cache) name the
/// eviction policy with its options and the KV budget as on the command line
/// (`"snapkv:window=32"`, `"10%"` / `"128L"` / `"2048"`).
///
/// # Safety
/// `policy` and `budget` are null or NUL-terminated strings; `out` is null or points to
/// writable memory for one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvslice_session_new(
    model: *mut KvsliceModel,
    policy: *const c_char,
    budget: *const c_char,
    out: *mut *mut KvsliceSession,
) -> KvsliceStatus {
    guard(|| {
        if out.is_null() {
            return fail(KvsliceStatus::NullArgument, "out is null");
        }
        let handle = model as usize;
        let Some(entry) = registry().models.get(&handle).cloned() else {
            return fail(KvsliceStatus::InvalidHandle, format!("{handle:#x} is not a model handle"));
        };
        let policy = unsafe { text_arg(policy, "policy") }?;
        let budget = unsafe { text_arg(budget, "budget") }?;
        let compression = match (policy, budget) {
            (None, None) => None,
            (Some(p), Some(b)) => Some(
                Compression::new(p, b, &Compression::model_info(&entry.loaded.model))
                    .map_err(|e| Failure(KvsliceStatus::InvalidArgument, e.to_string()))?
                    .with_reconstruction(
                        entry
                            .loaded
                            .reconstruction_prompt()
                            .map_err(|e| Failure(KvsliceStatus::Runtime, e.to_string()))?,
                    ),
            ),
            _ => return fail(KvsliceStatus::InvalidArgument, "policy and budget go together (both or neither)"),
        };
        let state = SessionState { session: None, compression, messages: Vec::new() };
        let session = Arc::new(SessionEntry { state: Mutex::new(state), model: entry, model_handle: handle });
        let id = new_handle();
        registry().sessions.insert(id, session);
        unsafe { *out = id as *mut KvsliceSession };
        Ok(())
    })
}

/// Frees a session and its KV cache. `KVSLICE_STATUS_BUSY` while it is generating.
#[unsafe(no_mangle)]
pub extern "C" fn kvslice_session_free(session: *mut KvsliceSession) -> KvsliceStatus {
    guard(|| {
        let handle = session as usize;
        let mut r = registry();
        let Some(entry) = r.sessions.get(&handle) else {
            return fail(KvsliceStatus::InvalidHandle, format!("{handle:#x} is not a session handle"));
        };
        if entry.state.try_lock().is_err() {
            return fail(KvsliceStatus::Busy, "the session is generating");
        }
        r.sessions.remove(&handle);
        Ok(())
    })
}

/// Forgets the conversation (its cache and messages); the policy stays.
#[unsafe(no_mangle)]
pub extern "C" fn kvslice_session_reset(session: *mut KvsliceSession) -> KvsliceStatus {
    guard(|| {
        with_session(session, |state, _| {
            state.session = None;
            state.messages.clear();
            Ok(())
        })
    })
}

/// The KV cache the session holds: entries (one key and one value of one KV head in one
/// layer) and bytes of storage. Either pointer may be null.
///
/// # Safety
/// `entries` and `bytes` are null or point to writable memory for one `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvslice_session_kv(
    session: *mut KvsliceSession,
    entries: *mut u64,
    bytes: *mut u64,
) -> KvsliceStatus {
    guard(|| {
        with_session(session, |state, _| {
            let (e, b) = state
                .session
                .as_ref()
                .map_or((0, 0), |s| (s.cache().occupied_slots() as u64, s.cache().storage_bytes() as u64));
            if !entries.is_null() {
                unsafe { *entries = e };
            }
            if !bytes.is_null() {
                unsafe { *bytes = b };
            }
            Ok(())
        })
    })
}

/// Runs `f` on a live session, refusing one another thread is using.
fn with_session(session: *mut KvsliceSession, f: impl FnOnce(&mut SessionState, &ModelEntry) -> Outcome) -> Outcome {
    let handle = session as usize;
    let Some(entry) = registry().sessions.get(&handle).cloned() else {
        return fail(KvsliceStatus::InvalidHandle, format!("{handle:#x} is not a session handle"));
    };
    let mut state = match entry.state.try_lock() {
        Ok(s) => s,
        Err(std::sync::TryLockError::WouldBlock) => return fail(KvsliceStatus::Busy, "the session is generating"),
        Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
    };
    f(&mut state, &entry.model)
}

/// Continues the session's conversation with `prompt` and generates the reply, calling
/// `callback` (may be null) with each piece of text. The first call prefills the prompt and
/// compresses the cache with the session's policy; later calls feed only the new turn over
/// the kept cache. `options` may be null (the defaults).
///
/// # Safety
/// `prompt` is a NUL-terminated string; `options` is null or points to a
/// `KvsliceGenerateOptions`; `callback`, when not null, is safe to call with `user_data`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvslice_session_generate(
    session: *mut KvsliceSession,
    prompt: *const c_char,
    options: *const KvsliceGenerateOptions,
    callback: KvsliceTokenCallback,
    user_data: *mut c_void,
) -> KvsliceStatus {
    guard(|| {
        let Some(prompt) = (unsafe { text_arg(prompt, "prompt") })? else {
            return fail(KvsliceStatus::NullArgument, "prompt is null");
        };
        let options = if options.is_null() { kvslice_generate_options_default() } else { unsafe { *options } };
        with_session(session, |state, model| {
            let on_token = |token: u32, text: &str| match callback {
                None => true,
                Some(cb) => {
                    let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
                    unsafe { cb(user_data, token, c.as_ptr(), c.as_bytes().len()) }
                }
            };
            generate(state, model, prompt, &options, on_token)
        })
    })
}

/// The generation behind `kvslice_session_generate`, in safe Rust.
fn generate(
    state: &mut SessionState,
    entry: &ModelEntry,
    prompt: &str,
    options: &KvsliceGenerateOptions,
    mut on_token: impl FnMut(u32, &str) -> bool,
) -> Outcome {
    // SAFETY: the session entry that owns `state` also holds the `Arc` of `entry`, and drops
    // `state` (with every session borrowing the model) before it; the model is never moved.
    let loaded: &'static LoadedModel = unsafe { &*(&entry.loaded as *const LoadedModel) };
    let sampler = Sampler::new(options.temperature, options.top_p, options.seed)
        .map_err(|e| Failure(KvsliceStatus::InvalidArgument, e))?;
    let generate_options =
        GenerateOptions { max_new_tokens: options.max_new_tokens as usize, sampler, stop_tokens: loaded.stop_tokens() };
    let held = state.session.take();
    let first = held.is_none();
    // the whole conversation's tokens
    let mut messages = state.messages.clone();
    let ids = if options.chat {
        messages.push(ChatMessage::user(prompt));
        loaded.tokenizer.encode_chat(&messages, true).map_err(RuntimeError::from)?
    } else {
        let mut ids = held.as_ref().and_then(|s| s.history()).map(<[u32]>::to_vec).unwrap_or_default();
        ids.extend(loaded.tokenizer.encode(prompt, first).map_err(RuntimeError::from)?);
        ids
    };
    if ids.is_empty() {
        return fail(KvsliceStatus::InvalidArgument, "the prompt encodes to no tokens");
    }
    let mut generator = match held {
        Some(s) if reusable_prefix(&s, &ids) > 0 => {
            pollster::block_on(Generator::continue_with(s, &ids, generate_options))?.0
        }
        _ => pollster::block_on(Generator::prefill(&loaded.model, &ids, generate_options, state.compression.as_ref()))?,
    }
    .with_tokenizer(&loaded.tokenizer);
    let mut reply = String::new();
    while let Some(token) = pollster::block_on(generator.next())? {
        reply.push_str(&token.text);
        if !token.text.is_empty() && !on_token(token.id, &token.text) {
            generator.stop();
        }
    }
    let rest = generator.rest()?;
    if !rest.is_empty() {
        reply.push_str(&rest);
        on_token(u32::MAX, &rest);
    }
    if options.chat {
        messages.push(ChatMessage::new("assistant", reply));
        state.messages = messages;
    }
    state.session = Some(generator.into_session());
    Ok(())
}
