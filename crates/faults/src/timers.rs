//! What the timer scenarios read from outside the host: the ticks of a job in the attempt log
//! (whether two of them ever ran at once), the tick counters on `/metrics`, and which host
//! process holds a job's lease right now (PostgreSQL's `pg_locks`, the holding session's
//! client port matched to a process's sockets in `/proc`).

use std::collections::HashSet;
use std::time::Duration;

use anyhow::Context;
use sqlx::PgPool;

use crate::host::{HostProcess, metric_sum_with};
use crate::run::{HostId, Run};

/// The timer jobs the host runs under the singleton lease, each with the key of its lease (its
/// first name: `dead-letter-archive` was `dead-letter-maintenance`). The outbox drain has none
/// (replicas share its rows through `FOR UPDATE SKIP LOCKED`), nor the database health probe
/// (each replica probes for its own readiness). The host's list of jobs is the source: a test
/// of the host (`crates/host/tests/job_list.rs`) holds this one to it.
pub const LEASED_JOBS: [(&str, &str); 5] = [
    ("inbound-email-poller", "inbound-email-poller"),
    ("draft-expiry", "draft-expiry"),
    ("dead-letter-archive", "dead-letter-maintenance"),
    ("retention", "retention"),
    ("reconciler", "reconciler"),
];

/// The names of [`LEASED_JOBS`], as the attempt log records their ticks.
pub fn leased_job_names() -> Vec<&'static str> {
    LEASED_JOBS.iter().map(|(job, _)| *job).collect()
}

/// The inbound email poller's name, the job every timer scenario watches most.
pub const POLLER: &str = "inbound-email-poller";

/// The first key of the host's two-key advisory locks, "WHLS" (`crates/store/src/lease.rs`).
const LEASE_NAMESPACE: i64 = 0x5748_4c53;

/// Settings every timer scenario gives its hosts: every tick written to the attempt log
/// (the ticks that ran, with their duration and end), so that the oracle can lay them side
/// by side.
pub fn attempt_log_env() -> Vec<(String, String)> {
    vec![(
        "WORKER_HOST__WORKERS__ATTEMPT_LOG__LOG_SUCCESSES".into(),
        "true".into(),
    )]
}

/// Settings for the two-replica scenarios: every tick written (as [`attempt_log_env`]), the
/// poller and the other leased jobs every second (the shortest interval a schedule may have;
/// their defaults are minutes), so that the replicas meet on every leased job many times a
/// repetition: both processes tick at the same second of the clock, so they contend for each
/// lease at every tick.
pub fn replica_env() -> Vec<(String, String)> {
    let mut env = attempt_log_env();
    for (key, every) in [
        ("INBOUND_EMAIL_POLLER__SCHEDULE", "every 1s"),
        ("DRAFT_EXPIRY__SCHEDULE", "every 1s"),
        ("DEAD_LETTER_ARCHIVE__SCHEDULE", "every 1s"),
        ("RETENTION__SCHEDULE", "every 1s"),
        ("RECONCILER__SCHEDULE", "every 1s"),
    ] {
        env.push((format!("WORKER_HOST__JOBS__{key}"), every.to_string()));
    }
    env
}

/// How the ticks of one job lay in time, from the attempt log.
#[derive(Debug, Clone, PartialEq)]
pub struct JobTicks {
    pub job: String,
    /// Ticks that ran (to an end or a failure) over all the scenario's processes.
    pub ran: i64,
    /// Ticks that began before an earlier one had ended, by more than the slack.
    pub overlapping: i64,
    /// The shortest time from the end of the latest tick to the start of the next, in
    /// milliseconds (below 0: an overlap); `None` with fewer than two ticks.
    pub min_gap_ms: Option<f64>,
}

