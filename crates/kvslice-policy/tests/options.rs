//! Policy specs with options (`name:key=value,…`): parsing, errors, what each option changes,
//! and the decode rule every entry declares.

mod common;

use common::Peers;
use kvslice_policy::alloc::Cake;
use kvslice_policy::{
    BudgetSpec, DecodeRule, DecodeSpec, Ladder, LayerInput, ModelInfo, OptionKind, Plan, Policy, PolicyError,
    PolicySpec, Protect, Refresh, Temporal, WindowStats, build, build_spec, listing_verbose, lookup, registry,
};

const MODEL: ModelInfo = ModelInfo { head_dim: 8, rope_theta: 10_000.0 };

fn spec(s: &str) -> PolicySpec {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// `(option, reason)` of an invalid-option error.
fn invalid(r: Result<Policy, PolicyError>) -> (String, String) {
    match r {
        Err(PolicyError::InvalidOption { option, reason, .. }) => (option, reason),
        other => panic!("{other:?}"),
    }
}

#[test]
fn specs_parse_and_print_canonically() {
    assert_eq!(spec("snapkv"), PolicySpec { name: "snapkv".into(), options: vec![] });
    let s = spec("snapkv:window=32,kernel=7");
    assert_eq!(s, PolicySpec { name: "snapkv".into(), options: pairs(&[("window", "32"), ("kernel", "7")]) });
    assert_eq!(s.to_string(), "snapkv:window=32,kernel=7");
    // spaces go; the order given stays
    assert_eq!(spec(" cake : tau2 = 2 ,gamma=100 ").to_string(), "cake:tau2=2,gamma=100");
    for text in ["tova", "h2o:recent=0.5", "lacache:span=8,overlap=2,sinks=0", "snapkv:pool=max"] {
        assert_eq!(spec(text).to_string(), text);
        assert_eq!(spec(&spec(text).to_string()), spec(text));
    }
}

#[test]
fn malformed_specs_are_errors_that_list_the_options() {
    // unknown or empty names keep the registry's error
    for (text, name) in [("", ""), (":", ""), ("a:=", "a"), ("nope", "nope"), ("snäpkv:window=3", "snäpkv")] {
        match text.parse::<PolicySpec>() {
            Err(PolicyError::UnknownPolicy { name: n, known }) => {
                assert_eq!(n, name);
                assert!(known.contains("snapkv, snapkv-original"), "{known}");
            }
            other => panic!("{text:?}: {other:?}"),
        }
        assert!(matches!(build_spec(text, &MODEL), Err(PolicyError::UnknownPolicy { .. })));
    }
    let snapkv_options =
        "window=64 (1..=4096), kernel=5 (1..=63), pool=avg (avg|max|none), reduce=mean (mean|max), every=0 (0..=65536)";
    for (text, option, reason) in [
        ("snapkv:", "", "expected key=value after ':'"),
        ("snapkv:window=", "window=", "no value after '='"),
        ("snapkv:=5", "=5", "no option name before '='"),
        ("snapkv:window", "window", "expected key=value"),
        ("snapkv:window=32,", "", "empty option (two commas, or a comma at an end)"),
        ("snapkv:window=32,,kernel=5", "", "empty option (two commas, or a comma at an end)"),
        ("snapkv:window=32,window=16", "window=16", "option window is given twice"),
        ("snapkv:window=0", "window=0", "0 lies outside 1..=4096"),
        ("snapkv:window=4097", "window=4097", "4097 lies outside 1..=4096"),
        (
            "snapkv:window=99999999999999999999",
            "window=99999999999999999999",
            "99999999999999999999 lies outside 1..=4096",
        ),
        ("snapkv:window=-3", "window=-3", "-3 lies outside 1..=4096"),
        ("snapkv:window=六十四", "window=六十四", "\"六十四\" is not a whole number"),
        ("snapkv:window=32:kernel=5", "window=32:kernel=5", "\"32:kernel=5\" is not a whole number"),
        ("snapkv:pool=mean", "pool=mean", "\"mean\" is not one of avg|max|none"),
        ("snapkv:every=1.5", "every=1.5", "\"1.5\" is not a whole number"),
    ] {
        let err = build_spec(text, &MODEL).err().unwrap_or_else(|| panic!("{text} built"));
        match &err {
            PolicyError::InvalidOption { policy, option: o, reason: r, options } => {
                assert_eq!((policy.as_str(), o.as_str(), r.as_str()), ("snapkv", option, reason), "{text}");
                assert_eq!(options, snapkv_options);
            }
            other => panic!("{text}: {other:?}"),
        }
        assert!(err.to_string().ends_with(&format!("its options: {snapkv_options}")), "{err}");
    }
    let err = build_spec("snapkv:kernal=5", &MODEL).unwrap_err();
    assert_eq!(
        err,
        PolicyError::UnknownOption { policy: "snapkv".into(), option: "kernal".into(), options: snapkv_options.into() }
    );
    assert_eq!(err.to_string(), format!("unknown option \"kernal\" for snapkv; its options: {snapkv_options}"));
    // values the constructors refuse, inside the declared range
    assert_eq!(
        invalid(build_spec("snapkv:kernel=4", &MODEL)),
        ("kernel=4".into(), "snapkv: parameter kernel_size must be odd and positive, got 4".into())
    );
    assert_eq!(invalid(build_spec("h2o:recent=1", &MODEL)).0, "recent=1");
    assert_eq!(invalid(build_spec("lacache:span=4,overlap=4", &MODEL)).0, "span=4,overlap=4");
    assert_eq!(invalid(build_spec("cake:gamma=1e999", &MODEL)).1, "\"1e999\" is not a finite number");
    assert_eq!(invalid(build_spec("cake:tau1=0", &MODEL)).1, "0 lies outside 0.01..=100");
    assert_eq!(invalid(build_spec("twinkv-span:span=x", &MODEL)).1, "\"x\" is not a whole number");
    // a position rule takes no `every`
    assert!(matches!(build_spec("lacache:every=8", &MODEL), Err(PolicyError::UnknownOption { .. })));
}

#[test]
fn odd_inputs_never_panic() {
    let odd = [
        "",
        ":",
        "::",
        ",",
        "=",
        "a:=",
        ":=",
        "snapkv:=",
        "snapkv:,",
        "snapkv:=,=",
        "snapkv:window==",
        "snapkv:window=32=",
        "snapkv:window=+32",
        "snapkv:window= 32",
        "snapkv:\u{0}=\u{0}",
        "snapkv:window=\u{feff}32",
        "cake:gamma=NaN",
        "cake:gamma=-inf",
        "cake:gamma=-0",
        "cake:gamma=0x10",
        "h2o:recent=.5",
        "h2o:recent=5.",
        "h2o:normalize=1",
        "inertiakv:refresh=18446744073709551616",
        "inertiakv:alpha=0.99999999999",
        "😀",
        "snapkv:😀=😀",
        "\u{301}:a=b",
        "snapkv:window=32,window",
        "lacache:span=1,overlap=0,sinks=4096",
    ];
    for text in odd {
        let _ = text.parse::<PolicySpec>();
        let _ = build_spec(text, &MODEL);
    }
    // the ones that are valid
    for text in ["snapkv:window=+32", "snapkv:window= 32", "cake:gamma=-0", "h2o:recent=.5", "h2o:recent=5."] {
        let r = build_spec(text, &MODEL);
        assert_eq!(r.is_ok(), text != "h2o:recent=5.", "{text}: {r:?}");
    }
}

#[test]
fn every_entry_declares_the_decode_rule_the_runtime_used_by_name() {
    // the runtime's name mapping, at 64 tokens per layer: streaming-llm's 4 sinks, H2O's recent
    // half ⌊0.5·64⌋ = 32, CAKE's window 32 with γ = 200, LaCache's default ladder, InertiaKV's
    // α = 0.8 with its three refresh schedules; every other policy grows.
    let inertia = |refresh| DecodeRule::Inertia(Temporal { alpha: 0.8, refresh });
    let expected: Vec<(&str, DecodeRule)> = vec![
        ("streaming-llm", DecodeRule::Recent { sinks: 4 }),
        ("h2o", DecodeRule::Accumulated { recent: 32 }),
        ("snapkv", DecodeRule::Grow),
        ("snapkv-original", DecodeRule::Grow),
        ("tova", DecodeRule::LastQuery),
        ("knorm", DecodeRule::Grow),
        ("expected-attention", DecodeRule::Grow),
        ("andpro", DecodeRule::Grow),
        ("critical-snapkv", DecodeRule::Grow),
        ("counter-causal", DecodeRule::Grow),
        ("counter-causal-fast", DecodeRule::Grow),
        ("pyramidkv", DecodeRule::Grow),
        ("cake", DecodeRule::Indicator { window: 32, gamma: 200.0 }),
        ("adakv", DecodeRule::Grow),
        ("adakv-kvpress", DecodeRule::Grow),
        ("snapkv-span", DecodeRule::Grow),
        ("adakv-span", DecodeRule::Grow),
        ("twinkv", DecodeRule::Grow),
        ("snapkv-twin", DecodeRule::Grow),
        ("adakv-twin", DecodeRule::Grow),
        ("inertiakv", inertia(Refresh::Every(1))),
        ("inertiakv-lazy", inertia(Refresh::Every(4))),
        ("inertiakv-score-free", inertia(Refresh::Never)),
        ("jacap", DecodeRule::Grow),
        ("jacap-span", DecodeRule::Grow),
        ("twinkv-span", DecodeRule::Grow),
        ("snapkv-span-twin", DecodeRule::Grow),
        ("keydiff", DecodeRule::Grow),
        ("keydiff-block", DecodeRule::Grow),
        ("non-causal-attn", DecodeRule::Grow),
        ("leverage", DecodeRule::Grow),
        ("leverage-span", DecodeRule::Grow),
        ("compactor", DecodeRule::Grow),
        ("compactor-span", DecodeRule::Grow),
        ("simlayerkv", DecodeRule::Grow),
        ("kvzip", DecodeRule::Grow),
        ("finch", DecodeRule::Grow),
        ("random", DecodeRule::Grow),
        ("chunkkv", DecodeRule::Grow),
        ("lagkv", DecodeRule::Grow),
        ("cur", DecodeRule::Grow),
        ("distillcache", DecodeRule::Grow),
        ("distillcache-span", DecodeRule::Grow),
        ("lacache", DecodeRule::Ladder(Ladder::new(16, 0, 4).unwrap())),
    ];
    assert_eq!(registry().iter().map(|e| e.name).collect::<Vec<_>>(), expected.iter().map(|e| e.0).collect::<Vec<_>>());
    for (name, rule) in expected {
        let p = build(name, &MODEL).unwrap();
        assert_eq!(p.decode_rule(64), rule, "{name}");
        assert_eq!(lookup(name).unwrap().build(&MODEL).unwrap().decode_rule(64), rule, "{name}");
        // only CAKE cascades
        assert_eq!(p.cascade(), (name == "cake").then(Cake::default), "{name}");
    }
    // the budget fills in what depends on it: H2O's ⌊0.5·10⌋ = 5; CAKE's window stays 32
    assert_eq!(build("h2o", &MODEL).unwrap().decode_rule(10), DecodeRule::Accumulated { recent: 5 });
    assert_eq!(build("cake", &MODEL).unwrap().decode_spec(), DecodeSpec::Indicator { gamma: 200.0 });
    assert_eq!(build("lacache", &MODEL).unwrap().decode_spec(), DecodeSpec::Ladder(Ladder::default()));
}

#[test]
fn every_default_is_accepted_and_every_bound_is_enforced() {
    for e in registry() {
        let opts = e.options();
        for o in &opts {
            let ok = |v: &str| e.parse_options(&pairs(&[(o.name, v)])).is_ok();
            let given = e.parse_options(&pairs(&[(o.name, o.default)])).unwrap();
            e.build_with(&given, &MODEL).unwrap_or_else(|err| panic!("{} {}: {err}", e.name, o.name));
            match o.kind {
                OptionKind::Int { min, max } => {
                    assert!(ok(&min.to_string()) && ok(&max.to_string()), "{} {}", e.name, o.name);
                    assert!(!ok(&(min - 1).to_string()) && !ok(&(max + 1).to_string()), "{} {}", e.name, o.name);
                }
                OptionKind::Float { min, max } => {
                    assert!(ok(&min.to_string()) && ok(&max.to_string()), "{} {}", e.name, o.name);
                    let (below, above) = (min - 1e-6, max + 1e-6);
                    assert!(below < min && above > max);
                    assert!(
                        !ok(&below.to_string()) && !ok(&above.to_string()),
                        "{} {}: {below} {above}",
                        e.name,
                        o.name
                    );
                }
                OptionKind::Bool => assert!(ok("true") && ok("false") && !ok("TRUE") && !ok("1")),
                OptionKind::Choice(choices) => {
                    for c in choices {
                        let given = e.parse_options(&pairs(&[(o.name, c)])).unwrap();
                        e.build_with(&given, &MODEL).unwrap_or_else(|err| panic!("{} {}={c}: {err}", e.name, o.name));
                    }
                    assert!(!ok("nope") && !ok(""));
                }
                OptionKind::Text => {
                    // a file that is not there, or holds something else, is refused when built
                    for bad in ["/nonexistent/weights.safetensors", "Cargo.toml"] {
                        let given = e.parse_options(&pairs(&[(o.name, bad)])).unwrap();
                        assert!(e.build_with(&given, &MODEL).is_err(), "{} {}={bad}", e.name, o.name);
                    }
                    assert!(!ok("a,b"));
                }
            }
        }
        // the error for an unknown option lists every option with its default and range
        match e.parse_options(&pairs(&[("zz", "1")])) {
            Err(PolicyError::UnknownOption { options, .. }) => {
                let listed: Vec<String> =
                    opts.iter().map(|o| format!("{}={} ({})", o.name, o.default, o.kind.range())).collect();
                assert_eq!(options, listed.join(", "), "{}", e.name);
            }
            other => panic!("{}: {other:?}", e.name),
        }
        // scored policies take `every`, the ladder does not
        assert_eq!(opts.iter().any(|o| o.name == "every"), e.name != "lacache", "{}", e.name);
    }
}

#[test]
fn options_change_the_policy() {
    let p = build("snapkv:window=32", &MODEL).unwrap();
    assert_eq!(p.needs().window, 32);
    assert_eq!(p.protect(100).recent, 32);
    assert_eq!(build("snapkv", &MODEL).unwrap().needs().window, 64);
    assert_eq!(build("andpro:window=8", &MODEL).unwrap().needs().window, 8);
    assert_eq!(build("jacap-span:window=16", &MODEL).unwrap().needs().window, 16);
    // H2O: ⌊0.25·64⌋ = 16 recent
    assert_eq!(build("h2o:recent=0.25", &MODEL).unwrap().decode_rule(64), DecodeRule::Accumulated { recent: 16 });
    assert_eq!(build("h2o:recent=0", &MODEL).unwrap().decode_rule(64), DecodeRule::Accumulated { recent: 0 });
    let s = build("streaming-llm:sinks=2", &MODEL).unwrap();
    assert_eq!((s.decode_rule(64), s.protect(64).sinks), (DecodeRule::Recent { sinks: 2 }, 2));
    assert_eq!(build("counter-causal:sinks=1,window=3", &MODEL).unwrap().protect(9).count(100), 4);
    assert_eq!(build("counter-causal", &MODEL).unwrap().counter_causal_layers(3), vec![0, 1, 2]);
    assert_eq!(build("counter-causal:last_layer=true", &MODEL).unwrap().counter_causal_layers(3), vec![2]);
    assert_eq!(build("expected-attention:sinks=7", &MODEL).unwrap().protect(64).sinks, 7);
    assert!(!build("expected-attention:vnorm=false", &MODEL).unwrap().needs().values);
    // `every` replaces the policy's own decode rule
    let r = build("snapkv:every=8", &MODEL).unwrap();
    assert_eq!(
        (r.decode_spec(), r.decode_rule(64)),
        (DecodeSpec::Recompress { every: 8 }, DecodeRule::Recompress { every: 8 })
    );
    assert_eq!(build("cake:every=3", &MODEL).unwrap().decode_rule(64), DecodeRule::Recompress { every: 3 });
    assert_eq!(build("snapkv:every=0", &MODEL).unwrap().decode_rule(64), DecodeRule::Grow);
    // InertiaKV's schedule: 0 is score-free
    assert_eq!(
        build("inertiakv:alpha=0.5,refresh=0", &MODEL).unwrap().decode_rule(64),
        DecodeRule::Inertia(Temporal { alpha: 0.5, refresh: Refresh::Never })
    );
    assert_eq!(
        build("inertiakv-score-free:refresh=2", &MODEL).unwrap().temporal(),
        Some(Temporal { alpha: 0.8, refresh: Refresh::Every(2) })
    );
    assert_eq!(
        build("lacache:span=2,sinks=1", &MODEL).unwrap().decode_rule(64),
        DecodeRule::Ladder(Ladder::new(2, 0, 1).unwrap())
    );
    assert_eq!(build("lacache:sinks=0", &MODEL).unwrap().protect(64).sinks, 0);
    // CAKE: γ reaches the decode rule, the window its indicator window, τ the cascade
    assert_eq!(
        build("cake:gamma=100", &MODEL).unwrap().decode_rule(64),
        DecodeRule::Indicator { window: 32, gamma: 100.0 }
    );
    assert_eq!(
        build("cake:window=16", &MODEL).unwrap().decode_rule(64),
        DecodeRule::Indicator { window: 16, gamma: 200.0 }
    );
    assert_eq!(build("cake:tau1=2,tau2=0.5", &MODEL).unwrap().cascade(), Some(Cake::new(2.0, 0.5).unwrap()));
    // the kvpress ports: ChunkKV's window reaches its SnapKV scores and protects nothing itself
    let c = build("chunkkv:window=16,chunk=8", &MODEL).unwrap();
    assert_eq!((c.needs().window, c.protect(64)), (16, Protect::NONE));
    assert_eq!(build("random:sinks=2,recent=3", &MODEL).unwrap().protect(64), Protect { sinks: 2, recent: 3 });
    assert_eq!(build("lagkv", &MODEL).unwrap().protect(64), Protect { sinks: 4, recent: 0 });
    assert_eq!(build("lagkv:sinks=0", &MODEL).unwrap().protect(64), Protect::NONE);
    let lag = build("lagkv", &MODEL).unwrap().needs();
    assert!(lag.keys && lag.values && lag.window == 0);
    assert_eq!(build("cur:sinks=2", &MODEL).unwrap().protect(64).sinks, 2);
    let value = build("cur:leverage=value", &MODEL).unwrap().needs();
    assert!(!value.keys && value.values);
    let key = build("cur:leverage=key", &MODEL).unwrap().needs();
    assert!(key.keys && !key.values);
    assert!(build("keydiff-block:block=16", &MODEL).unwrap().needs().keys);
    assert_eq!(invalid(build_spec("chunkkv:chunk=0", &MODEL)).1, "0 lies outside 1..=4096");
    assert_eq!(invalid(build_spec("random:seed=-1", &MODEL)).1, "-1 lies outside 0..=4294967295");
}

/// One head, 4 tokens, window 2 (positions 2 and 3 kept): mean (0.5, 0.1) and variance
/// (0.001, 0.004) on the prefix.
fn cake_case() -> WindowStats {
    WindowStats {
        heads: 1,
        kv_heads: 1,
        len: 4,
        window: 2,
        mean: vec![0.5, 0.1, 0.3, 0.3],
        var: vec![0.001, 0.004, 0.0, 0.0],
        last: vec![0.0; 4],
        entropy: vec![0.0],
        ..WindowStats::default()
    }
}

#[test]
fn cake_gamma_changes_the_indicator_and_the_kept_tokens() {
    let s = cake_case();
    let layers = [LayerInput::new(&s)];
    let flat3: BudgetSpec = "3".parse().unwrap();
    // kernel 1 (average pooling of one position is the identity):
    // γ = 200: 0.5 + 200·0.001 = 0.7, 0.1 + 200·0.004 = 0.9 → keeps 1 with the window
    // γ = 100: 0.5 + 0.1 = 0.6, 0.1 + 0.4 = 0.5 → keeps 0
    for (text, scores, kept) in [
        ("cake:window=2,kernel=1", [0.7, 0.9, 0.0, 0.0], vec![1, 2, 3]),
        ("cake:window=2,kernel=1,gamma=200", [0.7, 0.9, 0.0, 0.0], vec![1, 2, 3]),
        ("cake:window=2,kernel=1,gamma=100", [0.6, 0.5, 0.0, 0.0], vec![0, 2, 3]),
        ("cake:window=2,kernel=1,gamma=0", [0.5, 0.1, 0.0, 0.0], vec![0, 2, 3]),
    ] {
        let p = build_spec(text, &MODEL).unwrap();
        let got = p.score_layer(&layers[0], 3).unwrap().unwrap();
        for (g, w) in got.row(0).iter().zip(scores) {
            assert!((f64::from(*g) - w).abs() < 1e-6, "{text}: {:?}", got.row(0));
        }
        assert_eq!(p.plan(&layers, &flat3).unwrap().kept, vec![vec![kept]], "{text}");
    }
    // a 3-wide kernel: pooled prefix (0.7 + 0.9)/3, (0.7 + 0.9)/3 — a tie, kept by position
    let p = build_spec("cake:window=2,kernel=3", &MODEL).unwrap();
    let got = p.score_layer(&layers[0], 3).unwrap().unwrap();
    assert!((got.row(0)[0] - 1.6 / 3.0).abs() < 1e-6 && (got.row(0)[1] - 1.6 / 3.0).abs() < 1e-6);
    assert_eq!(p.plan(&layers, &flat3).unwrap().kept, vec![vec![vec![0, 2, 3]]]);
}

fn peers_plan(p: &mut Peers, policy: &Policy, budget: &str) -> Plan {
    let window = policy.needs().window.max(1);
    let stats: Vec<WindowStats> = (0..p.layers).map(|l| p.stats(l, window)).collect();
    let layers: Vec<LayerInput<'_>> = stats.iter().map(LayerInput::new).collect();
    policy.plan(&layers, &budget.parse().unwrap()).unwrap()
}

#[test]
fn options_at_their_defaults_plan_like_the_bare_name_on_the_peers() {
    let mut p = Peers::load();
    let model = ModelInfo { head_dim: p.head_dim, rope_theta: 10_000.0 };
    for budget in ["96L", "50%"] {
        let cake = peers_plan(&mut p, &build("cake", &model).unwrap(), budget);
        let same = peers_plan(&mut p, &build_spec("cake:gamma=200", &model).unwrap(), budget);
        assert_eq!(cake, same, "{budget}");
        // and the option is read: without the variance term the kept sets differ
        let other = peers_plan(&mut p, &build_spec("cake:gamma=0", &model).unwrap(), budget);
        assert_ne!(cake.kept, other.kept, "{budget}");
        // SnapKV with the paper's settings given as options is snapkv-original
        let original = peers_plan(&mut p, &build("snapkv-original", &model).unwrap(), budget);
        let given = peers_plan(&mut p, &build("snapkv:window=32,kernel=7,pool=max", &model).unwrap(), budget);
        assert_eq!(original, given, "{budget}");
        assert_ne!(peers_plan(&mut p, &build("snapkv:window=32", &model).unwrap(), budget).kept, original.kept);
    }
}

#[test]
fn the_verbose_listing_shows_every_option_of_every_entry() {
    let text = listing_verbose();
    let blocks: Vec<&str> = text.split("\n\n").collect();
    assert_eq!(blocks.len(), registry().len());
    for (e, block) in registry().iter().zip(blocks) {
        let mut lines = block.lines();
        assert_eq!(lines.next().unwrap(), format!("{}  {}", e.name, e.summary));
        assert_eq!(lines.next().unwrap().trim(), e.paper);
        let rest: Vec<&str> = lines.collect();
        let opts = e.options();
        assert_eq!(rest.len(), opts.len(), "{}", e.name);
        for (line, o) in rest.iter().zip(&opts) {
            let words: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(words[0], format!("{}={}", o.name, o.default), "{}", e.name);
            assert_eq!(words[1], o.kind.range(), "{}", e.name);
            assert!(line.ends_with(o.help), "{line}");
            assert!(!o.help.is_empty());
        }
    }
    // by hand, one block
    assert!(text.contains(
        "streaming-llm  4 attention sinks + the most recent tokens\n    Xiao et al. 2024, Efficient Streaming \
         Language Models with Attention Sinks (arXiv:2309.17453)\n    sinks=4  0..=4096   initial tokens always \
         kept (attention sinks)\n    every=0  0..=65536  decode steps"
    ));
}
