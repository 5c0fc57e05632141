/* kvslice: LLM inference with adaptive KV-cache eviction. C ABI; generated from crates/kvslice-capi/src/lib.rs. */

#ifndef KVSLICE_H
#define KVSLICE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

// What every function returns.
typedef enum KvsliceStatus {
  KVSLICE_STATUS_OK = 0,
  // A pointer argument that must not be null was null.
  KVSLICE_STATUS_NULL_ARGUMENT = 1,
  // A handle that is not a live model or session of this library.
  KVSLICE_STATUS_INVALID_HANDLE = 2,
  // An argument that makes no sense: a string that is not UTF-8, an unknown policy or
  // budget syntax, an unknown device, a temperature out of range.
  KVSLICE_STATUS_INVALID_ARGUMENT = 3,
  // The model file is missing, corrupt or unsupported.
  KVSLICE_STATUS_MODEL = 4,
  // The prompt and the new tokens do not fit the model's context.
  KVSLICE_STATUS_CONTEXT = 5,
  // The device failed, was lost or is too small.
  KVSLICE_STATUS_DEVICE = 6,
  // Any other failure while generating.
  KVSLICE_STATUS_RUNTIME = 7,
  // The model still has sessions, or the session is generating on another thread.
  KVSLICE_STATUS_BUSY = 8,
  // A bug inside the library (a panic, caught at the boundary).
  KVSLICE_STATUS_PANIC = 9,
} KvsliceStatus;

// A model loaded on a device. Opaque.
typedef struct KvsliceModel KvsliceModel;

// A conversation over one model: its KV cache, kept between calls. Opaque.
typedef struct KvsliceSession KvsliceSession;

// Settings of one `kvslice_session_generate` call; start from
// `kvslice_generate_options_default()`.
typedef struct KvsliceGenerateOptions {
  // Tokens to generate at most (the reply stops earlier at an end-of-sequence token).
  uint32_t max_new_tokens;
  // 0 = greedy.
  float temperature;
  // Nucleus sampling: (0, 1].
  float top_p;
  uint64_t seed;
  // Treat the prompt as a user message of the model's chat template (the session keeps the
  // conversation's messages) instead of raw text appended to the session's tokens.
  bool chat;
} KvsliceGenerateOptions;

// Called with each generated piece of text (`text`, `len` bytes, NUL-terminated, valid during
// the call) and its token id; return `false` to stop the generation there.
typedef bool (*KvsliceTokenCallback)(void *user_data, uint32_t token, const char *text, size_t len);

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// The message of the last failure on this thread (empty after a success). Valid until the
// next kvslice call on this thread.
const char *kvslice_last_error(void);

// The library's version, e.g. "0.1.0". Static.
const char *kvslice_version(void);

// Greedy, 128 new tokens, raw text.
struct KvsliceGenerateOptions kvslice_generate_options_default(void);

// Opens `path` (a `.gguf` file or an HF model folder) on `device` (`"cpu"`, `"wgpu"`,
// `"wgpu:vulkan"`, ..., `"auto"`; null = `"auto"`) and writes its handle to `*out`.
//
// # Safety
// `path` and `device` are null or NUL-terminated strings; `out` is null or points to writable
// memory for one pointer.
enum KvsliceStatus kvslice_model_open(const char *path,
                                      const char *device,
                                      struct KvsliceModel **out);

// Frees a model. `KVSLICE_STATUS_BUSY` while sessions of it remain (free them first).
enum KvsliceStatus kvslice_model_free(struct KvsliceModel *model);

// A new session over `model`. `policy` and `budget` (both null for the full cache) name the
// eviction policy with its options and the KV budget as on the command line
// (`"snapkv:window=32"`, `"10%"` / `"128L"` / `"2048"`).
//
// # Safety
// `policy` and `budget` are null or NUL-terminated strings; `out` is null or points to
// writable memory for one pointer.
enum KvsliceStatus kvslice_session_new(struct KvsliceModel *model,
                                       const char *policy,
                                       const char *budget,
                                       struct KvsliceSession **out);

// Frees a session and its KV cache. `KVSLICE_STATUS_BUSY` while it is generating.
enum KvsliceStatus kvslice_session_free(struct KvsliceSession *session);

// Forgets the conversation (its cache and messages); the policy stays.
enum KvsliceStatus kvslice_session_reset(struct KvsliceSession *session);

// The KV cache the session holds: entries (one key and one value of one KV head in one
// layer) and bytes of storage. Either pointer may be null.
//
// # Safety
// `entries` and `bytes` are null or point to writable memory for one `uint64_t`.
enum KvsliceStatus kvslice_session_kv(struct KvsliceSession *session,
                                      uint64_t *entries,
                                      uint64_t *bytes);

// Continues the session's conversation with `prompt` and generates the reply, calling
// `callback` (may be null) with each piece of text. The first call prefills the prompt and
// compresses the cache with the session's policy; later calls feed only the new turn over
// the kept cache. `options` may be null (the defaults).
//
// # Safety
// `prompt` is a NUL-terminated string; `options` is null or points to a
// `KvsliceGenerateOptions`; `callback`, when not null, is safe to call with `user_data`.
enum KvsliceStatus kvslice_session_generate(struct KvsliceSession *session,
                                            const char *prompt,
                                            const struct KvsliceGenerateOptions *options,
                                            KvsliceTokenCallback callback,
                                            void *user_data);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* KVSLICE_H */
