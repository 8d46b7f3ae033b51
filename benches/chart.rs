//! Draws the wake-up latency chart (an SVG) from the JSON lines of `compare`.
//!
//! ```sh
//! cargo bench --bench compare -- only=wakeup json=target/wakeup.jsonl
//! cargo bench --bench chart -- json=target/wakeup.jsonl svg=benches/wakeup.svg
//! ```
//!
//! Flags after `--`:
//!
//! - `json=path`: the JSON lines to read: the file written by `compare`'s `json=` flag, or its
//!   whole captured stdout (lines that are not JSON objects are skipped). Without it the bench
//!   prints how to use it and does nothing, so a plain `cargo bench` still succeeds.
//! - `svg=path`: where to write the chart (default `benches/wakeup.svg`).
//! - `note=text`: a line printed under the chart, e.g. the date and machine of the run.
//!
//! Relative paths are taken from the workspace root, since cargo runs a bench from its
//! package's directory. Only `"scenario":"wakeup"` lines that carry `handoff_percentiles_us`
//! (p0, p1, …, p100 of the hand-off latency, in µs) are drawn: one panel per waiter count, one
//! curve per contender, as a cumulative distribution on a logarithmic latency axis, since the
//! contenders differ by orders of magnitude.

use std::collections::BTreeMap;
use std::error::Error;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One contender's hand-off distribution in one wake-up run.
struct Curve {
    contender: String,
    samples: u64,
    /// p0 (min) … p100 (max), µs.
    pcts_us: Vec<f64>,
}

/// Line colours by contender, in order of first appearance: the Okabe–Ito set, which stays
/// distinguishable with the common colour-vision deficiencies, without its yellow (too pale
/// on white), plus grey.
const COLOURS: [RGBColor; 8] = [
    RGBColor(213, 94, 0),
    RGBColor(0, 114, 178),
    RGBColor(86, 180, 233),
    RGBColor(0, 158, 115),
    RGBColor(230, 159, 0),
    RGBColor(204, 121, 167),
    RGBColor(0, 0, 0),
    RGBColor(128, 128, 128),
];

const FONT: &str = "sans-serif";

/// `path` as given if absolute, else under the workspace root (see the module doc).
fn workspace_path(path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        p.to_owned()
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
    }
}

/// Wake-up curves by waiter count, and the contenders in order of first appearance.
fn read_curves(text: &str) -> (BTreeMap<u64, Vec<Curve>>, Vec<String>) {
    let mut panels: BTreeMap<u64, Vec<Curve>> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for line in text.lines().filter(|l| l.trim_start().starts_with('{')) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["scenario"] != "wakeup" {
            continue;
        }
        let (Some(contender), Some(waiters), Some(pcts)) = (
            v["contender"].as_str(),
            v["waiters"].as_u64(),
            v["handoff_percentiles_us"].as_array(),
        ) else {
            // A line from before the bench emitted the distribution: nothing to draw.
            continue;
        };
        let pcts_us: Vec<f64> = pcts.iter().filter_map(|x| x.as_f64()).collect();
        let samples = v["handoff_samples"].as_u64().unwrap_or(0);
        if pcts_us.len() != 101 || samples == 0 {
            continue;
        }
        if !order.iter().any(|c| c == contender) {
            order.push(contender.to_owned());
        }
        panels.entry(waiters).or_default().push(Curve {
            contender: contender.to_owned(),
            samples,
            pcts_us,
        });
    }
    (panels, order)
}

/// Tick label for a latency in µs, in the unit a reader would say it in.
fn latency_label(us: f64) -> String {
    if us >= 1e6 {
        format!("{} s", us / 1e6)
    } else if us >= 1e3 {
        format!("{} ms", us / 1e3)
    } else {
        format!("{us} µs")
    }
}

