//! PNG plots of an evaluation: pass rate against budget, one line per policy with the full cache
//! as a reference line; a heatmap of the prompt positions each layer and KV head kept; and
//! perplexity against position, one line per run of `kvslice ppl`.
//!
//! plotters draws into an RGB buffer and `png` encodes it. Text needs a TrueType font, loaded at
//! run time from `$KVSLICE_FONT` or the usual system paths (Debian: `fonts-dejavu-core`).

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::error::{EvalError, Result, io_err};
use crate::report::{FULL, Report, parse_budget, run_key};

/// Where fonts usually are, in order: Debian/Ubuntu, Arch, Fedora, macOS, Windows.
pub const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "/Library/Fonts/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

const WIDTH: u32 = 960;
const HEIGHT: u32 = 600;

/// Registers the first font found as plotters' `sans-serif`, once per process.
fn ensure_font() -> Result<()> {
    static FONT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    let registered = FONT.get_or_init(|| {
        let mut candidates: Vec<String> =
            std::env::var("KVSLICE_FONT").ok().filter(|p| !p.is_empty()).into_iter().collect();
        candidates.extend(FONT_PATHS.iter().map(|p| p.to_string()));
        for path in &candidates {
            if let Ok(bytes) = std::fs::read(path) {
                // plotters keeps fonts for the whole process; one leak of a few hundred KiB.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Ok(());
                }
            }
        }
        Err(candidates.join(", "))
    });
    registered.clone().map_err(|tried| EvalError::NoFont { tried })
}

fn plot_err(path: &Path) -> impl Fn(String) -> EvalError + '_ {
    move |reason| EvalError::Plot { path: path.display().to_string(), reason }
}

/// Encodes an RGB buffer as PNG.
fn write_png(path: &Path, rgb: &[u8], width: u32, height: u32) -> Result<()> {
    let file = std::fs::File::create(path).map_err(io_err(path))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), width, height);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().map_err(|e| plot_err(path)(e.to_string()))?;
    w.write_image_data(rgb).map_err(|e| plot_err(path)(e.to_string()))?;
    w.finish().map_err(|e| plot_err(path)(e.to_string()))
}

/// What [`score_vs_budget`] draws: each policy's (budget in %, pass rate) points by budget, and
/// the full cache's pass rate. Budgets that are not percentages are left out.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreSeries {
    pub policies: Vec<(String, Vec<(f64, f64)>)>,
    pub full: Option<f64>,
}

fn rate(passed: usize, total: usize) -> f64 {
    if total == 0 { 0.0 } else { passed as f64 / total as f64 }
}

/// The series of a report.
pub fn score_series(report: &Report) -> ScoreSeries {
    let full = report.runs.get(FULL).map(|r| rate(r.passed, r.total));
    let mut policies = Vec::new();
    for p in report.policies() {
        let mut points: Vec<(f64, f64)> = report
            .budgets()
            .iter()
            .filter_map(|b| {
                let (x, unit) = parse_budget(b)?;
                let r = report.runs.get(&run_key(&p, b))?;
                (unit == "%").then(|| (x, rate(r.passed, r.total)))
            })
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        if !points.is_empty() {
            policies.push((p, points));
        }
    }
    ScoreSeries { policies, full }
}

/// Pass rate (y) against budget in % of the prompt kept (x), one line per policy, the full cache
/// as a dashed horizontal line. Only percentage budgets can be placed; a report with none is an
/// error.
pub fn score_vs_budget(report: &Report, path: &Path) -> Result<()> {
    let series = score_series(report);
    if series.policies.is_empty() {
        return Err(plot_err(path)("no policy run with a percentage budget (e.g. snapkv@10%)".into()));
    }
    ensure_font()?;
    let err = plot_err(path);
    let mut rgb = vec![0u8; (WIDTH * HEIGHT * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Pass rate against budget", ("sans-serif", 26))
            .margin(16)
            .margin_right(32)
            .x_label_area_size(48)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..100f64, 0f64..1.05f64)
            .map_err(|e| err(e.to_string()))?;
        chart
            .configure_mesh()
            .x_desc("budget (% of the prompt kept)")
            .y_desc("pass rate")
            .x_label_formatter(&|x| format!("{x:.0}%"))
            .y_label_formatter(&|y| format!("{y:.1}"))
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 18))
            .draw()
            .map_err(|e| err(e.to_string()))?;
        if let Some(full) = series.full {
            let style = ShapeStyle::from(&BLACK).stroke_width(2);
            let dashes = (0..50).map(|i| f64::from(i) * 2.0).map(|x| vec![(x, full), (x + 1.2, full)]);
            chart
                .draw_series(dashes.map(|pts| PathElement::new(pts, style)))
                .map_err(|e| err(e.to_string()))?
                .label(format!("full cache ({full:.2})"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
        for (i, (name, points)) in series.policies.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let style = ShapeStyle::from(&color).stroke_width(3);
            chart
                .draw_series(LineSeries::new(points.iter().copied(), style))
                .map_err(|e| err(e.to_string()))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 5, color.filled())))
                .map_err(|e| err(e.to_string()))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font(("sans-serif", 16))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(e.to_string()))?;
        root.present().map_err(|e| err(e.to_string()))?;
    }
    write_png(path, &rgb, WIDTH, HEIGHT)
}

