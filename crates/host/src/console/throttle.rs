//! How fast credentials may be tried, with governor's keyed rate limiters (GCRA):
//!
//! - per client address: [`ADDRESS_ATTEMPTS`] sign-ins a minute, and as many wrong `Bearer`
//!   tokens; past that the address is answered 429 until its budget refills. One address
//!   guessing therefore never slows down another (an IPv6 client counts by its /64, which one
//!   host usually holds whole);
//! - per account: sign-ins past a burst of [`ACCOUNT_BURST`] wait for their turn, one every
//!   [`ACCOUNT_PERIOD`]. An account is slowed down, never locked: whoever knows its password
//!   still gets in, a little later, while someone guesses at it from many addresses.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

/// Sign-ins (and wrong `Bearer` tokens) a client address may try in a minute.
pub const ADDRESS_ATTEMPTS: u32 = 10;
/// Sign-ins an account takes at once before each has to wait its turn.
pub const ACCOUNT_BURST: u32 = 5;
/// How often an account takes a sign-in past its burst.
pub const ACCOUNT_PERIOD: Duration = Duration::from_secs(1);
/// The longest a sign-in waits for its account's turn; past it the sign-in is answered 429,
/// to be tried again, so that a queue of guesses cannot hold a connection for ever.
pub const ACCOUNT_WAIT_MAX: Duration = Duration::from_secs(20);
/// Keys kept before the ones whose budget has refilled are dropped.
const KEYS_MAX: usize = 10_000;

/// Too many tries: when to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooMany {
    pub retry_after: Duration,
}

/// The limiters of one replica. Each replica counts on its own, so behind a load balancer an
/// address gets this budget at each of them.
#[derive(Debug)]
pub struct Throttle {
    addresses: DefaultKeyedRateLimiter<IpAddr>,
    accounts: DefaultKeyedRateLimiter<String>,
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
    /// `per_minute` tries an address; an account's `burst`, then one every `period`.
    pub fn new(per_minute: u32, burst: u32, period: Duration) -> Self {
        let per_minute = NonZeroU32::new(per_minute).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
        let account = Quota::with_period(period)
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(burst);
        Self {
            addresses: DefaultKeyedRateLimiter::keyed(Quota::per_minute(per_minute)),
            accounts: DefaultKeyedRateLimiter::keyed(account),
            clock: DefaultClock::default(),
        }
    }

    fn tidy(&self) {
        if self.addresses.len() > KEYS_MAX {
            self.addresses.retain_recent();
        }
        if self.accounts.len() > KEYS_MAX {
            self.accounts.retain_recent();
        }
    }

    /// Counts one try from `ip`: a sign-in, or a wrong `Bearer` token.
    pub fn address(&self, ip: IpAddr) -> Result<(), TooMany> {
        self.tidy();
        self.addresses
            .check_key(&address_key(ip))
            .map_err(|not_until| TooMany {
                retry_after: not_until.wait_time_from(self.clock.now()),
            })
    }

    /// Waits for `account`'s turn to be tried (at once within its burst).
    pub async fn account(&self, account: &str) -> Result<(), TooMany> {
        let key = account.to_lowercase();
        tokio::time::timeout(ACCOUNT_WAIT_MAX, self.accounts.until_key_ready(&key))
            .await
            .map_err(|_| TooMany {
                retry_after: ACCOUNT_PERIOD,
            })
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
            assert!(throttle.address(guesser).is_ok());
        }
        let refused = throttle.address(guesser).unwrap_err();
        assert!(refused.retry_after > Duration::ZERO);
        assert!(throttle.address("192.0.2.2".parse().unwrap()).is_ok());
    }

    #[test]
    fn an_ipv6_client_counts_by_its_64() {
        let throttle = Throttle::new(1, 1, ACCOUNT_PERIOD);
        assert!(throttle.address("2001:db8::1".parse().unwrap()).is_ok());
        assert!(throttle.address("2001:db8::2".parse().unwrap()).is_err());
        assert!(throttle.address("2001:db8:0:1::1".parse().unwrap()).is_ok());
    }

    #[tokio::test]
    async fn an_account_past_its_burst_waits_its_turn_and_is_not_refused() {
        let throttle = Throttle::new(100, 2, Duration::from_millis(200));
        let start = std::time::Instant::now();
        for _ in 0..3 {
            throttle.account("alice").await.unwrap();
        }
        assert!(
            start.elapsed() >= Duration::from_millis(150),
            "{:?}",
            start.elapsed()
        );
        let other = std::time::Instant::now();
        throttle.account("bob").await.unwrap();
        assert!(other.elapsed() < Duration::from_millis(100));
    }
}
