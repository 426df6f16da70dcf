//! The admin server at its edges, through the real binary: a wall clock
//! outside what an HTTP date can say (before 1970, after 9999), a request
//! for a name that is not the server's (DNS rebinding from a browser on the
//! box), and bytes that are not HTTP. Every one is answered, errors as
//! JSON, and nothing panics.

// Under libfaketime: the `system-tests` feature's.
#[cfg(feature = "system-tests")]
mod clock;
mod host;
mod raw;

use crate::support::{free_port, Ferry, FerryOpts};

/// Every route of the admin server, and a path with none.
const ROUTES: &[&str] = &[
    "/",
    "/metrics",
    "/healthz",
    "/readyz",
    "/api/status",
    "/api/dlq",
    "/api/dlq/1",
    "/api/trace/press-1/m-1",
    "/api/devices",
    "/api/alerts",
    "/api/throughput",
    "/no-such-path",
];

/// A gateway whose north link stays down (nothing listens upstream).
fn lone_ferry(opts: impl FnOnce(FerryOpts) -> FerryOpts, gateway: &str) -> Ferry {
    Ferry::start(opts(FerryOpts::new(gateway, free_port())))
}
