//! Waiting for a condition instead of sleeping on the wall clock: poll a probe until it gives
//! an answer, within a bound, and fail naming what was awaited and the probe's last word.

use std::future::Future;
use std::time::Duration;

use anyhow::bail;

/// How often [`eventually`] asks again.
pub const POLL: Duration = Duration::from_millis(50);

/// Runs `probe` every [`POLL`] until it returns `Some`, at most `within`; the error names
/// `what` and the probe's last error. A probe that has nothing to return answers
/// `Ok(cond.then_some(()))`.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut last = String::from("no error");
    loop {
        match probe().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(err) => last = format!("{err:#}"),
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("{what}: not within {within:?} (last: {last})");
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_condition_that_comes_true_is_waited_for() {
        let mut asked = 0;
        let got = eventually("the third answer", Duration::from_secs(1), || {
            asked += 1;
            let n = asked;
            async move { Ok((n == 3).then_some(n)) }
        })
        .await;
        assert_eq!(got.ok(), Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_condition_that_never_comes_true_fails_naming_it_and_the_last_error() {
        let err = eventually("the impossible", Duration::from_secs(1), || async {
            Err::<Option<()>, _>(anyhow::anyhow!("still no"))
        })
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(
            err.contains("the impossible") && err.contains("still no"),
            "{err}"
        );
    }
}
