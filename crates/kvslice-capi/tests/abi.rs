//! The C ABI: the example C program compiled with the system `cc` and run on the default model
//! (its reply checked against transformers' greedy tokens), and every entry point's refusal of
//! null, freed and made-up handles and of bad arguments.
#![allow(unsafe_code)] // calling the exported functions as C would

use std::ffi::{CStr, CString, c_char, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;

use kvslice::*;
use kvslice_runtime::{ChatMessage, DeviceChoice, GenerateOptions, Generator, LoadedModel, init_device};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tiny() -> CString {
    CString::new(repo().join("tests/golden/tiny-gguf/tiny-llama-F32.gguf").to_str().unwrap()).unwrap()
}

fn last_error() -> String {
    unsafe { CStr::from_ptr(kvslice_last_error()) }.to_string_lossy().into_owned()
}

/// The folder holding `libkvslice.so` (the cdylib this test's build produced).
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap().to_path_buf();
    let name = format!("{}kvslice{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    [deps.parent().unwrap().to_path_buf(), deps]
        .into_iter()
        .find(|d| d.join(&name).is_file())
        .unwrap_or_else(|| panic!("{name} not built next to {}", exe.display()))
}

/// examples/c/generate.c, compiled against include/kvslice.h and the cdylib.
fn c_program() -> PathBuf {
    let lib = library_dir();
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kvslice-generate");
    let status = Command::new("cc")
        .arg(repo().join("examples/c/generate.c"))
        .arg("-std=c11")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(repo().join("crates/kvslice-capi/include"))
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lkvslice")
        .arg("-o")
        .arg(&out)
        .status()
        .expect("the system C compiler `cc`");
    assert!(status.success(), "cc failed");
    out
}

#[test]
fn the_c_program_answers_as_transformers_and_keeps_its_cache_between_turns() {
    let model = kvslice_runtime::paths::default_model_path().unwrap();
    assert!(model.is_file(), "{} missing: run `kvslice fetch` (scripts/test.sh does)", model.display());
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("tests/golden/smollm2/greedy.json")).unwrap())
            .unwrap();
    let case = &golden["cases"][0];
    assert_eq!(case["name"], "chat_capital");
    let question = case["messages"][0]["content"].as_str().unwrap();
    // transformers' text up to its first end-of-turn token
    let answer = case["generated_text"].as_str().unwrap().split("<|im_end|>").next().unwrap();
    let follow_up = "And what is the capital of Italy?";

    let program = c_program();
    let out = Command::new(&program).arg(&model).arg(question).env("KVSLICE_FOLLOW_UP", follow_up).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], answer);

    // the second turn over the kept cache: what a fresh prefill of the whole conversation gives
    let (device, _) = pollster::block_on(init_device(DeviceChoice::Cpu)).unwrap();
    let loaded = LoadedModel::open(&model, &device).unwrap();
    let conversation =
        [ChatMessage::user(question), ChatMessage::new("assistant", answer), ChatMessage::user(follow_up)];
    let ids = loaded.tokenizer.encode_chat(&conversation, true).unwrap();
    let options = GenerateOptions::greedy(24, loaded.stop_tokens());
    let mut g = pollster::block_on(Generator::prefill(&loaded.model, &ids, options, None)).unwrap();
    let reply = pollster::block_on(g.run()).unwrap().to_vec();
    let expected = loaded.decode(&reply).unwrap();
    assert_eq!(lines[1], expected.trim_end_matches('\n'));
    assert!(stderr.contains("kv: "), "{stderr}");

    // under a fixed-size policy the cache holds its budget: 30 layers × 3 KV heads × 16
    let out = Command::new(&program).arg(&model).arg(question).arg("streaming-llm").arg("16").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("kv: 1440 entries"), "{stderr}");

    // errors reach C as a status and a message
    let out = Command::new(&program).arg(&model).arg(question).arg("nosuchpolicy").arg("10%").output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("kvslice_session_new failed (status 3)") && stderr.contains("nosuchpolicy"), "{stderr}");
}

unsafe extern "C" fn collect(user: *mut c_void, _token: u32, text: *const c_char, len: usize) -> bool {
    let out = unsafe { &mut *(user as *mut String) };
    let bytes = unsafe { std::slice::from_raw_parts(text as *const u8, len) };
    out.push_str(std::str::from_utf8(bytes).unwrap());
    out.len() < 6 // stop after a few characters
}