/// A named line: (x, y) points.
pub type Curve = (String, Vec<(f64, f64)>);

/// Perplexity per span of `span` predictions, from each prediction's negative log-likelihood
/// (nats): `exp(mean nll)` over predictions `s·span .. (s+1)·span` (the last span may be
/// shorter), placed at the span's middle position. Runs keep their order.
pub fn ppl_series(runs: &[(String, Vec<f64>)], span: usize) -> Result<Vec<Curve>> {
    if span == 0 {
        return Err(EvalError::Report { reason: "a span of 0 predictions".into() });
    }
    runs.iter()
        .map(|(name, nll)| {
            if let Some(bad) = nll.iter().find(|x| !x.is_finite() || **x < 0.0) {
                return Err(EvalError::Report { reason: format!("{name}: negative log-likelihood {bad}") });
            }
            let points = nll
                .chunks(span)
                .enumerate()
                .map(|(i, c)| {
                    let mid = (i * span) as f64 + c.len() as f64 / 2.0;
                    (mid, (c.iter().sum::<f64>() / c.len() as f64).exp())
                })
                .collect();
            Ok((name.clone(), points))
        })
        .collect()
}

/// Perplexity (y) against position in the text (x), one line per run of [`ppl_series`]; a run
/// named `full` is drawn in black.
pub fn ppl_vs_position(series: &[Curve], title: &str, path: &Path) -> Result<()> {
    let err = plot_err(path);
    let points = || series.iter().flat_map(|(_, p)| p.iter().copied());
    if points().next().is_none() {
        return Err(err("no perplexity to draw".into()));
    }
    ensure_font()?;
    let x_max = points().map(|p| p.0).fold(0f64, f64::max) * 1.02 + 1.0;
    let (y_min, y_max) = points().fold((f64::MAX, f64::MIN), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
    let pad = ((y_max - y_min) * 0.08).max(0.05);
    let mut rgb = vec![0u8; (WIDTH * HEIGHT * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 24))
            .margin(16)
            .margin_right(32)
            .x_label_area_size(48)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..x_max, (y_min - pad).max(0.0)..y_max + pad)
            .map_err(|e| err(e.to_string()))?;
        chart
            .configure_mesh()
            .x_desc("position in the text (tokens)")
            .y_desc("perplexity per span")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.1}"))
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 18))
            .draw()
            .map_err(|e| err(e.to_string()))?;
        let mut colors = 0;
        for (name, pts) in series {
            let color = if name == FULL {
                BLACK.to_rgba()
            } else {
                colors += 1;
                Palette99::pick(colors - 1).to_rgba()
            };
            let style = ShapeStyle::from(&color).stroke_width(3);
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), style))
                .map_err(|e| err(e.to_string()))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(|e| err(e.to_string()))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 16))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(e.to_string()))?;
        root.present().map_err(|e| err(e.to_string()))?;
    }
    write_png(path, &rgb, WIDTH, HEIGHT)
}

/// Share of each position bin kept, per (layer, KV head) row: `kept[layer][head]` lists the
/// kept source positions (each below `prompt_len`, no repeats); bin `b` of `bins` covers
/// positions `b·len/bins .. (b+1)·len/bins` (rounded down). Rows are layer-major.
pub fn kept_shares(kept: &[Vec<Vec<u32>>], prompt_len: usize, bins: usize) -> Result<Vec<Vec<f64>>> {
    let bad = |reason: String| EvalError::Plot { path: "<heatmap>".into(), reason };
    if prompt_len == 0 || bins == 0 || bins > prompt_len {
        return Err(bad(format!("{bins} bins over a {prompt_len}-token prompt")));
    }
    if kept.is_empty() || kept[0].is_empty() {
        return Err(bad("no layers or no heads".into()));
    }
    let heads = kept[0].len();
    let edge = |b: usize| b * prompt_len / bins;
    let mut rows = Vec::with_capacity(kept.len() * heads);
    for (l, layer) in kept.iter().enumerate() {
        if layer.len() != heads {
            return Err(bad(format!("layer {l} has {} heads, layer 0 has {heads}", layer.len())));
        }
        for (h, positions) in layer.iter().enumerate() {
            let mut seen = vec![false; prompt_len];
            let mut counts = vec![0usize; bins];
            for &p in positions {
                let p = p as usize;
                if p >= prompt_len {
                    return Err(bad(format!("layer {l} head {h}: position {p} not below {prompt_len}")));
                }
                if std::mem::replace(&mut seen[p], true) {
                    return Err(bad(format!("layer {l} head {h}: position {p} kept twice")));
                }
                // The bin b with edge(b) <= p < edge(b + 1).
                let mut b = p * bins / prompt_len;
                while edge(b + 1) <= p {
                    b += 1;
                }
                while edge(b) > p {
                    b -= 1;
                }
                counts[b] += 1;
            }
            rows.push(counts.iter().enumerate().map(|(b, &c)| c as f64 / (edge(b + 1) - edge(b)) as f64).collect());
        }
    }
    Ok(rows)
}

