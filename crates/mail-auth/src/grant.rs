//! One token request of each flow. Client credentials and the refresh token go through the
//! `oauth2` crate; the service account's JWT bearer grant (RFC 7523), which that crate does
//! not offer, is posted here. The HTTP is ours in both, so that a 5xx or a 429 (transient)
//! is told apart from a refusal of the settings (permanent).

use std::pin::Pin;
use std::time::Duration;

use oauth2::basic::{BasicClient, BasicErrorResponse};
use oauth2::{
    AuthType, ClientId, ClientSecret, RefreshToken, RequestTokenError, Scope, TokenResponse,
    TokenUrl,
};
use serde::Deserialize;
use worker_core::{Secret, error_chain};

use crate::TokenError;
use crate::error::is_settings_code;
use crate::jwt::ServiceKey;

/// What one request asks for.
#[derive(Debug)]
pub(crate) enum Grant {
    ClientCredentials {
        client_id: String,
        secret: Secret,
    },
    RefreshToken {
        client_id: String,
        secret: Option<Secret>,
        refresh_token: Secret,
    },
    ServiceAccount {
        key: Box<ServiceKey>,
        subject: String,
    },
}

/// A token as the endpoint issued it.
pub(crate) struct Issued {
    pub token: Secret,
    /// `expires_in`, when the endpoint said.
    pub lifetime: Option<Duration>,
}

/// What the HTTP layer reports besides a response the `oauth2` crate reads.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpError {
    #[error("{0}")]
    Send(String),
    /// A 5xx or a 429: the endpoint is away or throttles us.
    #[error("HTTP {status}{}", body_text(.body))]
    Away {
        status: u16,
        retry_after: Option<Duration>,
        body: String,
    },
    /// Another status whose body is no OAuth2 error (a wrong URL's 404 page).
    #[error("HTTP {status}{}", body_text(.body))]
    Refused { status: u16, body: String },
}

fn body_text(body: &str) -> String {
    let body = body.trim();
    if body.is_empty() {
        String::new()
    } else {
        format!(": {}", body.chars().take(200).collect::<String>())
    }
}

pub(crate) struct Endpoint<'a> {
    pub source: &'a str,
    pub token_url: &'a str,
    pub scope: &'a str,
    pub http: &'a reqwest::Client,
}

