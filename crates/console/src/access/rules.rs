//! Who a request is and what it may do: the [`Caller`], its [`Signed`] account and
//! [`Credential`], each [`Refusal`], and the refusal of another site's requests.

use std::net::IpAddr;
use std::time::Duration;

use axum::http::HeaderMap;
use worker_store::audit::{Actor, Via};
use worker_store::operators::Role;

use super::request::same_secret;
use crate::forwarded::Client;
use crate::throttle::{AccountRefusal, TooMany};

/// An account, signed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    pub account: String,
    pub role: Role,
    /// The name the operator gave, for the bootstrap account (which anyone with the token is).
    pub given_name: Option<String>,
}

impl Signed {
    /// How pages show who is signed in: `alice`, or `bootstrap (alice)`.
    pub fn label(&self) -> String {
        match &self.given_name {
            Some(name) => format!("{} ({name})", self.account),
            None => self.account.clone(),
        }
    }
}

/// How a request proved who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    None,
    /// A console session, with the token its forms carry.
    Session {
        csrf: String,
    },
    /// An API token or the bootstrap token, as `Authorization: Bearer`.
    Bearer,
}

/// Who made a request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub client: Client,
    /// The connection's own peer (a proxy's address, when it came through one).
    pub peer: IpAddr,
    pub signed: Option<Signed>,
    pub credential: Credential,
    /// The id of a session made for this request (by the auth proxy's header): its cookie
    /// goes out with the answer.
    pub new_session: Option<String>,
    /// It asked the JSON API (`/api/...`), which answers JSON instead of pages.
    pub api: bool,
    pub(super) open_reading: bool,
}

/// Why a request may not go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("sign in first")]
    NotSignedIn,
    #[error("the form's CSRF token does not match this session: reload the page and try again")]
    BadCsrf,
    #[error("a request from another site is refused")]
    CrossSite,
    #[error("too many tries from this address or for this account: try again in {} s", .0.as_secs().max(1))]
    Throttled(Duration),
    #[error("the account name or the password is wrong")]
    WrongPassword,
    #[error("the API token is wrong, or its account is disabled")]
    WrongToken,
    #[error("the account `{account}` is a {role}: this needs an {needed}")]
    Role {
        account: String,
        role: Role,
        needed: Role,
    },
    #[error(
        "the sign-in proxy names `{0}`, which is no enabled account here: ask an admin to make it (worker-host operators add)"
    )]
    NoAccount(String),
    #[error(
        "the sign-in proxy names `bootstrap`, the account of admin.operator_token, which no proxied user may become: sign in with the token on the sign-in form instead"
    )]
    ProxyBootstrap,
    #[error("checking who you are failed: {0}")]
    Unavailable(String),
}

impl From<AccountRefusal> for Refusal {
    fn from(refusal: AccountRefusal) -> Self {
        match refusal {
            AccountRefusal::TooMany(too_many) => too_many.into(),
            AccountRefusal::Store(failure) => failure.into(),
        }
    }
}

impl From<TooMany> for Refusal {
    fn from(too_many: TooMany) -> Self {
        Self::Throttled(too_many.retry_after)
    }
}

impl From<worker_core::Failure> for Refusal {
    fn from(failure: worker_core::Failure) -> Self {
        Self::Unavailable(failure.to_string())
    }
}

impl Caller {
    /// May this request read pages and the API?
    pub fn may_read(&self) -> Result<(), Refusal> {
        if self.signed.is_some() || (self.open_reading && !self.client.forwarded) {
            Ok(())
        } else {
            Err(Refusal::NotSignedIn)
        }
    }

    /// Whether this caller's role may act (the pages show action buttons to it).
    pub fn acts(&self) -> bool {
        self.signed
            .as_ref()
            .is_some_and(|s| s.role >= Role::Operator)
    }

    /// The session's CSRF token, for its forms.
    pub fn csrf(&self) -> Option<&str> {
        match &self.credential {
            Credential::Session { csrf } => Some(csrf),
            Credential::None | Credential::Bearer => None,
        }
    }

    /// Who the audit trail says acted.
    pub fn actor(&self) -> Actor {
        let via = match self.credential {
            Credential::Bearer => Via::Api,
            Credential::None | Credential::Session { .. } => Via::Console,
        };
        let from = self.client.label(self.peer);
        match &self.signed {
            Some(signed) => Actor::account(signed.account.clone(), from, via)
                .with_name(signed.given_name.clone()),
            None => Actor::new(via.as_str(), from),
        }
    }

    /// May this request act, as a role of at least `needed`? From a session it needs the
    /// session's CSRF token in `csrf` and no sign that another site sent it.
    pub fn may_act_as(
        &self,
        needed: Role,
        headers: &HeaderMap,
        csrf: &str,
    ) -> Result<Actor, Refusal> {
        let signed = self.signed.as_ref().ok_or(Refusal::NotSignedIn)?;
        match &self.credential {
            Credential::Bearer => {}
            Credential::Session { csrf: expected } => {
                refuse_cross_site(headers)?;
                if !same_secret(expected, csrf) {
                    return Err(Refusal::BadCsrf);
                }
            }
            Credential::None => return Err(Refusal::NotSignedIn),
        }
        if signed.role < needed {
            return Err(Refusal::Role {
                account: signed.account.clone(),
                role: signed.role,
                needed,
            });
        }
        Ok(self.actor())
    }

