//! A dispatcher's chart of the last hour: attempts per minute, as SVG.

use maud::{html, Markup};

use crate::store::chart::Chart;

/// The chart's width and height in SVG units: 60 bars of 12.
const CHART_W: usize = 720;
const CHART_H: usize = 100;

/// Attempts per minute as stacked bars (successes below, failures above),
/// server-rendered SVG; each bar carries its figures as `data-` attributes
/// and a tooltip, the totals are written under it.
pub fn chart(id: &str, c: &Result<Option<Chart>, String>) -> Markup {
    let c = match c {
        Err(e) => return html! { p.error { "The attempt log did not answer: " (e) } },
        Ok(None) => return html! { p.muted { "No chart: the attempt log ([history]) is off." } },
        Ok(Some(c)) => c,
    };
    let peak = c
        .minutes
        .iter()
        .map(|m| m.ok + m.failed)
        .max()
        .unwrap_or(0)
        .max(1);
    let bar = CHART_W / c.minutes.len().max(1);
    let scale = |n: i64| (n as f64 * CHART_H as f64 / peak as f64).round() as usize;
    let total = c.total();
    html! {
        figure.chart id=(id) {
            svg xmlns="http://www.w3.org/2000/svg" width=(CHART_W) height=(CHART_H + 16)
                viewBox={ "0 0 " (CHART_W) " " (CHART_H + 16) } role="img"
                aria-label="attempts per minute over the last hour" {
                line x1="0" y1=(CHART_H) x2=(CHART_W) y2=(CHART_H) stroke="#999" {}
                @for (i, m) in c.minutes.iter().enumerate() {
                    @let at = c.since + chrono::Duration::minutes(i as i64);
                    @let (ok_h, failed_h) = (scale(m.ok), scale(m.failed));
                    g.minute data-minute=(at.format("%H:%M")) data-ok=(m.ok) data-failed=(m.failed) {
                        title { (at.format("%H:%M")) " UTC: " (m.ok) " succeeded, " (m.failed) " failed" }
                        @if m.ok > 0 {
                            rect x=(i * bar) y=(CHART_H - ok_h) width=(bar - 2) height=(ok_h) fill="#2a7" {}
                        }
                        @if m.failed > 0 {
                            rect x=(i * bar) y=(CHART_H - ok_h - failed_h) width=(bar - 2) height=(failed_h) fill="#c33" {}
                        }
                    }
                }
                text x="0" y=(CHART_H + 13) font-size="11" { (c.since.format("%H:%M")) " UTC" }
                text x=(CHART_W) y=(CHART_H + 13) font-size="11" text-anchor="end" { "now" }
                text x="0" y="11" font-size="11" { (peak) " / min" }
            }
            figcaption {
                "Attempts per minute, last hour: "
                span.chart-ok { (total.ok) } " succeeded, "
                span.chart-failed { (total.failed) } " failed."
            }
        }
    }
}
