//! SmolLM2-135M-Instruct (the default model, Q4_1 GGUF) against HF transformers loading the
//! same file (tests/golden/smollm2, made by scripts/golden/smollm2.py).
//!
//! Tolerance: top-20 logits within 1e-2 of transformers' f32 CPU values at every recorded
//! position, and the same top-1 token.

use burn::tensor::Device;
use kvslice_runtime::{GenerateOptions, Generator, LoadedModel, Session};
use kvslice_tests::{cpu, default_model, golden_json, ids, wgpu};

const LOGIT_TOLERANCE: f32 = 1e-2;

fn load(device: &Device) -> LoadedModel {
    LoadedModel::open(&default_model(), device).expect("default model loads")
}

/// `max_tokens`: longer prompts are left to the other device (the software Vulkan of CI runs
/// the ~1,500-token prefill slowly; the CPU backend covers it).
fn check_logits(device: Device, max_tokens: usize) {
    let loaded = load(&device);
    let golden = golden_json("smollm2/logits.json");
    let mut checked = 0;
    for case in golden["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let tokens = ids(&case["token_ids"]);
        if tokens.len() > max_tokens {
            continue;
        }
        // Our tokenizer gives the ids transformers fed.
        let ours = if case["chat_template_applied"].as_bool().unwrap() {
            let content = case["messages"][0]["content"].as_str().unwrap();
            loaded.encode_prompt(content, true).unwrap()
        } else {
            loaded.encode_prompt(case["text"].as_str().unwrap(), false).unwrap()
        };
        assert_eq!(ours, tokens, "{name}: token ids");

        let positions = case["positions"].as_array().unwrap();
        let rows: Vec<usize> = positions.iter().map(|p| p["position"].as_u64().unwrap() as usize).collect();
        let mut session = Session::new(&loaded.model, tokens.len()).unwrap();
        let logits = pollster::block_on(session.logits_at(&tokens, &rows)).unwrap();
        let mut worst = 0f32;
        for (p, row) in positions.iter().zip(&logits) {
            let top = p["top"].as_array().unwrap();
            let want_top1 = top[0][0].as_u64().unwrap() as u32;
            let got_top1 = kvslice_runtime::sampling::argmax(row);
            assert_eq!(got_top1, want_top1, "{name} @ {}: top-1", p["position"]);
            for pair in top {
                let id = pair[0].as_u64().unwrap() as usize;
                let want = pair[1].as_f64().unwrap() as f32;
                let delta = (row[id] - want).abs();
                worst = worst.max(delta);
                assert!(delta < LOGIT_TOLERANCE, "{name} @ {}: token {id} logit {} vs {want}", p["position"], row[id]);
            }
        }
        eprintln!("{name}: {} tokens, worst |Δlogit| {worst:.2e}", tokens.len());
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} cases checked");
}

#[test]
fn loading_sets_the_launch_shape_of_the_adapter() {
    // A CPU adapter (lavapipe in CI): four rows per invocation of the quantized projections,
    // and the host flushing the queue every four launches. A hardware adapter: one row, and
    // the queue handed over when it fills.
    let device = wgpu();
    let info = kvslice_runtime::device_info(&device).expect("opened by init_device");
    let loaded = load(&device);
    let (rows, flush) = if info.device_type == "Cpu" { (4, 4) } else { (1, 0) };
    assert_eq!(loaded.model.projection_rows(), Some(rows), "{info}");
    assert_eq!(kvslice_kernels::flush_interval(), flush, "{info}");
    assert_eq!(load(&cpu()).model.projection_rows(), None, "the CPU backend dequantizes at load");
}

#[test]
fn logits_match_transformers_on_wgpu() {
    check_logits(wgpu(), 512);
}

#[test]
fn logits_match_transformers_on_cpu() {
    check_logits(cpu(), usize::MAX);
}

fn check_greedy(device: Device, cases: &[&str]) {
    let loaded = load(&device);
    let golden = golden_json("smollm2/greedy.json");
    for case in golden["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        if !cases.is_empty() && !cases.contains(&name) {
            continue;
        }
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["generated_ids"]);
        // No stop token: transformers' reference decodes past EOS for the full count.
        let options = GenerateOptions::greedy(want.len(), vec![]);
        let got = pollster::block_on(async {
            let mut g = Generator::prefill(&loaded.model, &prompt, options, None).await?;
            g.run().await.map(<[u32]>::to_vec)
        })
        .unwrap();
        assert_eq!(
            got,
            want,
            "{name}: greedy tokens\n ours: {:?}\n want: {:?}",
            loaded.decode(&got),
            case["generated_text"]
        );
    }
}

#[test]
fn greedy_generation_matches_transformers_on_wgpu() {
    check_greedy(wgpu(), &["chat_capital"]);
}

#[test]
fn greedy_generation_matches_transformers_on_cpu() {
    check_greedy(cpu(), &[]);
}
