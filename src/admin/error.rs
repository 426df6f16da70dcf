//! The admin server's error answers: every one is `{"error": "..."}` with
//! `Content-Type: application/json` and its status, whoever refuses the
//! request — a handler ([`ApiError`]), the query or path extractor
//! ([`ApiQuery`], [`ApiPath`]: axum's own answer their rejections in plain
//! text), or the router, for a path it has no route for ([`no_route`]) or
//! a method it does not serve there ([`no_method`]), the Host check
//! ([`super::host`]), or hyper itself, for a request it could not parse,
//! whose answer the connection rewrites ([`raw_answer`], see
//! [`super::conn`]).
//!
//! Always holds: a message never carries more than [`MAX_ECHO`] bytes of
//! what the client sent ([`echo`]), so a long request cannot make a long
//! answer.

use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::ops::OpsError;

/// Most bytes of a client's input an error message repeats.
pub const MAX_ECHO: usize = 128;

/// `text` as it is, or its first [`MAX_ECHO`] bytes (cut on a character
/// boundary) and `…`.
pub fn echo(text: &str) -> String {
    if text.len() <= MAX_ECHO {
        return text.to_string();
    }
    let mut end = MAX_ECHO;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// An error answer: `{"error": "..."}` with its status.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub(super) fn busy() -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "busy: earlier requests are still reading the store; try again".into(),
        }
    }

    pub(super) fn internal(message: String) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message,
        }
    }

    pub(super) fn not_found(message: String) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message,
        }
    }

    pub(super) fn bad_request(message: String) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message,
        }
    }

    /// 421: the request names a host this server does not answer to.
    pub(super) fn misdirected(message: String) -> ApiError {
        ApiError {
            status: StatusCode::MISDIRECTED_REQUEST,
            message,
        }
    }

    /// An extractor's rejection: its status, its text (which may quote the
    /// request) cut to [`MAX_ECHO`] bytes.
    fn rejected(status: StatusCode, text: &str) -> ApiError {
        ApiError {
            status,
            message: echo(text),
        }
    }
}

impl From<OpsError> for ApiError {
    fn from(e: OpsError) -> ApiError {
        match e {
            OpsError::Usage(m) => ApiError::bad_request(m),
            OpsError::Runtime(m) => ApiError::internal(m),
        }
    }
}

/// The body of every error answer.
#[derive(Serialize)]
struct Body<'a> {
    error: &'a str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(Body {
                error: &self.message,
            }),
        )
            .into_response()
    }
}

/// A whole HTTP/1.1 error answer as bytes, for a connection that hyper
/// ended before any route saw a request: `status`, `{"error": message}`
/// as JSON, `Date` when the clock gives one, and the connection closed.
pub(super) fn raw_answer(status: StatusCode, message: &str, date: Option<&str>) -> Vec<u8> {
    let body = serde_json::to_string(&Body { error: message })
        .unwrap_or_else(|_| r#"{"error":"refused"}"#.to_string());
    let mut head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    );
    if let Some(date) = date {
        head.push_str(&format!("date: {date}\r\n"));
    }
    head.push_str("\r\n");
    let mut answer = head.into_bytes();
    answer.extend_from_slice(body.as_bytes());
    answer
}

/// axum's [`Query`], refusing a bad query string with an [`ApiError`].
pub struct ApiQuery<T>(pub T);

#[axum::async_trait]
impl<T, S> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(value)) => Ok(ApiQuery(value)),
            Err(e) => Err(ApiError::rejected(e.status(), &e.body_text())),
        }
    }
}

/// axum's [`Path`], refusing bad path parameters with an [`ApiError`].
pub struct ApiPath<T>(pub T);

#[axum::async_trait]
impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(ApiPath(value)),
            Err(e) => Err(ApiError::rejected(e.status(), &e.body_text())),
        }
    }
}

/// The answer for a path no route serves.
pub async fn no_route(uri: Uri) -> ApiError {
    ApiError::not_found(format!("no such path: {}", echo(uri.path())))
}

/// The answer for a method a route does not serve (all serve GET only).
pub async fn no_method(method: Method, uri: Uri) -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: format!(
            "{} is not served on {}: only GET",
            echo(method.as_str()),
            echo(uri.path())
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_answer_is_a_whole_http_answer_with_a_json_body() {
        let answer = raw_answer(StatusCode::BAD_REQUEST, "bad \"x\"", None);
        let text = String::from_utf8(answer).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        assert!(!head.contains("date:"), "{head}");
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"], "bad \"x\"");
        let dated = raw_answer(
            StatusCode::REQUEST_TIMEOUT,
            "t",
            Some("Sun, 06 Nov 1994 08:49:37 GMT"),
        );
        assert!(String::from_utf8(dated)
            .unwrap()
            .contains("\r\ndate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"));
    }

    #[test]
    fn an_echo_is_cut_to_its_bound_on_a_character_boundary() {
        assert_eq!(echo("short"), "short");
        let exact = "a".repeat(MAX_ECHO);
        assert_eq!(echo(&exact), exact);
        let long = "é".repeat(MAX_ECHO);
        let cut = echo(&long);
        assert!(cut.ends_with('…'), "{cut}");
        assert!(cut.len() <= MAX_ECHO + '…'.len_utf8(), "{}", cut.len());
        assert_eq!(cut.trim_end_matches('…'), "é".repeat(MAX_ECHO / 2));
    }
}
