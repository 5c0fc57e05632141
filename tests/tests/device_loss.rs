//! A wgpu device lost under a live session (forced with `wgpu::Device::destroy`, what a driver
//! reset or the browser's GPU process going away does to a device): the next step returns an
//! error instead of hanging or panicking, and the session then refuses further steps. Its own
//! test binary: the loss is process-wide.

use std::sync::mpsc;
use std::time::Duration;

use kvslice_model::load::load_llama;
use kvslice_runtime::{RuntimeError, Sampler, Session};
use kvslice_tests::{tiny_hf_weights, wgpu};

#[test]
fn a_lost_device_is_an_error_not_a_hang_or_a_panic() {
    let device = wgpu();
    let model: &'static _ = Box::leak(Box::new(load_llama(&tiny_hf_weights("llama"), &device).unwrap()));
    let mut session = Session::new(model, 64).unwrap();
    let mut sampler = Sampler::greedy();
    let first = pollster::block_on(session.step(&[1, 17, 42, 99], &mut sampler)).unwrap();
    // Every device this process opened is destroyed, with all of its buffers.
    assert_eq!(kvslice_runtime::device::release_gpu_memory(), 1);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let after = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let next = pollster::block_on(session.step(&[first], &mut sampler));
            let again = pollster::block_on(session.step(&[first], &mut sampler));
            (next.map_err(|e| e.to_string()), again)
        }));
        let _ = tx.send(after.map_err(|_| "the step panicked"));
    });
    let (next, again) = rx.recv_timeout(Duration::from_secs(120)).expect("the step hung").unwrap();
    let err = next.expect_err("a step on a destroyed device succeeded");
    eprintln!("after the loss: {}", err.lines().next().unwrap_or(""));
    assert!(matches!(again, Err(RuntimeError::Unusable(_))), "{again:?}");
}