/// The ticks of `jobs` that ran, over every host process of the scenario, laid out in time
/// from the attempt log (each tick's row: its end `at`, stamped after the lease was given
/// back, and its `duration_ms`, measured by the host from the moment its work began with the
/// lease held): how many began before an earlier tick of the same job had ended, by more than
/// `slack` (a task paused between giving the lease back and stamping its end, on a loaded
/// machine). A tick that failed while asking for its lease never ran and is left out.
pub async fn tick_overlaps(
    pool: &PgPool,
    jobs: &[&str],
    slack: Duration,
) -> anyhow::Result<Vec<JobTicks>> {
    let jobs: Vec<String> = jobs.iter().map(|j| j.to_string()).collect();
    let rows: Vec<(String, i64, i64, Option<f64>)> = sqlx::query_as(
        "WITH t AS ( \
             SELECT job, at - duration_ms * interval '1 millisecond' AS started, at AS ended \
             FROM attempt_log \
             WHERE tick IS NOT NULL AND is_final AND job = ANY($1) \
               AND (outcome = 'ran' OR (outcome = 'failed' \
                    AND coalesce(error, '') NOT LIKE 'acquiring the lease%' \
                    AND coalesce(error, '') NOT LIKE '%could not acquire its lease%'))), \
         w AS ( \
             SELECT job, started, max(ended) OVER ( \
                 PARTITION BY job ORDER BY started, ended \
                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before_end \
             FROM t) \
         SELECT job, count(*), \
             count(*) FILTER (WHERE before_end > started + $2 * interval '1 millisecond'), \
             min(extract(epoch FROM started - before_end) * 1000)::float8 \
         FROM w GROUP BY job ORDER BY job",
    )
    .bind(&jobs)
    .bind(slack.as_secs_f64() * 1000.0)
    .fetch_all(pool)
    .await
    .context("reading the ticks from the attempt log")?;
    Ok(rows
        .into_iter()
        .map(|(job, ran, overlapping, min_gap_ms)| JobTicks {
            job,
            ran,
            overlapping,
            min_gap_ms,
        })
        .collect())
}

/// `worker_ticks_total` of `job` with `outcome` on a host's `/metrics`.
pub async fn ticks(host: &HostProcess, job: &str, outcome: &str) -> anyhow::Result<u64> {
    let scrape = host.metrics().await?;
    Ok(metric_sum_with(
        &scrape,
        "worker_ticks_total",
        &[("job", job), ("outcome", outcome)],
    ) as u64)
}

/// A lease held now: the job and the client port of the session holding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLease {
    pub job: String,
    pub client_port: u16,
}

/// The leases of [`LEASED_JOBS`] held now on the scenario's database, from `pg_locks`.
pub async fn held_leases(pool: &PgPool) -> anyhow::Result<Vec<HeldLease>> {
    let jobs: Vec<&str> = leased_job_names();
    let keys: Vec<&str> = LEASED_JOBS.iter().map(|(_, key)| *key).collect();
    let rows: Vec<(String, i32)> = sqlx::query_as(
        "SELECT j.job, a.client_port \
         FROM unnest($1::text[], $3::text[]) AS j(job, key) \
         JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 \
              AND l.classid = $2::bigint::oid \
              AND l.objid = (hashtext(j.key)::bigint & 4294967295)::oid \
              AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE a.client_port IS NOT NULL",
    )
    .bind(&jobs)
    .bind(LEASE_NAMESPACE)
    .bind(&keys)
    .fetch_all(pool)
    .await
    .context("reading the held leases from pg_locks")?;
    Ok(rows
        .into_iter()
        .filter_map(|(job, port)| {
            Some(HeldLease {
                job,
                client_port: u16::try_from(port).ok()?,
            })
        })
        .collect())
}

