//! A history chart drawn on the server as inline SVG with plotters' SVG backend: attributes
//! only (the CSP allows no inline style), no script, no font files. Readable without colour:
//! each series has its own dash pattern and marker, and a legend naming it in text; the
//! `<svg>` is an image with an accessible name, and the page puts the numbers in a table
//! beside it.

use plotters::prelude::*;

/// What a series looks like: the stroke is the same dark ink for all, the pattern and the
/// marker tell them apart.
#[derive(Debug, Clone, Copy)]
enum Look {
    Solid,
    Dashed,
    Dotted,
    LongDashed,
}

const LOOKS: [Look; 4] = [Look::Solid, Look::Dashed, Look::Dotted, Look::LongDashed];
const INKS: [RGBColor; 4] = [
    RGBColor(0x1f, 0x3a, 0x5f),
    RGBColor(0x9a, 0x34, 0x12),
    RGBColor(0x2f, 0x5d, 0x2f),
    RGBColor(0x4a, 0x2a, 0x6a),
];

/// One series: its name (the legend's text) and a value per period (`None`: no reading).
#[derive(Debug, Clone)]
pub struct Series<'a> {
    pub name: &'a str,
    pub values: Vec<Option<f64>>,
}

/// Draws `series` over `labels` (one per period) as an SVG string titled `title`, with
/// `unit` on the y axis.
pub fn svg(title: &str, unit: &str, labels: &[String], series: &[Series<'_>]) -> String {
    let mut out = String::new();
    if let Err(e) = draw(&mut out, unit, labels, series) {
        tracing::debug!(error = %e, "a history chart could not be drawn");
        return String::new();
    }
    accessible(&out, title, series)
}

fn draw(
    out: &mut String,
    unit: &str,
    labels: &[String],
    series: &[Series<'_>],
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::with_string(out, (760, 260)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = labels.len().max(2);
    let top = series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .fold(0.0_f64, |a, b| a.max(*b));
    let top = if top <= 0.0 { 1.0 } else { top * 1.1 };
    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .x_label_area_size(28)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..(n - 1) as f64, 0.0..top)?;
    let label_of = |x: &f64| {
        let i = x.round().max(0.0) as usize;
        labels.get(i).cloned().unwrap_or_default()
    };
    chart
        .configure_mesh()
        .x_labels(6)
        .y_labels(5)
        .x_label_formatter(&label_of)
        .y_label_formatter(&|v: &f64| {
            if top >= 10.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            }
        })
        .y_desc(unit)
        .label_style(("sans-serif", 13))
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let ink = INKS[i % INKS.len()];
        let look = LOOKS[i % LOOKS.len()];
        let style = ShapeStyle::from(&ink).stroke_width(2);
        let points: Vec<(f64, f64)> = s
            .values
            .iter()
            .enumerate()
            .filter_map(|(x, v)| v.map(|v| (x as f64, v)))
            .collect();
        match look {
            Look::Solid => {
                chart.draw_series(LineSeries::new(points.clone(), style))?;
            }
            Look::Dashed => {
                chart.draw_series(DashedLineSeries::new(points.clone(), 8, 5, style))?;
            }
            Look::Dotted => {
                chart.draw_series(DashedLineSeries::new(points.clone(), 2, 4, style))?;
            }
            Look::LongDashed => {
                chart.draw_series(DashedLineSeries::new(points.clone(), 14, 4, style))?;
            }
        }
        // Markers only where they stay apart; a long series is told apart by its pattern.
        let every = (points.len() / 24).max(1);
        let marked = points.iter().step_by(every).copied();
        let name = s.name.to_string();
        let legend = move |(x, y): (i32, i32)| {
            EmptyElement::at((x, y))
                + PathElement::new(vec![(0, 0), (22, 0)], style)
                + marker(i, (11, 0), style)
        };
        chart
            .draw_series(marked.map(|p| EmptyElement::at(p) + marker(i, (0, 0), style)))?
            .label(name)
            .legend(legend);
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Series `i`'s marker: a circle, a triangle, a cross, a square.
fn marker<'b>(
    i: usize,
    at: (i32, i32),
    style: ShapeStyle,
) -> DynElement<'static, SVGBackend<'b>, (i32, i32)> {
    match i % 4 {
        0 => Circle::new(at, 3, style.filled()).into_dyn(),
        1 => TriangleMarker::new(at, 4, style.filled()).into_dyn(),
        2 => Cross::new(at, 4, style).into_dyn(),
        _ => Rectangle::new([(at.0 - 3, at.1 - 3), (at.0 + 3, at.1 + 3)], style).into_dyn(),
    }
}

/// The SVG as an image with an accessible name: `role="img"`, `aria-label` and a `<title>`
/// naming the chart and its series in text.
fn accessible(svg: &str, title: &str, series: &[Series<'_>]) -> String {
    let names: Vec<&str> = series.iter().map(|s| s.name).collect();
    let label = escape(&format!("{title}: {}", names.join(", ")));
    let Some(open_end) = svg.find('>') else {
        return String::new();
    };
    let (open, rest) = svg.split_at(open_end);
    let open = open.replacen(
        "<svg ",
        &format!("<svg class=\"chart\" role=\"img\" aria-label=\"{label}\" "),
        1,
    );
    format!("{open}><title>{label}</title>{}", &rest[1..])
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_is_an_image_named_in_text_with_no_style_attribute() {
        let labels: Vec<String> = (0..24).map(|h| format!("{h:02}h")).collect();
        let series = [
            Series {
                name: "units",
                values: (0..24).map(|h| Some(f64::from(h))).collect(),
            },
            Series {
                name: "failures",
                values: (0..24).map(|h| (h % 2 == 0).then_some(1.0)).collect(),
            },
        ];
        let svg = svg("Units of work <week>", "per hour", &labels, &series);
        assert!(
            svg.starts_with("<svg class=\"chart\" role=\"img\""),
            "{}",
            &svg[..200]
        );
        assert!(svg.contains("aria-label=\"Units of work &lt;week&gt;: units, failures\""));
        assert!(svg.contains("<title>Units of work &lt;week&gt;: units, failures</title>"));
        assert!(
            svg.contains("\nunits\n") && svg.contains("\nfailures\n"),
            "the legend in text"
        );
        assert!(
            svg.contains("stroke-dasharray") || svg.matches("<line").count() > 40,
            "a dashed series"
        );
        assert!(!svg.contains("style="), "the CSP allows no inline style");
        assert!(!svg.contains("<script"));
    }
}
