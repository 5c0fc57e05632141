//! Budget specs: parsing, errors with reasons, resolution against a prompt.

use kvslice_policy::{BudgetSpec, PolicyError, SinkCount, WindowSize};

fn parse(s: &str) -> Result<BudgetSpec, PolicyError> {
    s.parse()
}

fn reason(s: &str) -> String {
    match parse(s) {
        Err(PolicyError::BudgetSpec { reason, .. }) => reason,
        other => panic!("{s:?} should be a spec error, got {other:?}"),
    }
}

#[test]
fn the_three_notations() {
    assert_eq!(parse("128L").unwrap(), BudgetSpec::AveragePerLayer(128));
    assert_eq!(parse("128l").unwrap(), BudgetSpec::AveragePerLayer(128));
    assert_eq!(parse(" 10% ").unwrap(), BudgetSpec::Fraction { ppm: 100_000 });
    assert_eq!(parse("12.5%").unwrap(), BudgetSpec::Fraction { ppm: 125_000 });
    assert_eq!(parse("0.25%").unwrap(), BudgetSpec::Fraction { ppm: 2_500 });
    assert_eq!(parse("100%").unwrap(), BudgetSpec::Fraction { ppm: 1_000_000 });
    assert_eq!(parse("2048").unwrap(), BudgetSpec::Flat(2048));
}

#[test]
fn display_round_trips() {
    for s in ["128L", "10%", "12.5%", "0.0625%", "2048", "100%"] {
        assert_eq!(parse(s).unwrap().to_string(), s);
    }
}

#[test]
fn nonsense_is_rejected_with_a_reason() {
    assert!(reason("").contains("empty"));
    assert!(reason("0").contains("zero"));
    assert!(reason("0L").contains("zero"));
    assert!(reason("0%").contains("keeps nothing"));
    assert!(reason("101%").contains("more than 100%"));
    assert!(reason("100.5%").contains("more than 100%"));
    assert!(reason("-5").contains("negative"));
    assert!(reason("12x").contains("not a whole number"));
    assert!(reason("1.5").contains("not a whole number"));
    assert!(reason("%").contains("expected a percentage"));
    assert!(reason("L").contains("expected a number"));
    assert!(reason("1.2.3%").contains("digits"));
    assert!(reason("0.00001%").contains("four decimals"));
    assert!(reason("99999999999999999999999").contains("too large"));
}

#[test]
fn resolution() {
    // 128L on a 1000-token prompt, 30 layers: 128 per layer, 3840 in all, adaptive
    let r = parse("128L").unwrap().resolve(1000, 30, 36).unwrap();
    assert_eq!((r.per_layer, r.total, r.layer_adaptive), (128, 3840, true));
    // 10% of 1000 = 100 per layer
    let r = parse("10%").unwrap().resolve(1000, 30, 0).unwrap();
    assert_eq!((r.per_layer, r.total, r.layer_adaptive), (100, 3000, true));
    // 12.5% of 999 = 124.875 → 124
    assert_eq!(parse("12.5%").unwrap().resolve(999, 2, 0).unwrap().per_layer, 124);
    // a flat budget is not moved between layers
    let r = parse("64").unwrap().resolve(1000, 4, 4).unwrap();
    assert_eq!((r.per_layer, r.total, r.layer_adaptive), (64, 256, false));
    // larger than the prompt: keep the prompt
    assert_eq!(parse("4096").unwrap().resolve(1000, 2, 0).unwrap().per_layer, 1000);
}

#[test]
fn budgets_below_the_protected_tokens_are_errors() {
    assert_eq!(
        parse("32L").unwrap().resolve(1000, 2, 36),
        Err(PolicyError::BudgetBelowProtected { budget: 32, protected: 36 })
    );
    // 1% of 50 tokens keeps nothing
    assert!(matches!(parse("1%").unwrap().resolve(50, 2, 0), Err(PolicyError::BudgetSpec { .. })));
    assert!(matches!(parse("8").unwrap().resolve(10, 0, 0), Err(PolicyError::InvalidParameter { .. })));
}

#[test]
fn window_and_sink_sizes() {
    assert_eq!("32".parse::<WindowSize>().unwrap(), WindowSize(32));
    assert!("0".parse::<WindowSize>().is_err());
    assert!("x".parse::<WindowSize>().is_err());
    assert_eq!("0".parse::<SinkCount>().unwrap(), SinkCount(0));
    assert_eq!("4".parse::<SinkCount>().unwrap(), SinkCount(4));
    assert!("-1".parse::<SinkCount>().is_err());
}
