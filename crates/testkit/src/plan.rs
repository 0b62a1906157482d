//! Reading PostgreSQL's plans in tests: what a statement costs as the tables grow, asserted
//! on the rows it reads rather than on a time that a busy machine would make flaky.

use serde_json::Value;

/// Rows the table scans of an `EXPLAIN (ANALYZE, FORMAT JSON)` plan node (and the nodes
/// below it) read: what each scan returned and what its filters removed, times its loops.
///
/// ```
/// let plan = serde_json::json!({
///     "Node Type": "Aggregate",
///     "Plans": [{ "Node Type": "Seq Scan", "Actual Rows": 2.0,
///                 "Rows Removed by Filter": 98.0, "Actual Loops": 1.0 }]
/// });
/// assert_eq!(worker_testkit::plan::rows_read(&plan), 100.0);
/// ```
pub fn rows_read(plan: &Value) -> f64 {
    let here = match plan["Node Type"].as_str() {
        Some("Seq Scan" | "Index Scan" | "Index Only Scan" | "Bitmap Heap Scan") => {
            let count = |key: &str| plan[key].as_f64().unwrap_or(0.0);
            (count("Actual Rows")
                + count("Rows Removed by Filter")
                + count("Rows Removed by Index Recheck"))
                * count("Actual Loops")
        }
        _ => 0.0,
    };
    let below: f64 = plan["Plans"]
        .as_array()
        .map(|plans| plans.iter().map(rows_read).sum())
        .unwrap_or(0.0);
    here + below
}
