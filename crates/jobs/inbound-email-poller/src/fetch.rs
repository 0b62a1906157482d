//! The FETCH commands of a poll, each made sure of: async-imap ends a FETCH's answer alike
//! at the server's tagged reply and at a dropped connection, so an answer without what was
//! asked is only taken as "not there" once a NOOP confirmed the server answered.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use futures::TryStreamExt;

use crate::imap::{self, Session};

/// The most header bytes fetched of a mail over the size limit.
pub(crate) const MAX_HEADER_BYTES: u32 = 64 * 1024;

/// `UID FETCH <uids> (UID INTERNALDATE)`: when each message still there arrived.
pub(crate) async fn fetch_arrivals(
    session: &mut Session,
    uids: &[u32],
) -> Result<HashMap<u32, DateTime<Utc>>, async_imap::error::Error> {
    let fetches: Vec<_> = session
        .uid_fetch(imap::uid_set(uids), "(UID INTERNALDATE)")
        .await?
        .try_collect()
        .await?;
    let arrived: HashMap<u32, DateTime<Utc>> = fetches
        .iter()
        .filter_map(|f| Some((f.uid?, f.internal_date()?.with_timezone(&Utc))))
        .collect();
    if arrived.len() < uids.len() {
        // Missing ones count as new; make sure the answer was the server's (see
        // `confirm_answered`), not a connection that closed in the middle of it.
        confirm_answered(session).await?;
    }
    Ok(arrived)
}

/// `UID FETCH <uids> (UID RFC822.SIZE)`: the size of each message still there.
pub(crate) async fn fetch_sizes(
    session: &mut Session,
    uids: &[u32],
) -> Result<HashMap<u32, u32>, async_imap::error::Error> {
    let fetches: Vec<_> = session
        .uid_fetch(imap::uid_set(uids), "(UID RFC822.SIZE)")
        .await?
        .try_collect()
        .await?;
    let sizes: HashMap<u32, u32> = fetches
        .iter()
        .filter_map(|f| Some((f.uid?, f.size?)))
        .collect();
    if sizes.len() < uids.len() {
        // A message without its size is taken as gone (and skipped past): make sure the
        // answer was the server's, not a connection that closed in the middle of it.
        confirm_answered(session).await?;
    }
    Ok(sizes)
}

/// After a FETCH that came back without what was asked: async-imap ends a FETCH's stream
/// alike at the server's tagged answer and at the connection's end (EOF, a BYE before it),
/// so a dropped connection reads as "no such message", and the poller would skip past mail
/// it never read. A NOOP whose tagged OK must be read tells the two apart: on a connection
/// that is gone it fails (`ConnectionLost` or an I/O error, not held against the message).
pub(crate) async fn confirm_answered(
    session: &mut Session,
) -> Result<(), async_imap::error::Error> {
    session.run_command_and_check_ok("NOOP").await
}

#[derive(Clone, Copy)]
pub(crate) enum Part {
    Header,
    Body,
}

/// Fetches one part of one message by UID; `None` when the message is gone.
pub(crate) async fn fetch_one(
    session: &mut Session,
    uid: u32,
    query: &str,
    part: Part,
) -> Result<Option<Vec<u8>>, async_imap::error::Error> {
    let fetches: Vec<_> = session
        .uid_fetch(uid.to_string(), format!("(UID {query})"))
        .await?
        .try_collect()
        .await?;
    let found = fetches
        .iter()
        .filter(|f| f.uid == Some(uid))
        .find_map(|f| match part {
            Part::Header => f.header(),
            Part::Body => f.body(),
        })
        .map(<[u8]>::to_vec);
    if found.is_none() {
        confirm_answered(session).await?;
    }
    Ok(found)
}

/// `UID FETCH <first>:* (UID RFC822.SIZE)`: the messages from UID `first` on, with their
/// sizes, in UID order; the IDLE session's one command for "what is new" (where the tick
/// searches, then fetches the sizes). `first:*` also matches the last message when none is
/// newer (RFC 3501 6.4.8): only UIDs from `first` on are kept. An answer cut short by a lost
/// connection reads as fewer messages: the ones left out come after those listed (a FETCH
/// answers in sequence, so UID, order), and the last UID moves only as far as those read.
pub(crate) async fn fetch_new_sizes(
    session: &mut Session,
    first: u32,
) -> Result<Vec<(u32, u32)>, async_imap::error::Error> {
    let fetches: Vec<_> = session
        .uid_fetch(format!("{first}:*"), "(UID RFC822.SIZE)")
        .await?
        .try_collect()
        .await?;
    let mut sizes: Vec<(u32, u32)> = fetches
        .iter()
        .filter_map(|f| Some((f.uid?, f.size?)))
        .filter(|(uid, _)| *uid >= first)
        .collect();
    sizes.sort_unstable();
    sizes.dedup_by_key(|(uid, _)| *uid);
    Ok(sizes)
}

/// `UID FETCH <uids> (UID BODY.PEEK[])`: the bodies of several messages in one command (not
/// marked seen). A message missing from the answer is left out, not taken as gone: it is
/// then fetched on its own, which makes sure of that (see [`fetch_one`]).
pub(crate) async fn fetch_bodies(
    session: &mut Session,
    uids: &[u32],
) -> Result<HashMap<u32, Vec<u8>>, async_imap::error::Error> {
    let mut answers = session
        .uid_fetch(imap::uid_set(uids), "(UID BODY.PEEK[])")
        .await?;
    // Each answer is dropped once its body is copied out: a batch's bytes are held once.
    let mut bodies = HashMap::with_capacity(uids.len());
    while let Some(fetch) = answers.try_next().await? {
        if let (Some(uid), Some(body)) = (fetch.uid, fetch.body())
            && uids.binary_search(&uid).is_ok()
        {
            bodies.insert(uid, body.to_vec());
        }
    }
    Ok(bodies)
}
