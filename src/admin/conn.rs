//! The admin server's connections: the accept loop, and one HTTP/1.1
//! request and answer per connection.
//!
//! Every peer's resources are bounded (a slot out of [`MAX_CONNECTIONS`],
//! [`HEADER_TIMEOUT`], [`CONNECTION_MAX`]), so no client of the admin port
//! can starve the process of file descriptors or memory that the devices'
//! listener needs.
//!
//! Always holds: every error answer is `{"error": "..."}` JSON, hyper's own
//! included. hyper answers a request it cannot parse itself, before any
//! service sees it (400, 414 or 431, with an empty body), and offers no
//! hook for that answer. So a connection carries one request (keep-alive
//! off: `Connection: close`), and until the router has been called,
//! whatever hyper writes can only be that refusal: [`Tap`] holds it back,
//! and [`refusal`] answers in its place with the same status and a JSON
//! body saying what was wrong. A request whose headers do not arrive
//! within [`HEADER_TIMEOUT`] is answered 408 the same way; a connection
//! that sent nothing is closed without a word.

use std::future::Future as _;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use axum::extract::ConnectInfo;
use axum::http::StatusCode;
use axum::Router;
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tracing::debug;

use super::date::http_date;
use super::error;

/// Connections served at once; past it a new one is closed at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Longest wait for a request's headers: an idle or trickling client lets
/// go of its slot.
pub(super) const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Most bytes of a request's head (request line and headers). hyper's
/// read buffer alone (about 400 KiB) is no bound: one read may take more
/// than it, and a head that arrived whole is then parsed and served, so
/// whether a larger head got 431 depended on how the bytes came in.
const MAX_HEAD_BYTES: usize = 128 * 1024;
/// Longest a connection lives, however slow its reader.
const CONNECTION_MAX: Duration = Duration::from_secs(300);
/// Most bytes of hyper's held-back refusal kept (its status line).
const HELD_MAX: usize = 64;
/// After a refusal, what is left of the request is read and dropped, at
/// most this much for at most [`LINGER`], so that closing with unread
/// input does not reset the connection before the peer reads the answer.
const LINGER_BYTES: usize = 64 * 1024;
const LINGER: Duration = Duration::from_secs(1);

/// The accept loop: each connection in a task of its own, in a slot out
/// of [`MAX_CONNECTIONS`].
pub(super) async fn serve(listener: TcpListener, app: Router) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, most likely: let some close.
                debug!(error = %e, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Closed at once: MAX_CONNECTIONS are open.
            crate::metrics::count(crate::metrics::Count::AdminConnectionsRefused);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        tokio::spawn(async move {
            connection(stream, peer, app).await;
            drop(slot);
        });
    }
}

/// One request on `stream`, answered by `app`, or by [`refusal`] when
/// hyper refused it before routing.
async fn connection(stream: TcpStream, peer: SocketAddr, app: Router) {
    let routed = Arc::new(AtomicBool::new(false));
    let tap = Tap {
        stream,
        routed: routed.clone(),
        heard: false,
        held: Vec::new(),
    };
    let router = TowerToHyperService::new(app);
    let service = hyper::service::service_fn(move |mut request| {
        routed.store(true, Ordering::Release);
        request.extensions_mut().insert(ConnectInfo(peer));
        router.call(request)
    });
    let mut conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_header_size(MAX_HEAD_BYTES)
        .keep_alive(false)
        // The router writes `Date` (see `super::date`).
        .auto_date_header(false)
        .serve_connection(TokioIo::new(tap), service);
    let served = tokio::time::timeout(
        CONNECTION_MAX,
        std::future::poll_fn(|cx| Pin::new(&mut conn).poll(cx)),
    )
    .await;
    // Past CONNECTION_MAX the connection is dropped, answer or not.
    let Ok(served) = served else { return };
    let mut tap = conn.into_parts().io.into_inner();
    let Some((status, message)) = refusal(&tap, served.err().as_ref()) else {
        return;
    };
    debug!(%peer, status = status.as_u16(), %message, "admin request refused before routing");
    let date = http_date(SystemTime::now());
    let answer = error::raw_answer(status, &message, date.as_deref());
    if tap.stream.write_all(&answer).await.is_ok() && tap.stream.shutdown().await.is_ok() {
        let mut rest = vec![0; 8192];
        let mut read = 0;
        let _ = tokio::time::timeout(LINGER, async {
            while read < LINGER_BYTES {
                match tap.stream.read(&mut rest).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => read += n,
                }
            }
        })
        .await;
    }
}

