//! One chart's numbers (a row per period, a column per series, each column's total) and the
//! page's set of charts; [`Chart::svg`] draws one with [`crate::chart`].

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use minijinja::Value;
use serde::Serialize;
use worker_store::history::Resolution;

use super::range::Range;
use crate::chart::{self, Series};

/// How a column's total over the range is made.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Total {
    /// The periods added up (units, failures).
    Sum,
    /// The highest period (a gauge's peak).
    Peak,
    /// A percentile of every duration in the range, not of the periods' percentiles.
    Overall,
}

#[derive(Debug, Clone, Serialize)]
struct Column {
    name: String,
    total_is: Total,
    total: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
struct Row {
    at: DateTime<Utc>,
    label: String,
    values: Vec<Option<f64>>,
}

/// One chart's numbers: a row per period, a column per series, and each column's total.
#[derive(Debug, Clone, Serialize)]
pub struct Chart {
    id: String,
    title: String,
    unit: String,
    range: Range,
    resolution: Resolution,
    columns: Vec<Column>,
    rows: Vec<Row>,
}

impl Chart {
    pub fn new(id: &str, title: &str, unit: &str, range: Range, starts: &[DateTime<Utc>]) -> Self {
        Self {
            id: id.into(),
            title: title.into(),
            unit: unit.into(),
            range,
            resolution: range.periods().0,
            columns: Vec::new(),
            rows: starts
                .iter()
                .map(|at| Row {
                    at: *at,
                    label: range.label(*at),
                    values: Vec::new(),
                })
                .collect(),
        }
    }

    /// Adds a column with a value per period (from `value`) and its total.
    pub fn column(
        mut self,
        name: &str,
        total_is: Total,
        mut value: impl FnMut(DateTime<Utc>) -> Option<f64>,
    ) -> Self {
        for row in &mut self.rows {
            row.values.push(value(row.at));
        }
        let i = self.columns.len();
        let values = self.rows.iter().filter_map(|r| r.values[i]);
        let total = match total_is {
            Total::Sum => Some(values.sum()),
            Total::Peak => values.reduce(f64::max),
            Total::Overall => None,
        };
        self.columns.push(Column {
            name: name.into(),
            total_is,
            total,
        });
        self
    }

    pub fn with_total(mut self, total: Option<f64>) -> Self {
        if let Some(last) = self.columns.last_mut() {
            last.total = total;
        }
        self
    }

    pub fn svg(&self) -> String {
        let labels: Vec<String> = self.rows.iter().map(|r| r.label.clone()).collect();
        let series: Vec<Series<'_>> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| Series {
                name: &c.name,
                values: self.rows.iter().map(|r| r.values[i]).collect(),
            })
            .collect();
        let title = format!("{}, last {}", self.title, self.range.name());
        chart::svg(&title, &self.unit, &labels, &series)
    }
}

/// The charts of a page, with the range and the links to the others.
#[derive(Debug, Clone, Serialize)]
pub struct History {
    pub range: Range,
    pub ranges: [Range; 4],
    pub charts: Vec<Chart>,
    /// Failures by reason over the range (a job's page).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failures: Option<BTreeMap<String, i64>>,
}

impl History {
    /// The history for a page's template: the numbers, and each chart's SVG marked safe.
    pub fn view(&self) -> Value {
        let svgs: Vec<Value> = self
            .charts
            .iter()
            .map(|c| Value::from_safe_string(c.svg()))
            .collect();
        minijinja::context! { h => Value::from_serialize(self), svgs => svgs }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_totals_are_sums_for_work_and_peaks_for_gauges() {
        let now: DateTime<Utc> = "2026-12-07T10:42:00Z".parse().unwrap();
        let starts = Range::Day.starts(now);
        let chart = Chart::new("c", "t", "u", Range::Day, &starts)
            .column("units", Total::Sum, |_| Some(2.0))
            .column("depth", Total::Peak, |at| {
                Some(f64::from(chrono::Timelike::hour(&at)))
            });
        assert_eq!(chart.columns[0].total, Some(48.0));
        assert_eq!(chart.columns[1].total, Some(23.0));
    }
}
