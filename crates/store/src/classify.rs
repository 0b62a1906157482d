use worker_core::Failure;

/// Maps a sqlx error to a failure class, once for the whole code base.
///
/// Lost connections, pool timeouts, serialization failures, deadlocks, lock timeouts and a
/// server shutting down are transient; constraint violations, bad input and everything else
/// the server rejected are permanent.
pub fn classify_sqlx(err: &sqlx::Error) -> Failure {
    use sqlx::Error as E;
    let detail = worker_core::error_chain(err);
    match err {
        E::Io(_)
        | E::PoolTimedOut
        | E::PoolClosed
        | E::WorkerCrashed
        | E::Tls(_)
        | E::Protocol(_) => Failure::transient(detail),
        E::Database(db) => match db.code().as_deref() {
            // class 08: connection exception; 40001 serialization failure; 40P01 deadlock;
            // 55P03 lock not available; 57P01..57P03 admin shutdown, crash shutdown, cannot connect now;
            // 57014 query canceled (statement timeout); 53xxx insufficient resources.
            Some(code)
                if code.starts_with("08")
                    || code.starts_with("53")
                    || matches!(
                        code,
                        "40001" | "40P01" | "55P03" | "57P01" | "57P02" | "57P03" | "57014"
                    ) =>
            {
                Failure::transient(detail)
            }
            Some(code) if code.starts_with("23") => {
                Failure::permanent("constraint-violation", detail)
            }
            Some(_) | None => Failure::permanent("database-rejected", detail),
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
    use super::*;
    use worker_core::FailureClass;

    #[test]
    fn lost_connections_and_pool_timeouts_are_transient() {
        let io = sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset",
        ));
        assert_eq!(classify_sqlx(&io).class(), FailureClass::Transient);
        assert_eq!(
            classify_sqlx(&sqlx::Error::PoolTimedOut).class(),
            FailureClass::Transient
        );
    }

    #[test]
    fn row_not_found_is_permanent() {
        assert_eq!(
            classify_sqlx(&sqlx::Error::RowNotFound).class(),
            FailureClass::Permanent
        );
    }
}