/// What to answer on a connection hyper ended (with `error`, if any) before
/// routing a request: hyper's own refusal's status, 408 for headers that
/// did not arrive in time, 400 for anything else hyper could not read;
/// nothing once routed (the router answered) or when the peer sent nothing.
fn refusal(tap: &Tap, error: Option<&hyper::Error>) -> Option<(StatusCode, String)> {
    if tap.routed.load(Ordering::Acquire) {
        return None;
    }
    // The status's reason, and hyper's words when they add to it.
    let what = |status: StatusCode| {
        let reason = status
            .canonical_reason()
            .unwrap_or("refused")
            .to_lowercase();
        match error.map(|e| e.to_string()) {
            Some(e) if !e.eq_ignore_ascii_case(&reason) => format!("{reason}: {e}"),
            _ => reason,
        }
    };
    if !tap.held.is_empty() {
        let status = held_status(&tap.held).unwrap_or(StatusCode::BAD_REQUEST);
        return Some((status, what(status)));
    }
    match error {
        _ if !tap.heard => None,
        Some(e) if e.is_timeout() => Some((
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request's headers did not all arrive within {} s",
                HEADER_TIMEOUT.as_secs()
            ),
        )),
        Some(_) => Some((StatusCode::BAD_REQUEST, what(StatusCode::BAD_REQUEST))),
        None => None,
    }
}

/// The status of a held-back answer's status line (`HTTP/1.1 431 ...`).
fn held_status(held: &[u8]) -> Option<StatusCode> {
    let line = held.strip_prefix(b"HTTP/1.")?.get(2..5)?;
    StatusCode::from_bytes(line).ok()
}

/// The socket as hyper sees it (see the module doc): reads pass through,
/// noting whether the peer sent anything; writes pass through once the
/// router has been called, and are held back (the first [`HELD_MAX`]
/// bytes kept) before.
struct Tap {
    stream: TcpStream,
    /// Set by the service as the router is called.
    routed: Arc<AtomicBool>,
    /// Whether the peer sent any byte.
    heard: bool,
    /// The start of what hyper wrote before routing.
    held: Vec<u8>,
}

impl Tap {
    fn routed(&self) -> bool {
        self.routed.load(Ordering::Acquire)
    }

    fn hold(&mut self, bytes: &[u8]) {
        let room = HELD_MAX.saturating_sub(self.held.len());
        self.held.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

impl AsyncRead for Tap {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.heard = true;
        }
        polled
    }
}

impl AsyncWrite for Tap {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.routed() {
            return Pin::new(&mut self.stream).poll_write(cx, buf);
        }
        self.hold(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.routed() {
            return Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        }
        for buf in bufs {
            self.hold(buf);
        }
        Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum()))
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.routed() {
            return Pin::new(&mut self.stream).poll_flush(cx);
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Before routing the refusal is still to be written.
        if self.routed() {
            return Pin::new(&mut self.stream).poll_shutdown(cx);
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_status_line_gives_its_status() {
        assert_eq!(
            held_status(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        );
        assert_eq!(
            held_status(b"HTTP/1.0 414 URI Too Long\r\n"),
            Some(StatusCode::URI_TOO_LONG)
        );
        assert_eq!(held_status(b"HTTP/1.1 4"), None);
        assert_eq!(held_status(b"garbage"), None);
    }
}
