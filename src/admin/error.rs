//! The admin server's error answers: every one is `{"error": "..."}` with
//! `Content-Type: application/json` and its status, whoever refuses the
//! request — a handler ([`ApiError`]), the query or path extractor
//! ([`ApiQuery`], [`ApiPath`]: axum's own answer their rejections in plain
//! text), or the router, for a path it has no route for ([`no_route`]) or
//! a method it does not serve there ([`no_method`]).
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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        #[derive(Serialize)]
        struct Body {
            error: String,
        }
        (
            self.status,
            Json(Body {
                error: self.message,
            }),
        )
            .into_response()
    }
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
