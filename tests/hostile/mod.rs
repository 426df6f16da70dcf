//! ferry attacked from outside, as a hostile device, a careless operator
//! and a clumsy backend would (issue 15's findings): every path into the
//! embedded broker gets the same checks (wills included), reconnects are
//! served, what a peer chooses never grows the log without bound, and
//! numbers from peers and operators never wrap.

/// Runs the test function `$name(mode: AuthMode)` once per auth mode of the
/// embedded broker, as `$name::anonymous`, `$name::with_passwords` and
/// `$name::with_client_certificates`; or in the modes listed, as
/// `each_auth_mode!(name: anonymous = Anonymous, with_passwords = Password)`.
macro_rules! each_auth_mode {
    ($name:ident) => {
        each_auth_mode!($name: anonymous = Anonymous, with_passwords = Password,
            with_client_certificates = Certificate);
    };
    ($name:ident: $($test:ident = $mode:ident),+) => {
        mod $name {
            use crate::support::access::AuthMode;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$name(AuthMode::$mode).await
                }
            )+
        }
    };
}

mod connects;
mod paths;
mod reconnects;
mod signals;
mod wills;
