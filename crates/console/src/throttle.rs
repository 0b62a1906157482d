//! How fast credentials may be tried. Nothing here waits: a try past its budget is refused at
//! once with the time to wait ([`TooMany`], answered `429 Retry-After`), so that a storm of
//! guesses holds no connection and no task, and the probes (`/healthz`, `/readyz`, never
//! throttled) keep answering through it.
//!
//! - per client address, in governor's keyed rate limiters (GCRA), two budgets that never
//!   touch each other: [`ADDRESS_ATTEMPTS`] sign-ins a minute, and as many wrong `Bearer`
//!   tokens (on `/api/`, `/metrics`, `/status`). A Prometheus with a stale scrape token
//!   therefore runs out of its own budget, never of the sign-ins of its address (an SSH
//!   tunnel's, say). One address guessing never slows down another (an IPv6 client counts by
//!   its /64, which one host usually holds whole). These count on each replica.
//! - per account: a burst of [`ACCOUNT_BURST`] sign-ins, then one every [`ACCOUNT_PERIOD`],
//!   counted in PostgreSQL ([`operators::take_sign_in_turn`]) so that every replica takes
//!   from the same budget. Whoever knows the password of an account under attack is refused
//!   too while the guesses keep its budget empty; the bootstrap token is checked before this
//!   budget (it is too long to guess), so an admin with it always gets in.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use sqlx::PgPool;
use worker_core::Failure;
use worker_store::operators::{self, SignInBudget};

/// Sign-ins a client address may try in a minute (and, apart, wrong `Bearer` tokens).
pub const ADDRESS_ATTEMPTS: u32 = 10;
/// Sign-ins an account takes at once before each has to wait its turn.
pub const ACCOUNT_BURST: u32 = 5;
/// How often an account takes a sign-in past its burst.
pub const ACCOUNT_PERIOD: Duration = Duration::from_secs(1);
/// Keys kept before the ones whose budget has refilled are dropped.
const KEYS_MAX: usize = 10_000;

/// Too many tries: when to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooMany {
    pub retry_after: Duration,
}

/// Why an account's sign-in may not go on.
#[derive(Debug)]
pub enum AccountRefusal {
    TooMany(TooMany),
    /// The shared budget could not be read.
    Store(Failure),
}

/// The throttle of one replica: its address budgets, and the shape of the shared account
/// budget.
#[derive(Debug)]
pub struct Throttle {
    sign_ins: DefaultKeyedRateLimiter<IpAddr>,
    tokens: DefaultKeyedRateLimiter<IpAddr>,
    account: SignInBudget,
    clock: DefaultClock,
}

impl Default for Throttle {
    fn default() -> Self {
        Self::new(ADDRESS_ATTEMPTS, ACCOUNT_BURST, ACCOUNT_PERIOD)
    }
}

/// An IPv6 address by its /64, an IPv4 address whole.
fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & (u128::MAX << 64);
            IpAddr::V6(prefix.into())
        }
    }
}

impl Throttle {
    /// `per_minute` tries an address (sign-ins, and apart wrong tokens); an account's
    /// `burst`, then one every `period`.
    pub fn new(per_minute: u32, burst: u32, period: Duration) -> Self {
        let per_minute = NonZeroU32::new(per_minute).unwrap_or(NonZeroU32::MIN);
        let quota = Quota::per_minute(per_minute);
        Self {
            sign_ins: DefaultKeyedRateLimiter::keyed(quota),
            tokens: DefaultKeyedRateLimiter::keyed(quota),
            account: SignInBudget {
                burst: burst.max(1),
                period: period.max(Duration::from_millis(1)),
            },
            clock: DefaultClock::default(),
        }
    }

    fn check(&self, limiter: &DefaultKeyedRateLimiter<IpAddr>, ip: IpAddr) -> Result<(), TooMany> {
        if limiter.len() > KEYS_MAX {
            limiter.retain_recent();
        }
        limiter
            .check_key(&address_key(ip))
            .map_err(|not_until| TooMany {
                retry_after: not_until.wait_time_from(self.clock.now()),
            })
    }

    /// Counts one sign-in from `ip`.
    pub fn sign_in(&self, ip: IpAddr) -> Result<(), TooMany> {
        self.check(&self.sign_ins, ip)
    }

    /// Counts one wrong `Bearer` token from `ip`.
    pub fn wrong_token(&self, ip: IpAddr) -> Result<(), TooMany> {
        self.check(&self.tokens, ip)
    }

    /// Takes `account`'s turn from its budget, shared by every replica; refused at once when
    /// it has none.
    pub async fn account(&self, pool: &PgPool, account: &str) -> Result<(), AccountRefusal> {
        let key = account.to_lowercase();
        match operators::take_sign_in_turn(pool, &key, self.account).await {
            Ok(None) => Ok(()),
            Ok(Some(retry_after)) => Err(AccountRefusal::TooMany(TooMany { retry_after })),
            Err(failure) => Err(AccountRefusal::Store(failure)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_past_its_budget_is_refused_and_another_is_not() {
        let throttle = Throttle::default();
        let guesser: IpAddr = "192.0.2.1".parse().unwrap();
        for _ in 0..ADDRESS_ATTEMPTS {
            assert!(throttle.sign_in(guesser).is_ok());
        }
        let refused = throttle.sign_in(guesser).unwrap_err();
        assert!(refused.retry_after > Duration::ZERO);
        assert!(throttle.sign_in("192.0.2.2".parse().unwrap()).is_ok());
    }

    #[test]
    fn an_ipv6_client_counts_by_its_64() {
        let throttle = Throttle::new(1, 1, ACCOUNT_PERIOD);
        assert!(throttle.sign_in("2001:db8::1".parse().unwrap()).is_ok());
        assert!(throttle.sign_in("2001:db8::2".parse().unwrap()).is_err());
        assert!(throttle.sign_in("2001:db8:0:1::1".parse().unwrap()).is_ok());
    }

    #[test]
    fn wrong_tokens_spend_a_budget_apart_from_the_sign_ins_of_their_address() {
        let throttle = Throttle::new(2, 1, ACCOUNT_PERIOD);
        let scraper: IpAddr = "192.0.2.7".parse().unwrap();
        assert!(throttle.wrong_token(scraper).is_ok());
        assert!(throttle.wrong_token(scraper).is_ok());
        assert!(throttle.wrong_token(scraper).is_err());
        assert!(throttle.sign_in(scraper).is_ok());
    }
}