/// White (nothing kept) to dark blue (all kept).
fn shade(share: f64) -> RGBColor {
    let s = share.clamp(0.0, 1.0);
    let mix = |a: f64, b: f64| (a + (b - a) * s).round() as u8;
    RGBColor(mix(255.0, 8.0), mix(255.0, 48.0), mix(255.0, 107.0))
}

/// A heatmap of kept positions: one row per (layer, KV head), layer 0 at the top; columns are
/// position bins (up to 128); colour is the share of the bin kept (white 0 → blue 1).
/// `kept[layer][head]` lists the kept source positions.
pub fn kept_heatmap(kept: &[Vec<Vec<u32>>], prompt_len: usize, title: &str, path: &Path) -> Result<()> {
    let bins = prompt_len.min(128);
    let shares = kept_shares(kept, prompt_len, bins).map_err(|e| match e {
        EvalError::Plot { reason, .. } => plot_err(path)(reason),
        other => other,
    })?;
    ensure_font()?;
    let err = plot_err(path);
    let heads = kept[0].len();
    let rows = shares.len();
    let mut rgb = vec![0u8; (WIDTH * HEIGHT * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 24))
            .margin(16)
            .margin_right(32)
            .x_label_area_size(48)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..prompt_len as f64, 0f64..rows as f64)
            .map_err(|e| err(e.to_string()))?;
        let layers = kept.len();
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc("prompt position")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_desc(format!("layer ({heads} KV heads each; label at its top edge)"))
            .y_labels(layers.min(16) + 1)
            .y_label_formatter(&|y| format!("{}", ((rows as f64 - y) / heads as f64).round() as i64))
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 18))
            .draw()
            .map_err(|e| err(e.to_string()))?;
        let cells = shares.iter().enumerate().flat_map(|(r, row)| {
            row.iter().enumerate().map(move |(b, &s)| {
                let (x0, x1) = ((b * prompt_len / bins) as f64, ((b + 1) * prompt_len / bins) as f64);
                let y1 = (rows - r) as f64;
                Rectangle::new([(x0, y1 - 1.0), (x1, y1)], shade(s).filled())
            })
        });
        chart.draw_series(cells).map_err(|e| err(e.to_string()))?;
        root.present().map_err(|e| err(e.to_string()))?;
    }
    write_png(path, &rgb, WIDTH, HEIGHT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::CaseReport;

    #[test]
    fn shares_by_hand() {
        // 10 positions, 3 bins: [0,3) [3,6) [6,10).
        let kept = vec![vec![vec![0, 1, 2, 9], vec![]], vec![vec![3, 6, 7], vec![5, 4, 3, 2]]];
        let s = kept_shares(&kept, 10, 3).unwrap();
        assert_eq!(
            s,
            vec![vec![1.0, 0.0, 0.25], vec![0.0, 0.0, 0.0], vec![0.0, 1.0 / 3.0, 0.5], vec![1.0 / 3.0, 1.0, 0.0]]
        );
        // One bin per position.
        assert_eq!(kept_shares(&[vec![vec![1]]], 3, 3).unwrap(), vec![vec![0.0, 1.0, 0.0]]);
    }

    #[test]
    fn bad_heatmap_input_is_an_error() {
        assert!(kept_shares(&[vec![vec![10]]], 10, 3).is_err());
        assert!(kept_shares(&[vec![vec![1, 1]]], 10, 3).is_err());
        assert!(kept_shares(&[vec![vec![1]], vec![vec![1], vec![2]]], 10, 3).is_err());
        assert!(kept_shares(&[], 10, 3).is_err());
        assert!(kept_shares(&[vec![vec![1]]], 0, 1).is_err());
        assert!(kept_shares(&[vec![vec![1]]], 2, 3).is_err());
    }

    fn sample() -> Report {
        let mut r = Report::default();
        let mut add = |run: &str, passes: &[bool]| {
            for (i, &pass) in passes.iter().enumerate() {
                r.record(
                    run,
                    &format!("c{i}"),
                    CaseReport { pass, output: String::new(), prompt_tokens: 1, kv_bytes: None },
                );
            }
        };
        add("full", &[true, true, true, false]);
        add("snapkv@50%", &[true, true, true, false]);
        add("snapkv@10%", &[true, false, false, false]);
        add("snapkv@25%", &[true, true, false, false]);
        add("tova@10%", &[true, true, false, false]);
        add("tova@128L", &[true, true, true, true]);
        add("knorm@256", &[true, false, false, false]);
        r
    }

    #[test]
    fn series_by_hand() {
        let s = score_series(&sample());
        assert_eq!(s.full, Some(0.75));
        assert_eq!(
            s.policies,
            vec![
                ("snapkv".to_string(), vec![(10.0, 0.25), (25.0, 0.5), (50.0, 0.75)]),
                ("tova".to_string(), vec![(10.0, 0.5)]),
            ]
        );
    }

    fn png_size(path: &Path) -> (u32, u32) {
        let bytes = std::fs::read(path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        let be = |o: usize| u32::from_be_bytes(bytes[o..o + 4].try_into().unwrap());
        (be(16), be(20))
    }

    fn temp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("kvslice-eval-plot-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d.join(name)
    }

    /// Draws both plots (needs a font: fonts-dejavu-core on Debian). `KVSLICE_PLOT_DIR` keeps the
    /// PNGs for a look.
    #[test]
    fn ppl_series_by_hand() {
        let ln2 = std::f64::consts::LN_2;
        // 5 predictions in spans of 2: [ln2, ln2] -> 2, [0, 2 ln2] -> exp(ln2) = 2, [ln 8] -> 8.
        let runs = vec![("full".to_string(), vec![ln2, ln2, 0.0, 2.0 * ln2, 8f64.ln()])];
        let s = ppl_series(&runs, 2).unwrap();
        let (name, pts) = &s[0];
        assert_eq!(name, "full");
        let want = [(1.0, 2.0), (3.0, 2.0), (4.5, 8.0)];
        assert_eq!(pts.len(), 3);
        for (got, want) in pts.iter().zip(want) {
            assert_eq!(got.0, want.0);
            assert!((got.1 - want.1).abs() < 1e-12, "{got:?}");
        }
        assert!(ppl_series(&runs, 0).is_err());
        assert!(ppl_series(&[("x".into(), vec![f64::NAN])], 1).is_err());
        assert!(ppl_series(&[("x".into(), vec![-1.0])], 1).is_err());
    }

    #[test]
    fn draws_pngs() {
        let dir = std::env::var("KVSLICE_PLOT_DIR").ok();
        let out = |name: &str| match &dir {
            Some(d) => Path::new(d).join(name),
            None => temp(name),
        };
        let p = out("score.png");
        score_vs_budget(&sample(), &p).unwrap();
        assert_eq!(png_size(&p), (WIDTH, HEIGHT));
        let runs: Vec<(String, Vec<f64>)> = [("full", 1.8), ("tova@512", 1.9), ("h2o@512", 2.0)]
            .iter()
            .map(|(n, base)| {
                (n.to_string(), (0..4000).map(|i| base + f64::from(i % 7) * 0.01 + f64::from(i) * 1e-5).collect())
            })
            .collect();
        let p = out("ppl.png");
        ppl_vs_position(&ppl_series(&runs, 512).unwrap(), "Perplexity against position", &p).unwrap();
        assert_eq!(png_size(&p), (WIDTH, HEIGHT));
        assert!(ppl_vs_position(&[], "empty", &out("none.png")).is_err());
        // 4 layers x 2 heads over 1000 positions: sinks, a recent window, and a stripe.
        let kept: Vec<Vec<Vec<u32>>> = (0..4)
            .map(|l| {
                (0..2)
                    .map(|h| {
                        let mut v: Vec<u32> = (0..4).chain(900..1000).collect();
                        v.extend((100 * (l + h) as u32..100 * (l + h) as u32 + 50).filter(|p| *p >= 4 && *p < 900));
                        v
                    })
                    .collect()
            })
            .collect();
        let h = out("kept.png");
        kept_heatmap(&kept, 1000, "kept positions (test)", &h).unwrap();
        assert_eq!(png_size(&h), (WIDTH, HEIGHT));
        let empty = Report::default();
        assert!(matches!(score_vs_budget(&empty, &out("none.png")), Err(EvalError::Plot { .. })));
        assert!(matches!(kept_heatmap(&[vec![vec![5]]], 3, "t", &out("bad.png")), Err(EvalError::Plot { .. })));
    }
}