impl Endpoint<'_> {
    pub(crate) async fn request(&self, grant: &Grant) -> Result<Issued, TokenError> {
        match grant {
            Grant::ClientCredentials { client_id, secret } => {
                let client = self.client(client_id, Some(secret))?;
                let request = client
                    .exchange_client_credentials()
                    .add_scopes(self.scopes());
                let answer = request.request_async(&Http(self.http.clone())).await;
                self.read(answer)
            }
            Grant::RefreshToken {
                client_id,
                secret,
                refresh_token,
            } => {
                let client = self.client(client_id, secret.as_ref())?;
                let refresh = RefreshToken::new(refresh_token.expose().to_string());
                let request = client
                    .exchange_refresh_token(&refresh)
                    .add_scopes(self.scopes());
                let answer = request.request_async(&Http(self.http.clone())).await;
                self.read(answer)
            }
            Grant::ServiceAccount { key, subject } => self.jwt_bearer(key, subject).await,
        }
    }

    fn scopes(&self) -> Vec<Scope> {
        self.scope
            .split_whitespace()
            .map(|s| Scope::new(s.to_string()))
            .collect()
    }

    fn client(
        &self,
        client_id: &str,
        secret: Option<&Secret>,
    ) -> Result<
        BasicClient<
            oauth2::EndpointNotSet,
            oauth2::EndpointNotSet,
            oauth2::EndpointNotSet,
            oauth2::EndpointNotSet,
            oauth2::EndpointSet,
        >,
        TokenError,
    > {
        let url = TokenUrl::new(self.token_url.to_string()).map_err(|e| self.setup(e))?;
        let mut client = BasicClient::new(ClientId::new(client_id.to_string()))
            .set_token_uri(url)
            // Both providers take the secret in the body; Microsoft takes no Basic auth for
            // every app type.
            .set_auth_type(AuthType::RequestBody);
        if let Some(secret) = secret {
            client = client.set_client_secret(ClientSecret::new(secret.expose().to_string()));
        }
        Ok(client)
    }

    fn setup(&self, detail: impl std::fmt::Display) -> TokenError {
        TokenError::Setup {
            source_name: self.source.to_string(),
            detail: detail.to_string(),
        }
    }

    fn read<T: TokenResponse>(
        &self,
        answer: Result<T, RequestTokenError<HttpError, BasicErrorResponse>>,
    ) -> Result<Issued, TokenError> {
        match answer {
            Ok(token) => Ok(Issued {
                token: Secret::new(token.access_token().secret().clone()),
                lifetime: token.expires_in(),
            }),
            Err(RequestTokenError::ServerResponse(refusal)) => Err(self.refusal(
                refusal.error().as_ref(),
                refusal.error_description().cloned(),
            )),
            Err(RequestTokenError::Request(err)) => Err(self.http_error(err)),
            // Not the body: an answer that failed to parse may still hold a token.
            Err(RequestTokenError::Parse(err, _body)) => Err(TokenError::Settings {
                source_name: self.source.to_string(),
                code: "unreadable answer".into(),
                description: Some(error_chain(&err)),
            }),
            Err(RequestTokenError::Other(detail)) => Err(TokenError::Settings {
                source_name: self.source.to_string(),
                code: "unreadable answer".into(),
                description: Some(detail),
            }),
        }
    }

    fn refusal(&self, code: &str, description: Option<String>) -> TokenError {
        if is_settings_code(code) {
            TokenError::Settings {
                source_name: self.source.to_string(),
                code: code.to_string(),
                description,
            }
        } else {
            TokenError::Unavailable {
                source_name: self.source.to_string(),
                detail: format!(
                    "the endpoint answered `{code}`{}",
                    description.map(|d| format!(": {d}")).unwrap_or_default()
                ),
                retry_after: None,
            }
        }
    }

    fn http_error(&self, err: HttpError) -> TokenError {
        match err {
            HttpError::Refused { status, .. } => TokenError::Settings {
                source_name: self.source.to_string(),
                code: format!("HTTP {status}"),
                description: Some(format!("{err} from {}: check token_url", self.token_url)),
            },
            HttpError::Away { retry_after, .. } => TokenError::Unavailable {
                source_name: self.source.to_string(),
                detail: err.to_string(),
                retry_after,
            },
            HttpError::Send(detail) => TokenError::Unavailable {
                source_name: self.source.to_string(),
                detail,
                retry_after: None,
            },
        }
    }

    /// RFC 7523: a signed assertion exchanged for a token.
    async fn jwt_bearer(&self, key: &ServiceKey, subject: &str) -> Result<Issued, TokenError> {
        let assertion = key
            .assertion(subject, self.scope, self.token_url)
            .map_err(|e| self.setup(e))?;
        let body = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer")
            .append_pair("assertion", &assertion)
            .finish();
        let request = http::Request::builder()
            .method(http::Method::POST)
            .uri(self.token_url)
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .header(http::header::ACCEPT, "application/json")
            .body(body.into_bytes())
            .map_err(|e| self.setup(e))?;
        let response = send(self.http, request)
            .await
            .map_err(|e| self.http_error(e))?;
        #[derive(Deserialize)]
        struct Answer {
            access_token: Option<String>,
            expires_in: Option<u64>,
            error: Option<String>,
            error_description: Option<String>,
        }
        let answer: Answer = serde_json::from_slice(response.body()).map_err(|e| {
            self.http_error(HttpError::Refused {
                status: response.status().as_u16(),
                body: format!("{e}"),
            })
        })?;
        match (answer.access_token, answer.error) {
            (Some(token), None) if response.status().is_success() => Ok(Issued {
                token: Secret::new(token),
                lifetime: answer.expires_in.map(Duration::from_secs),
            }),
            (_, Some(code)) => Err(self.refusal(&code, answer.error_description)),
            _ => Err(self.http_error(HttpError::Refused {
                status: response.status().as_u16(),
                body: "no access_token and no error".into(),
            })),
        }
    }
}

/// The `oauth2` crate's HTTP client: ours, owned, so that its futures borrow nothing.
struct Http(reqwest::Client);

impl<'c> oauth2::AsyncHttpClient<'c> for Http {
    type Error = HttpError;
    type Future =
        Pin<Box<dyn Future<Output = Result<oauth2::HttpResponse, HttpError>> + Send + 'c>>;

    fn call(&'c self, request: oauth2::HttpRequest) -> Self::Future {
        Box::pin(send(&self.0, request))
    }
}

/// One HTTP exchange through reqwest, bounded by the client's timeout. A 5xx or a 429 is
/// [`HttpError::Away`]; another failure status without a JSON body is
/// [`HttpError::Refused`]; the rest goes to the caller as it came.
async fn send(
    client: &reqwest::Client,
    request: oauth2::HttpRequest,
) -> Result<oauth2::HttpResponse, HttpError> {
    let (parts, body) = request.into_parts();
    let response = client
        .request(parts.method, parts.uri.to_string())
        .headers(parts.headers)
        .body(body)
        .send()
        .await
        .map_err(|e| HttpError::Send(error_chain(&e)))?;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response
        .bytes()
        .await
        .map_err(|e| HttpError::Send(error_chain(&e)))?;
    if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
        return Err(HttpError::Away {
            status: status.as_u16(),
            retry_after: retry_after(&headers),
            body: String::from_utf8_lossy(&body).into_owned(),
        });
    }
    let json = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().starts_with("application/json"));
    if !status.is_success() && !json {
        return Err(HttpError::Refused {
            status: status.as_u16(),
            body: String::from_utf8_lossy(&body).into_owned(),
        });
    }
    let mut answer = http::Response::builder().status(status.as_u16());
    for (name, value) in &headers {
        answer = answer.header(name, value);
    }
    answer
        .body(body.to_vec())
        .map_err(|e| HttpError::Send(error_chain(&e)))
}

/// Retry-After in seconds (the HTTP-date form is rare at token endpoints and ignored).
fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}