fn draw(
    svg: &Path,
    panels: &BTreeMap<u64, Vec<Curve>>,
    order: &[String],
    note: Option<&str>,
) -> Result<(), Box<dyn Error>> {
    let colour = |c: &str| COLOURS[order.iter().position(|o| o == c).unwrap_or(0) % COLOURS.len()];
    // One x range for every panel, whole decades, so the panels compare at a glance.
    let all = panels
        .values()
        .flatten()
        .flat_map(|c| c.pcts_us.iter().copied())
        .filter(|&x| x > 0.0);
    let (lo, hi) = all.fold((f64::MAX, 0.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let lo = 10f64.powf(lo.log10().floor());
    let hi = 10f64.powf(hi.log10().ceil()).max(lo * 10.0);

    let legend_rows = order.len().div_ceil(4);
    let legend_h = 28 * legend_rows as u32 + 22 + if note.is_some() { 22 } else { 6 };
    let root = SVGBackend::new(svg, (1200, 560 + legend_h)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "Wake-up latency: unlock() called → the parked waiter's lock() returns (no barging)",
        (FONT, 20),
    )?;
    let (plots, legend) = root.split_vertically(root.dim_in_pixel().1 - legend_h);
    let areas = plots.split_evenly((1, panels.len().max(1)));
    for (area, (waiters, curves)) in areas.iter().zip(panels) {
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!(
                    "{waiters} parked waiter{}: cumulative distribution of hand-offs",
                    if *waiters == 1 { "" } else { "s" }
                ),
                (FONT, 16),
            )
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d((lo..hi).log_scale(), 0f64..100f64)?;
        chart
            .configure_mesh()
            .x_desc("hand-off latency (log scale)")
            .y_desc("share of hand-offs at or below (%)")
            .x_label_formatter(&|x| latency_label(*x))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .axis_desc_style((FONT, 14))
            .label_style((FONT, 12))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()?;
        for c in curves {
            // redbaton drawn thicker: it is the subject, the others are the comparison.
            let width = if c.contender == "redbaton" { 3 } else { 2 };
            let style = colour(&c.contender).stroke_width(width);
            let points = c
                .pcts_us
                .iter()
                .enumerate()
                .map(|(p, &x)| (x.max(lo), p as f64));
            chart.draw_series(LineSeries::new(points, style))?;
        }
    }

    // One legend for all panels (colours are per contender), below them, so that it covers
    // no curve; each entry gives the hand-offs measured per panel.
    let col_w = legend.dim_in_pixel().0 as i32 / 4;
    let left = Pos::new(HPos::Left, VPos::Center);
    for (i, name) in order.iter().enumerate() {
        let (x, y) = (20 + col_w * (i % 4) as i32, 14 + 28 * (i / 4) as i32);
        let counts: Vec<String> = panels
            .values()
            .map(|curves| {
                curves
                    .iter()
                    .find(|c| &c.contender == name)
                    .map_or("–".to_owned(), |c| c.samples.to_string())
            })
            .collect();
        let width = if name == "redbaton" { 3 } else { 2 };
        legend.draw(&PathElement::new(
            vec![(x, y), (x + 32, y)],
            colour(name).stroke_width(width),
        ))?;
        legend.draw(&Text::new(
            format!("{name} (n = {})", counts.join(" / ")),
            (x + 40, y),
            (FONT, 14).into_font().color(&BLACK).pos(left),
        ))?;
    }
    let grey = (FONT, 12)
        .into_font()
        .color(&RGBColor(90, 90, 90))
        .pos(left);
    let panel_names: Vec<String> = panels.keys().map(|w| w.to_string()).collect();
    let mut y = 8 + 28 * legend_rows as i32;
    legend.draw(&Text::new(
        format!(
            "n = hand-offs measured with {} parked waiter(s); every curve runs from p0 (min) to p100 (max)",
            panel_names.join(" / ")
        ),
        (20, y),
        grey.clone(),
    ))?;
    if let Some(note) = note {
        y += 20;
        legend.draw(&Text::new(note.to_owned(), (20, y), grey))?;
    }
    root.present()?;
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    // `cargo bench` adds `--bench`; only `name=value` arguments are ours.
    let mut json = None;
    let mut svg = workspace_path("benches/wakeup.svg");
    let mut note = None;
    for arg in std::env::args().skip(1) {
        match arg.split_once('=') {
            Some(("json", v)) => json = Some(workspace_path(v)),
            Some(("svg", v)) => svg = workspace_path(v),
            Some(("note", v)) => note = Some(v.to_owned()),
            _ => {}
        }
    }
    let Some(json) = json else {
        eprintln!(
            "chart: nothing to draw without json=PATH (the JSON lines of \
             `cargo bench --bench compare -- only=wakeup json=PATH`)"
        );
        return Ok(());
    };
    let text = std::fs::read_to_string(&json)
        .map_err(|e| format!("cannot read {}: {e}", json.display()))?;
    let (panels, order) = read_curves(&text);
    if panels.is_empty() {
        return Err(format!(
            "{}: no wake-up line with handoff_percentiles_us (run compare with only=wakeup)",
            json.display()
        )
        .into());
    }
    draw(&svg, &panels, &order, note.as_deref())?;
    eprintln!(
        "chart: {} panel(s), {} contender(s) → {}",
        panels.len(),
        order.len(),
        svg.display()
    );
    Ok(())
}
