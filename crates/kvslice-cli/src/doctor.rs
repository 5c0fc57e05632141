//! `kvslice doctor`: every adapter wgpu finds, each opened and checked with the kernel
//! conformance suite (every WGSL kernel against its CPU twin) and with the default model's
//! logits against transformers' (the golden data of `tests/golden/smollm2/logits.json`, made by
//! `scripts/golden/smollm2.py`); Burn's CPU backend gets the logit check too.

use anyhow::Result;
use kvslice_runtime::{AdapterEntry, DeviceChoice, LoadedModel, Session, init_device};
use serde::Serialize;
use serde_json::Value;

/// transformers' f32 logits for the default model, loaded from the same GGUF file.
const GOLDEN: &str = include_str!("../../../tests/golden/smollm2/logits.json");
/// The tolerance of `tests/tests/smollm2.rs`: the top-20 logits within 1e-2 of transformers'
/// and the same top-1 token at every recorded position. Both sides dequantize the same blocks
/// and sum in f32 in different orders: measured at most 1.3e-4 on lavapipe and on llvmpipe's
/// GL, 5.1e-5 on the CPU backend; a wrong kernel is off by whole units.
const LOGIT_TOLERANCE: f32 = 1e-2;
/// Golden prompts up to this length are checked (5 of the 6; the 1,530-token one would take
/// a minute on a software adapter).
const MAX_PROMPT_TOKENS: usize = 128;

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// Print the report as JSON (`{"devices": [...], "model": PATH|null, "passed": bool}`)
    /// instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report {
    /// The default model file the logit check ran, `null` when it is not fetched.
    model: Option<String>,
    devices: Vec<DeviceReport>,
    /// Every device opened and passed every check it ran.
    passed: bool,
}

#[derive(Serialize)]
struct DeviceReport {
    /// What `--device` takes to run on it (`wgpu:vulkan:0`, `cpu`).
    device: String,
    name: String,
    api: String,
    device_type: String,
    driver: String,
    /// Why it could not be opened, when it could not.
    error: Option<String>,
    conformance: Option<Conformance>,
    logits: Option<Logits>,
    passed: bool,
}

#[derive(Serialize)]
struct Conformance {
    cases: usize,
    failed: usize,
    /// `kernel [case]: failure` for each failed case.
    failures: Vec<String>,
}

#[derive(Serialize)]
struct Logits {
    /// Golden prompts run.
    prompts: usize,
    /// Positions compared (each: top-1 and the top-20 logits).
    positions: usize,
    /// Largest |logit − transformers' logit| over the compared logits.
    max_abs_delta: f32,
    tolerance: f32,
    /// The first mismatch, when there is one.
    failure: Option<String>,
}

pub fn run(args: DoctorArgs) -> Result<()> {
    let model = crate::fetch::default_model_path().ok().filter(|p| p.exists());
    let mut devices: Vec<DeviceReport> = Vec::new();
    let mut targets: Vec<(DeviceChoice, Option<AdapterEntry>)> =
        kvslice_runtime::list_adapters().into_iter().map(|a| (a.choice(), Some(a))).collect();
    targets.push((DeviceChoice::Cpu, None));
    for (choice, entry) in targets {
        if !args.json {
            eprintln!("checking {choice} ...");
        }
        devices.push(check(choice, entry.as_ref(), model.as_deref()));
    }
    let passed = devices.iter().all(|d| d.passed);
    let report = Report { model: model.as_ref().map(|p| p.display().to_string()), devices, passed };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    let failed = report.devices.iter().filter(|d| !d.passed).count();
    if failed > 0 {
        anyhow::bail!("{failed} of {} devices failed a check", report.devices.len());
    }
    Ok(())
}

/// Opens `choice` (a listed wgpu adapter, or the CPU backend when `entry` is `None`) and runs
/// the checks that apply to it.
fn check(choice: DeviceChoice, entry: Option<&AdapterEntry>, model: Option<&std::path::Path>) -> DeviceReport {
    let mut report = DeviceReport {
        device: choice.to_string(),
        name: entry.map_or_else(|| "Burn's CPU backend".into(), |e| e.name.clone()),
        api: entry.map_or("cpu", |e| e.api.name()).into(),
        device_type: entry.map_or_else(|| "Cpu".into(), |e| e.device_type.clone()),
        driver: entry.map(|e| e.driver.clone()).unwrap_or_default(),
        error: None,
        conformance: None,
        logits: None,
        passed: false,
    };
    let (device, _) = match pollster::block_on(init_device(choice)) {
        Ok(found) => found,
        Err(e) => {
            report.error = Some(e.to_string());
            return report;
        }
    };
    if entry.is_some() {
        let results = pollster::block_on(kvslice_runtime::conformance::run_all(&device));
        let failures: Vec<String> = results
            .iter()
            .filter_map(|r| r.failure.as_ref().map(|f| format!("{} [{}]: {f}", r.kernel, r.case)))
            .collect();
        report.conformance = Some(Conformance { cases: results.len(), failed: failures.len(), failures });
    }
    if let Some(path) = model {
        report.logits = Some(match LoadedModel::open(path, &device) {
            Ok(loaded) => check_logits(&loaded),
            Err(e) => Logits {
                prompts: 0,
                positions: 0,
                max_abs_delta: 0.0,
                tolerance: LOGIT_TOLERANCE,
                failure: Some(format!("loading {}: {e}", path.display())),
            },
        });
    }
    report.passed = report.conformance.as_ref().is_none_or(|c| c.failed == 0 && c.cases > 0)
        && report.logits.as_ref().is_none_or(|l| l.failure.is_none());
    report
}

