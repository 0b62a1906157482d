//! Properties of the retry delay schedule that must hold for any settings an operator writes.

use std::time::Duration;

use proptest::prelude::*;
use worker_core::RetryPolicy;

/// Durations from zero up to far beyond anything sensible, including the extremes.
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0u64..120_000).prop_map(Duration::from_millis),
        (0u64..u64::MAX, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        Just(Duration::ZERO),
        Just(Duration::MAX),
    ]
}

/// Any f64 at all: NaN, infinities, negatives, subnormals, huge.
fn any_factor() -> impl Strategy<Value = f64> {
    prop_oneof![
        1.0f64..10.0,
        any::<f64>(),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(0.0)
    ]
}

fn attempt() -> impl Strategy<Value = u32> {
    prop_oneof![0u32..64, any::<u32>(), Just(u32::MAX), Just(u32::MAX - 1)]
}

fn any_policy() -> impl Strategy<Value = RetryPolicy> {
    (
        any::<u32>(),
        duration(),
        any_factor(),
        duration(),
        any::<bool>(),
    )
        .prop_map(
            |(max_tries, base_delay, factor, max_delay, jitter)| RetryPolicy {
                max_tries,
                base_delay,
                factor,
                max_delay,
                jitter,
            },
        )
}

/// Policies that pass `validate`, so the schedule is the documented one.
fn valid_policy() -> impl Strategy<Value = RetryPolicy> {
    (0u32..20, 0u64..10_000, 1.0f64..8.0, 0u64..600_000).prop_map(
        |(max_tries, base, factor, extra)| RetryPolicy {
            max_tries,
            base_delay: Duration::from_millis(base),
            factor,
            max_delay: Duration::from_millis(base + extra),
            jitter: false,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn the_first_attempt_never_waits(policy in any_policy()) {
        prop_assert_eq!(policy.delay_for(0), Duration::ZERO);
        prop_assert_eq!(policy.delay_for(1), Duration::ZERO);
        prop_assert_eq!(policy.jittered_delay_for(1), Duration::ZERO);
    }

    #[test]
    fn tries_is_at_least_one(policy in any_policy()) {
        prop_assert!(policy.tries() >= 1);
        prop_assert_eq!(policy.tries(), policy.max_tries.max(1));
    }

    #[test]
    fn delays_never_exceed_the_cap(policy in any_policy(), a in attempt()) {
        prop_assert!(policy.delay_for(a) <= policy.max_delay, "{:?} > cap {:?}", policy.delay_for(a), policy.max_delay);
        prop_assert!(policy.jittered_delay_for(a) <= policy.max_delay);
    }

    #[test]
    fn delays_never_decrease(policy in any_policy(), a in attempt(), step in 1u32..1_000) {
        let later = a.saturating_add(step);
        prop_assert!(
            policy.delay_for(a) <= policy.delay_for(later),
            "delay_for({a}) = {:?} > delay_for({later}) = {:?}", policy.delay_for(a), policy.delay_for(later)
        );
        if a < u32::MAX {
            prop_assert!(policy.delay_for(a) <= policy.delay_for(a + 1));
        }
    }

    #[test]
    fn delay_for_never_panics(
        base_delay in duration(), max_delay in duration(), factor in any::<f64>(), a in any::<u32>(), jitter in any::<bool>()
    ) {
        let policy = RetryPolicy { max_tries: a, base_delay, factor, max_delay, jitter };
        let d = policy.delay_for(a);
        let j = policy.jittered_delay_for(a);
        prop_assert!(j <= d && j >= d / 2);
        let _ = policy.validate();
    }

    #[test]
    fn valid_policies_follow_the_formula(policy in valid_policy(), a in 2u32..40) {
        prop_assert_eq!(policy.validate(), Ok(()));
        let expected = policy.base_delay.as_secs_f64() * policy.factor.powi(a as i32 - 2);
        let got = policy.delay_for(a).as_secs_f64();
        let cap = policy.max_delay.as_secs_f64();
        if expected >= cap {
            prop_assert_eq!(policy.delay_for(a), policy.max_delay);
        } else {
            prop_assert!((got - expected).abs() <= expected * 1e-9 + 1e-9, "{got} vs {expected}");
        }
        prop_assert_eq!(policy.delay_for(2), policy.base_delay);
    }

    #[test]
    fn jitter_stays_within_equal_jitter_bounds(policy in valid_policy(), a in 0u32..40) {
        let policy = RetryPolicy { jitter: true, ..policy };
        let d = policy.delay_for(a);
        let j = policy.jittered_delay_for(a);
        prop_assert!(j >= d / 2 && j <= d, "{j:?} outside [{:?}, {d:?}]", d / 2);
    }
}