    /// [`Caller::may_act_as`] an operator.
    pub fn may_act(&self, headers: &HeaderMap, csrf: &str) -> Result<Actor, Refusal> {
        self.may_act_as(Role::Operator, headers, csrf)
    }
}

/// Refuses what a browser says another site sent (`Sec-Fetch-Site: cross-site`) or whose
/// `Origin` is not the host it was sent to. SameSite=Strict cookies already keep another
/// site's forms from carrying a session; this keeps them from reaching the sign-in.
pub(super) fn refuse_cross_site(headers: &HeaderMap) -> Result<(), Refusal> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if header("sec-fetch-site") == Some("cross-site") {
        return Err(Refusal::CrossSite);
    }
    if let (Some(origin), Some(host)) = (header("origin"), header("host")) {
        let origin_host = origin
            .split_once("://")
            .map_or(origin, |(_, rest)| rest)
            .trim_end_matches('/');
        if origin != "null" && !origin_host.eq_ignore_ascii_case(host) {
            return Err(Refusal::CrossSite);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use worker_store::operators::BOOTSTRAP;

    use super::*;

    fn caller(role: Option<Role>, credential: Credential, open_reading: bool) -> Caller {
        Caller {
            client: Client {
                ip: "127.0.0.1".parse().unwrap(),
                proxied: false,
                tls: false,
                forwarded: false,
            },
            peer: "127.0.0.1".parse().unwrap(),
            signed: role.map(|role| Signed {
                account: "alice".into(),
                role,
                given_name: None,
            }),
            credential,
            new_session: None,
            api: false,
            open_reading,
        }
    }

    fn session(csrf: &str) -> Credential {
        Credential::Session { csrf: csrf.into() }
    }

    #[test]
    fn a_session_acts_only_with_its_own_csrf_token() {
        let alice = caller(Some(Role::Operator), session("right"), false);
        let actor = alice.may_act(&HeaderMap::new(), "right").unwrap();
        assert_eq!(actor.account.as_deref(), Some("alice"));
        assert_eq!(actor.via, Via::Console);
        assert_eq!(
            alice.may_act(&HeaderMap::new(), "forged"),
            Err(Refusal::BadCsrf)
        );
    }

    #[test]
    fn a_viewer_reads_but_never_acts() {
        let viewer = caller(Some(Role::Viewer), session("right"), false);
        assert!(viewer.may_read().is_ok());
        assert!(!viewer.acts());
        assert!(matches!(
            viewer.may_act(&HeaderMap::new(), "right"),
            Err(Refusal::Role {
                needed: Role::Operator,
                ..
            })
        ));
    }

    #[test]
    fn a_bearer_acts_without_a_csrf_token_and_is_recorded_as_the_api() {
        let script = caller(Some(Role::Operator), Credential::Bearer, false);
        let actor = script.may_act(&HeaderMap::new(), "").unwrap();
        assert_eq!(actor.via, Via::Api);
        assert_eq!(actor.label(), "alice (api from 127.0.0.1)");
    }

    #[test]
    fn nobody_signed_in_reads_only_with_open_reading_and_never_through_a_proxy() {
        assert_eq!(
            caller(None, Credential::None, false).may_read(),
            Err(Refusal::NotSignedIn)
        );
        let open = caller(None, Credential::None, true);
        assert!(open.may_read().is_ok());
        let mut forwarded = open.clone();
        forwarded.client.forwarded = true;
        assert_eq!(forwarded.may_read(), Err(Refusal::NotSignedIn));
        assert_eq!(
            open.may_act(&HeaderMap::new(), ""),
            Err(Refusal::NotSignedIn)
        );
    }

    #[test]
    fn the_bootstrap_accounts_label_carries_the_name_given() {
        let signed = Signed {
            account: BOOTSTRAP.into(),
            role: Role::Admin,
            given_name: Some("alice".into()),
        };
        assert_eq!(signed.label(), "bootstrap (alice)");
    }

    #[test]
    fn another_sites_request_is_refused() {
        let mut headers = HeaderMap::new();
        headers.insert("host", "127.0.0.1:9180".parse().unwrap());
        headers.insert("origin", "http://127.0.0.1:9180".parse().unwrap());
        assert!(refuse_cross_site(&headers).is_ok());
        headers.insert("origin", "https://evil.example".parse().unwrap());
        assert_eq!(refuse_cross_site(&headers), Err(Refusal::CrossSite));
        let mut fetch = HeaderMap::new();
        fetch.insert("sec-fetch-site", "cross-site".parse().unwrap());
        assert_eq!(refuse_cross_site(&fetch), Err(Refusal::CrossSite));
        let alice = caller(Some(Role::Operator), session("right"), false);
        assert_eq!(alice.may_act(&fetch, "right"), Err(Refusal::CrossSite));
    }
}
