//! A test hook: a session task that stops for good, as one stuck in an
//! await would.

use tokio::time::Instant;

/// `TEST_FERRY_WEDGE_NORTH_AFTER_MS=N` (`TEST_FERRY_WEDGE_SOUTH_AFTER_MS`:
/// the external south session) makes that session's task stop for good at
/// its first turn N ms after it started, as a task stuck in an await
/// would. Not `FERRY_*`: those are config keys. Release builds never read
/// it.
pub(super) fn test_wedge(name: &str) -> Option<Instant> {
    let var = match name {
        "north" => "TEST_FERRY_WEDGE_NORTH_AFTER_MS",
        "south" => "TEST_FERRY_WEDGE_SOUTH_AFTER_MS",
        _ => return None,
    };
    if !cfg!(debug_assertions) {
        return None;
    }
    let ms: u64 = std::env::var(var).ok()?.parse().ok()?;
    Some(Instant::now() + std::time::Duration::from_millis(ms))
}