#[test]
fn null_freed_and_made_up_handles_are_refused() {
    let bogus = 0xdead_beef_usize as *mut KvsliceModel;
    assert_eq!(kvslice_model_free(std::ptr::null_mut()), KvsliceStatus::InvalidHandle);
    assert_eq!(kvslice_model_free(bogus), KvsliceStatus::InvalidHandle);
    assert!(last_error().contains("not a model handle"), "{}", last_error());
    assert_eq!(kvslice_session_free(0x10 as *mut KvsliceSession), KvsliceStatus::InvalidHandle);
    assert_eq!(kvslice_session_reset(std::ptr::null_mut()), KvsliceStatus::InvalidHandle);
    let mut out = std::ptr::null_mut();
    let prompt = CString::new("hi").unwrap();
    unsafe {
        assert_eq!(kvslice_model_open(std::ptr::null(), std::ptr::null(), &mut out), KvsliceStatus::NullArgument);
        assert_eq!(
            kvslice_model_open(tiny().as_ptr(), std::ptr::null(), std::ptr::null_mut()),
            KvsliceStatus::NullArgument
        );
        let missing = CString::new("/nonexistent/model.gguf").unwrap();
        assert_eq!(kvslice_model_open(missing.as_ptr(), c"cpu".as_ptr(), &mut out), KvsliceStatus::Model);
        assert!(last_error().contains("/nonexistent/model.gguf"), "{}", last_error());
        assert_eq!(kvslice_model_open(tiny().as_ptr(), c"quantum".as_ptr(), &mut out), KvsliceStatus::InvalidArgument);
        let not_utf8 = [0xffu8, 0xfe, 0];
        assert_eq!(
            kvslice_model_open(not_utf8.as_ptr() as *const c_char, c"cpu".as_ptr(), &mut out),
            KvsliceStatus::InvalidArgument
        );
        assert_eq!(
            kvslice_session_generate(
                bogus as *mut KvsliceSession,
                prompt.as_ptr(),
                std::ptr::null(),
                None,
                std::ptr::null_mut()
            ),
            KvsliceStatus::InvalidHandle
        );

        // a real model and session, then freed
        let mut model = std::ptr::null_mut();
        assert_eq!(
            kvslice_model_open(tiny().as_ptr(), c"cpu".as_ptr(), &mut model),
            KvsliceStatus::Ok,
            "{}",
            last_error()
        );
        let mut session = std::ptr::null_mut();
        assert_eq!(
            kvslice_session_new(model, c"snapkv".as_ptr(), std::ptr::null(), &mut session),
            KvsliceStatus::InvalidArgument
        );
        assert_eq!(
            kvslice_session_new(model, c"snapkv".as_ptr(), c"lots".as_ptr(), &mut session),
            KvsliceStatus::InvalidArgument
        );
        assert_eq!(
            kvslice_session_new(bogus, std::ptr::null(), std::ptr::null(), &mut session),
            KvsliceStatus::InvalidHandle
        );
        assert_eq!(kvslice_session_new(model, std::ptr::null(), std::ptr::null(), &mut session), KvsliceStatus::Ok);
        assert_eq!(
            kvslice_session_generate(session, std::ptr::null(), std::ptr::null(), None, std::ptr::null_mut()),
            KvsliceStatus::NullArgument
        );
        let mut options = kvslice_generate_options_default();
        options.temperature = f32::NAN;
        assert_eq!(
            kvslice_session_generate(session, prompt.as_ptr(), &options, None, std::ptr::null_mut()),
            KvsliceStatus::InvalidArgument
        );
        options = kvslice_generate_options_default();
        options.max_new_tokens = 5000;
        assert_eq!(
            kvslice_session_generate(session, prompt.as_ptr(), &options, None, std::ptr::null_mut()),
            KvsliceStatus::Context
        );
        assert!(last_error().contains("context of 512"), "{}", last_error());
        // the callback stops the generation
        let mut text = String::new();
        options.max_new_tokens = 40;
        assert_eq!(
            kvslice_session_generate(
                session,
                prompt.as_ptr(),
                &options,
                Some(collect),
                &mut text as *mut String as *mut c_void
            ),
            KvsliceStatus::Ok,
            "{}",
            last_error()
        );
        assert!(text.len() >= 6, "{text:?}");
        let (mut entries, mut bytes) = (0u64, 0u64);
        assert_eq!(kvslice_session_kv(session, &mut entries, &mut bytes), KvsliceStatus::Ok);
        // 3 layers × 2 KV heads × the tokens fed: the prompt and fewer than the 40 asked
        assert!(entries % 6 == 0 && entries > 0 && entries < 6 * 41, "{entries} entries");
        assert!(bytes > 0);
        assert_eq!(kvslice_model_free(model), KvsliceStatus::Busy);
        assert_eq!(kvslice_session_free(session), KvsliceStatus::Ok);
        assert_eq!(kvslice_session_free(session), KvsliceStatus::InvalidHandle);
        assert_eq!(kvslice_session_kv(session, &mut entries, &mut bytes), KvsliceStatus::InvalidHandle);
        assert_eq!(kvslice_model_free(model), KvsliceStatus::Ok);
        assert_eq!(kvslice_model_free(model), KvsliceStatus::InvalidHandle);
    }
}
