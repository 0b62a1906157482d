//! A busy week of history, seeded with SQL into a test's own database: hour rows for jobs
//! and queues, as the lease holder's rollups would have written them.

use sqlx::PgPool;

/// Units job `job` finished in the hour `back` hours before the current one.
pub fn units(back: i64) -> i64 {
    100 + back
}

/// Its failures in that hour: `parked:transient` every hour but one in five, and a dead
/// letter given up on every twelfth.
pub fn failures(back: i64) -> (i64, i64) {
    (i64::from(back % 5 != 0), i64::from(back % 12 == 0))
}

/// Seeds job `job`'s hours `1..=hours` back from the current one, and queue `queue`'s
/// gauges over the same hours.
pub async fn seed_week(pool: &PgPool, job: &str, queue: &str, hours: i64) -> anyhow::Result<()> {
    for back in 1..=hours {
        let (parked, gave_up) = failures(back);
        let units = units(back);
        // Most units between 20 and 50 ms, ten between 500 ms and a second.
        let mut durations = vec![0_i64; worker_store::history::BUCKETS];
        durations[5] = units - 10;
        durations[9] = 10;
        sqlx::query(
            "INSERT INTO history_hours (series, name, at, units, failures, durations) \
             VALUES ('job', $1, date_trunc('hour', now()) - make_interval(hours => $2::int), \
                     $3, jsonb_build_object('parked:transient', $4::bigint, \
                                            'dead-lettered:gave-up', $5::bigint), $6)",
        )
        .bind(job)
        .bind(back)
        .bind(units)
        .bind(parked)
        .bind(gave_up)
        .bind(&durations)
        .execute(pool)
        .await?;
        // A daily swell in the queue: deepest in the afternoon.
        let ready = 20 + (back % 24) * 3;
        sqlx::query(
            "INSERT INTO history_hours (series, name, at, samples, gauges) \
             VALUES ('queue', $1, date_trunc('hour', now()) - make_interval(hours => $2::int), \
                     60, jsonb_build_object( \
                       'ready', jsonb_build_object('sum', $3::bigint * 40, 'max', $3::bigint), \
                       'retry:30s', jsonb_build_object('sum', 120, 'max', 4), \
                       'dead_letters', jsonb_build_object('sum', 60, 'max', $4::bigint)))",
        )
        .bind(queue)
        .bind(back)
        .bind(ready)
        .bind(back / 24)
        .execute(pool)
        .await?;
    }
    Ok(())
}