/// The local TCP ports of the sockets process `pid` holds open (IPv4 and IPv6), from
/// `/proc/<pid>/fd` and `/proc/<pid>/net/tcp{,6}`: a database session's client port names
/// the process it belongs to.
pub fn local_ports(pid: u32) -> anyhow::Result<HashSet<u16>> {
    let mut inodes = HashSet::new();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .with_context(|| format!("listing /proc/{pid}/fd"))?;
    for fd in fds.flatten() {
        // A descriptor closed since the listing reads as an error: it is not a socket of ours.
        if let Ok(target) = std::fs::read_link(fd.path())
            && let Some(inode) = target
                .to_string_lossy()
                .strip_prefix("socket:[")
                .and_then(|rest| rest.strip_suffix(']'))
                .and_then(|n| n.parse::<u64>().ok())
        {
            inodes.insert(inode);
        }
    }
    let mut ports = HashSet::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        ports.extend(ports_of_inodes(&text, &inodes));
    }
    Ok(ports)
}

/// From a `/proc/net/tcp` table, the local ports of the rows whose inode is in `inodes`.
fn ports_of_inodes(table: &str, inodes: &HashSet<u64>) -> Vec<u16> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local = fields.get(1)?;
            let inode: u64 = fields.get(9)?.parse().ok()?;
            let (_, port) = local.rsplit_once(':')?;
            inodes
                .contains(&inode)
                .then(|| u16::from_str_radix(port, 16).ok())
                .flatten()
        })
        .collect()
}

/// Which of the scenario's running host processes holds `lease` (its session's client port
/// is one of the process's sockets), if any.
pub fn holder(run: &Run, lease: &HeldLease) -> Option<HostId> {
    run.host_ids().into_iter().find(|which| {
        run.process(*which)
            .and_then(|host| local_ports(host.pid()).ok())
            .is_some_and(|ports| ports.contains(&lease.client_port))
    })
}

/// The leases held over a stretch of time, sampled.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HolderSamples {
    /// Samples taken.
    pub samples: u64,
    /// Samples in which a leased job was held, by the first process and by a replica.
    pub held_by_first: u64,
    pub held_by_replica: u64,
    /// Times a job's holder was another process than at its previous held sample.
    pub handovers: u64,
    /// Samples in which one job was held by two sessions at once (PostgreSQL forbids it; a
    /// count above 0 would mean the lease is not the lock the host thinks it is).
    pub doubly_held: u64,
}

/// Samples which process holds each leased job every 20 ms for `length`.
pub async fn sample_holders(run: &Run, length: Duration) -> anyhow::Result<HolderSamples> {
    let mut out = HolderSamples::default();
    let mut last: std::collections::HashMap<String, HostId> = std::collections::HashMap::new();
    let end = tokio::time::Instant::now() + length;
    while tokio::time::Instant::now() < end {
        let held = held_leases(&run.db.pool).await?;
        out.samples += 1;
        let mut jobs_seen = HashSet::new();
        for lease in &held {
            if !jobs_seen.insert(lease.job.clone()) {
                out.doubly_held += 1;
            }
            // None: the session ended, or the process, between the two readings.
            let Some(which) = holder(run, lease) else {
                continue;
            };
            match which {
                HostId::First => out.held_by_first += 1,
                HostId::Replica(_) => out.held_by_replica += 1,
            }
            if last
                .insert(lease.job.clone(), which)
                .is_some_and(|was| was != which)
            {
                out.handovers += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ports_of_a_processs_sockets_are_read_from_the_tcp_table() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:9C40 0100007F:1538 01 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0000000000000000 20 4 30 10 -1\n\
   1: 0100007F:9C41 0100007F:1538 01 00000000:00000000 00:00000000 00000000  1000        0 4343 1 0000000000000000 20 4 30 10 -1\n";
        let inodes: HashSet<u64> = [4242].into_iter().collect();
        assert_eq!(ports_of_inodes(table, &inodes), vec![0x9C40]);
    }

    #[test]
    fn this_processs_own_socket_is_found() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let ports = local_ports(std::process::id()).unwrap();
        assert!(ports.contains(&port), "{port} not in {ports:?}");
    }
}