/// The golden prompts of up to [`MAX_PROMPT_TOKENS`] tokens through `loaded`, compared with
/// transformers' logits; stops at the first mismatch.
fn check_logits(loaded: &LoadedModel) -> Logits {
    let mut out = Logits { prompts: 0, positions: 0, max_abs_delta: 0.0, tolerance: LOGIT_TOLERANCE, failure: None };
    if let Err(e) = compare(loaded, &mut out) {
        out.failure = Some(e);
    }
    out
}

fn compare(loaded: &LoadedModel, out: &mut Logits) -> std::result::Result<(), String> {
    let golden: Value = serde_json::from_str(GOLDEN).map_err(|e| format!("golden logits: {e}"))?;
    let cases = golden["cases"].as_array().ok_or("golden logits: no cases")?;
    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        let ids = |v: &Value| -> Vec<u32> {
            v.as_array().into_iter().flatten().filter_map(Value::as_u64).map(|x| x as u32).collect()
        };
        let tokens = ids(&case["token_ids"]);
        if tokens.len() > MAX_PROMPT_TOKENS {
            continue;
        }
        let ours = if case["chat_template_applied"].as_bool() == Some(true) {
            loaded.encode_prompt(case["messages"][0]["content"].as_str().unwrap_or_default(), true)
        } else {
            loaded.encode_prompt(case["text"].as_str().unwrap_or_default(), false)
        }
        .map_err(|e| format!("{name}: {e}"))?;
        if ours != tokens {
            return Err(format!("{name}: the tokenizer gives other ids than transformers fed"));
        }
        let positions = case["positions"].as_array().ok_or("golden logits: no positions")?;
        let rows: Vec<usize> = positions.iter().filter_map(|p| p["position"].as_u64()).map(|p| p as usize).collect();
        let mut session = Session::new(&loaded.model, tokens.len()).map_err(|e| format!("{name}: {e}"))?;
        let logits = pollster::block_on(session.logits_at(&tokens, &rows)).map_err(|e| format!("{name}: {e}"))?;
        for (p, row) in positions.iter().zip(&logits) {
            let at = p["position"].as_u64().unwrap_or_default();
            let top = p["top"].as_array().ok_or("golden logits: no top list")?;
            let pair =
                |t: &Value| (t[0].as_u64().unwrap_or(u64::MAX) as usize, t[1].as_f64().unwrap_or(f64::NAN) as f32);
            let (want_top1, _) = top.first().map(pair).ok_or("golden logits: empty top list")?;
            let got_top1 = kvslice_runtime::sampling::argmax(row) as usize;
            if got_top1 != want_top1 {
                return Err(format!("{name} @ {at}: top-1 token {got_top1}, transformers {want_top1}"));
            }
            for (id, want) in top.iter().map(pair) {
                let got = *row.get(id).ok_or_else(|| format!("{name} @ {at}: token {id} past the vocabulary"))?;
                let delta = (got - want).abs();
                if delta.is_nan() || delta >= LOGIT_TOLERANCE {
                    return Err(format!("{name} @ {at}: token {id} logit {got}, transformers {want}"));
                }
                out.max_abs_delta = out.max_abs_delta.max(delta);
            }
            out.positions += 1;
        }
        out.prompts += 1;
    }
    if out.prompts == 0 {
        return Err("no golden prompt was short enough to run".into());
    }
    Ok(())
}

fn print_table(report: &Report) {
    match &report.model {
        Some(m) => println!("logits: {m} against transformers (tests/golden/smollm2/logits.json)"),
        None => println!("logits: not checked, the default model is not fetched (run `kvslice fetch`)"),
    }
    let name_width = report.devices.iter().map(|d| d.name.len()).max().unwrap_or(0).max(7);
    println!(
        "{:<14} {:<name_width$} {:<13} {:<13} {:<34} status",
        "device", "adapter", "type", "conformance", "logits"
    );
    for d in &report.devices {
        let conformance = match (&d.conformance, &d.error) {
            (Some(c), _) => format!("{}/{} passed", c.cases - c.failed, c.cases),
            (None, Some(_)) => "not run".into(),
            (None, None) => "-".into(),
        };
        let logits = match &d.logits {
            Some(l) if l.failure.is_none() => {
                format!("{} prompts, max |Δ| {:.1e}", l.prompts, l.max_abs_delta)
            }
            Some(_) => "FAILED".into(),
            None => "not run".into(),
        };
        let status = if d.passed { "ok" } else { "FAILED" };
        println!(
            "{:<14} {:<name_width$} {:<13} {:<13} {:<34} {status}",
            d.device, d.name, d.device_type, conformance, logits
        );
        if let Some(e) = &d.error {
            println!("    could not open: {e}");
        }
        for f in d.conformance.iter().flat_map(|c| &c.failures) {
            println!("    conformance: {f}");
        }
        if let Some(f) = d.logits.as_ref().and_then(|l| l.failure.as_ref()) {
            println!("    logits: {f}");
        }
    }
}
