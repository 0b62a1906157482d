use worker_core::Failure;

/// Maps a sqlx error to a failure class, once for the whole code base.
///
/// The rule: **only an error that cannot heal is permanent**; everything else, including every
/// error this table does not name, is transient, and the attempt budget (in-process tries,
/// then the broker's retry tiers, then a dead letter saying `gave-up`) bounds it. A permanent
/// failure dead-letters its message at once, so a wrong "permanent" loses work that a later
/// try would have done (an idle-in-transaction timeout, a failover, a table that a rolling
/// migration has not created yet), while a wrong "transient" only costs a few tries.
///
/// | error | class | reason |
/// |---|---|---|
/// | SQLSTATE class `22` (data exception: a value too long, out of range, not valid for its type) | permanent | `data-exception` |
/// | SQLSTATE class `23` (integrity constraint violation: not null, foreign key, unique, check, exclusion) | permanent | `constraint-violation` |
/// | SQLSTATE `42601` syntax error, `42804` datatype mismatch, `42883` undefined function or operator, `42846` cannot coerce, `42P18` indeterminate datatype | permanent | `invalid-statement` |
/// | a row, column or value that does not decode (`ColumnDecode`, `Decode`, `ColumnNotFound`, `ColumnIndexOutOfBounds`, `TypeNotFound`) | permanent | `database-decode` |
/// | `RowNotFound` (a query that must return a row returned none) | permanent | `row-not-found` |
/// | every other SQLSTATE, e.g. class `08` connection exception, `25P03` idle-in-transaction timeout, `40001` serialization failure, `40P01` deadlock, class `53` insufficient resources, `55P03` lock not available, `57014` query canceled, `57P01` admin shutdown, `XX000` internal error, `42P01` undefined table, `42703` undefined column (a rolling migration), `25006` read-only transaction (a failover) | transient | `transient` |
/// | a database error without a SQLSTATE | transient | `transient` |
/// | I/O, TLS and protocol errors, `PoolTimedOut`, `PoolClosed`, `WorkerCrashed`, anything else | transient | `transient` |
///
/// Callers that know better for one statement decide for themselves before calling this
/// (the trigger, for instance, skips an automation deleted while its event was in flight
/// instead of failing the event on the foreign key).
pub fn classify_sqlx(err: &sqlx::Error) -> Failure {
    use sqlx::Error as E;
    let detail = worker_core::error_chain(err);
    match err {
        E::Database(db) => match db.code().as_deref() {
            Some(code) if code.starts_with("22") => Failure::permanent("data-exception", detail),
            Some(code) if code.starts_with("23") => {
                Failure::permanent("constraint-violation", detail)
            }
            Some("42601" | "42804" | "42883" | "42846" | "42P18") => {
                Failure::permanent("invalid-statement", detail)
            }
            Some(_) | None => Failure::transient(detail),
        },
        E::RowNotFound => Failure::permanent("row-not-found", detail),
        E::ColumnDecode { .. }
        | E::Decode(_)
        | E::TypeNotFound { .. }
        | E::ColumnNotFound(_)
        | E::ColumnIndexOutOfBounds { .. } => Failure::permanent("database-decode", detail),
        _ => Failure::transient(detail),
    }
}

/// Shorthand for `.map_err(classify)`.
pub fn classify(err: sqlx::Error) -> Failure {
    classify_sqlx(&err)
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::fmt;

    use sqlx::error::{DatabaseError, ErrorKind};
    use worker_core::FailureClass;

    use super::*;

    /// A server error with a chosen SQLSTATE, as the driver would hand it over.
    #[derive(Debug)]
    struct Sqlstate(&'static str);

    impl fmt::Display for Sqlstate {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "server error {}", self.0)
        }
    }

    impl std::error::Error for Sqlstate {}

    impl DatabaseError for Sqlstate {
        fn message(&self) -> &str {
            "server error"
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.0))
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> ErrorKind {
            ErrorKind::Other
        }
    }

    fn sqlstate(code: &'static str) -> (FailureClass, String) {
        let failure = classify_sqlx(&sqlx::Error::Database(Box::new(Sqlstate(code))));
        (failure.class(), failure.reason().to_string())
    }

    fn transient() -> (FailureClass, String) {
        (FailureClass::Transient, "transient".into())
    }

    fn permanent(reason: &str) -> (FailureClass, String) {
        (FailureClass::Permanent, reason.into())
    }

    #[test]
    fn lost_connections_and_pool_timeouts_are_transient() {
        let io = sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset",
        ));
        assert_eq!(classify_sqlx(&io).class(), FailureClass::Transient);
        for err in [
            sqlx::Error::PoolTimedOut,
            sqlx::Error::PoolClosed,
            sqlx::Error::WorkerCrashed,
            sqlx::Error::Protocol("unexpected message".into()),
        ] {
            assert_eq!(
                classify_sqlx(&err).class(),
                FailureClass::Transient,
                "{err}"
            );
        }
    }

    #[test]
    fn errors_that_heal_are_transient() {
        for code in [
            // connection exceptions, serialization failure, deadlock, lock not available
            "08006", "08003", "40001", "40P01", "55P03",
            // idle-in-transaction and idle-session timeouts
            "25P03", "57P05",
            // admin shutdown, crash shutdown, cannot connect now, query canceled
            "57P01", "57P02", "57P03", "57014",
            // insufficient resources: disk full, out of memory, too many connections
            "53100", "53200", "53300",
            // an internal error, a table or column missing during a rolling migration
            "XX000", "42P01", "42703",
            // read-only transaction (a failover in progress), insufficient privilege
            "25006", "42501", // anything the table does not name
            "P0001", "0A000", "99999",
        ] {
            assert_eq!(sqlstate(code), transient(), "SQLSTATE {code}");
        }
        let no_code = sqlx::Error::Protocol("no SQLSTATE".into());
        assert_eq!(classify_sqlx(&no_code).class(), FailureClass::Transient);
    }

    #[test]
    fn errors_that_cannot_heal_are_permanent() {
        for code in ["22001", "22003", "22P02", "22007", "22021"] {
            assert_eq!(
                sqlstate(code),
                permanent("data-exception"),
                "SQLSTATE {code}"
            );
        }
        for code in ["23502", "23503", "23505", "23514", "23P01"] {
            assert_eq!(
                sqlstate(code),
                permanent("constraint-violation"),
                "SQLSTATE {code}"
            );
        }
        for code in ["42601", "42804", "42883", "42846", "42P18"] {
            assert_eq!(
                sqlstate(code),
                permanent("invalid-statement"),
                "SQLSTATE {code}"
            );
        }
    }

    #[test]
    fn decode_errors_and_a_missing_row_are_permanent() {
        assert_eq!(
            classify_sqlx(&sqlx::Error::RowNotFound).reason(),
            "row-not-found"
        );
        let decode = sqlx::Error::ColumnDecode {
            index: "0".into(),
            source: "not a uuid".into(),
        };
        assert_eq!(
            (
                classify_sqlx(&decode).class(),
                classify_sqlx(&decode).reason()
            ),
            (FailureClass::Permanent, "database-decode")
        );
        for err in [
            sqlx::Error::Decode("bad bytes".into()),
            sqlx::Error::ColumnNotFound("status".into()),
            sqlx::Error::ColumnIndexOutOfBounds { index: 3, len: 2 },
            sqlx::Error::TypeNotFound {
                type_name: "mood".into(),
            },
        ] {
            assert_eq!(classify_sqlx(&err).reason(), "database-decode", "{err}");
        }
    }
}
