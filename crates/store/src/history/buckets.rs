//! Durations as counts in fixed buckets: cheap to count (one atomic add), mergeable across
//! replicas and periods (added bucket by bucket), and read back as percentiles.

use std::time::Duration;

/// The upper bounds of the duration buckets, in milliseconds; one more bucket counts what is
/// past the last. The stored arrays are positional: a bound is only ever appended.
pub const BOUNDS_MS: [u64; 17] = [
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000, 120_000,
    300_000,
];

/// Buckets in a histogram: one per bound and the overflow.
pub const BUCKETS: usize = BOUNDS_MS.len() + 1;

/// The bucket `duration` falls in: the first whose bound it does not pass.
pub fn bucket_of(duration: Duration) -> usize {
    let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    BOUNDS_MS.partition_point(|bound| *bound < ms)
}

/// Adds `other` to `into`, bucket by bucket; the shorter is taken as zeros past its end.
pub fn merge(into: &mut Vec<i64>, other: &[i64]) {
    if into.len() < other.len() {
        into.resize(other.len(), 0);
    }
    for (slot, count) in into.iter_mut().zip(other) {
        *slot += count;
    }
}

/// The duration, in milliseconds, under which a fraction `q` (0 to 1) of the counted ones
/// fall: found in its bucket and interpolated linearly within it. `None` when nothing was
/// counted. A percentile in the overflow bucket reads as the last bound.
pub fn percentile(counts: &[i64], q: f64) -> Option<f64> {
    let total: i64 = counts.iter().map(|c| (*c).max(0)).sum();
    if total == 0 {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * total as f64).ceil().max(1.0);
    let mut below = 0.0;
    for (i, count) in counts.iter().enumerate() {
        let count = (*count).max(0) as f64;
        if count > 0.0 && below + count >= rank {
            let lower = if i == 0 { 0.0 } else { BOUNDS_MS[i - 1] as f64 };
            let Some(upper) = BOUNDS_MS.get(i) else {
                return Some(lower);
            };
            let upper = *upper as f64;
            return Some(lower + (upper - lower) * (rank - below) / count);
        }
        below += count;
    }
    BOUNDS_MS.last().map(|b| *b as f64)
}

/// p50, p95 and p99 of `counts`, in milliseconds.
pub fn quantiles(counts: &[i64]) -> [Option<f64>; 3] {
    [
        percentile(counts, 0.50),
        percentile(counts, 0.95),
        percentile(counts, 0.99),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_duration_falls_in_the_first_bucket_whose_bound_it_does_not_pass() {
        assert_eq!(bucket_of(ms(0)), 0);
        assert_eq!(bucket_of(ms(1)), 0);
        assert_eq!(bucket_of(ms(2)), 1);
        assert_eq!(bucket_of(ms(3)), 2);
        assert_eq!(bucket_of(ms(100)), 6);
        assert_eq!(bucket_of(ms(101)), 7);
        assert_eq!(bucket_of(ms(300_000)), 16);
        assert_eq!(bucket_of(Duration::from_secs(3600)), BUCKETS - 1);
    }

    #[test]
    fn percentiles_interpolate_within_their_bucket() {
        // 100 durations in (50, 100] ms: p50 is half way through the bucket.
        let mut counts = vec![0; BUCKETS];
        counts[bucket_of(ms(80))] = 100;
        assert_eq!(percentile(&counts, 0.5), Some(75.0));
        assert_eq!(percentile(&counts, 0.99), Some(99.5));
        assert_eq!(percentile(&counts, 1.0), Some(100.0));
    }

    #[test]
    fn the_tail_percentiles_find_the_slow_few() {
        // 95 fast (≤ 1 ms), 4 at ~150 ms, 1 at ~4 s.
        let mut counts = vec![0; BUCKETS];
        counts[bucket_of(ms(1))] = 95;
        counts[bucket_of(ms(150))] = 4;
        counts[bucket_of(ms(4_000))] = 1;
        let [p50, p95, p99] = quantiles(&counts);
        assert!(p50.unwrap() <= 1.0, "{p50:?}");
        assert!(p95.unwrap() <= 1.0, "{p95:?}");
        let p99 = p99.unwrap();
        assert!((100.0..=200.0).contains(&p99), "{p99}");
        assert_eq!(percentile(&counts, 1.0), Some(5_000.0));
    }

    #[test]
    fn nothing_counted_has_no_percentile_and_overflow_reads_as_the_last_bound() {
        assert_eq!(percentile(&[0; BUCKETS], 0.5), None);
        assert_eq!(percentile(&[], 0.5), None);
        let mut counts = vec![0; BUCKETS];
        counts[BUCKETS - 1] = 3;
        assert_eq!(percentile(&counts, 0.99), Some(300_000.0));
    }

    #[test]
    fn merging_adds_bucket_by_bucket_and_pads_the_shorter() {
        let mut into = vec![1, 2];
        merge(&mut into, &[10, 20, 30]);
        assert_eq!(into, vec![11, 22, 30]);
        merge(&mut into, &[1]);
        assert_eq!(into, vec![12, 22, 30]);
    }
}
