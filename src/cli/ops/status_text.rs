//! `ferry status` as text: the running gateway's links and the store's
//! figures, with whose messages wait and whose refusals fill the dead
//! letters.

use ferry::ops::fmt_ms;
use ferry::ops::status::StatusView;

use crate::cli::output::Text;

/// The lines `ferry status` prints for `s`.
pub(super) fn text(s: &StatusView) -> Text {
    let link = |l: &Option<ferry::status_file::Link>| match l {
        Some(l) => format!(
            "{} since {}",
            if l.up { "up" } else { "down" },
            fmt_ms(l.since_ms)
        ),
        None => "-".into(),
    };
    let age = |a: Option<f64>| a.map_or("-".into(), |a| format!("{a:.1}s"));
    let mut text = Text::new();
    if s.running {
        text.line(format_args!(
            "gateway: {} running (pid {})",
            s.gateway.as_deref().unwrap_or("-"),
            s.pid.unwrap_or_default()
        ));
        if let Some(v) = &s.version {
            text.line(format_args!(
                "version: {v}, up {}",
                s.uptime_s.map_or("-".into(), |u| format!("{u}s"))
            ));
        }
    } else {
        text.line("gateway: not running (figures from the store)");
    }
    match &s.north {
        Some(n) => {
            let at = n.endpoint.as_deref().map_or(String::new(), |e| {
                format!(" ({} {e})", if n.up { "on" } else { "last tried" })
            });
            text.line(format_args!(
                "north: {} since {}{at}",
                if n.up { "up" } else { "down" },
                fmt_ms(n.since_ms)
            ));
            if let (Some(error), Some(at)) = (&n.last_error, n.last_error_ms) {
                text.line(format_args!("  last error {}: {error}", fmt_ms(at)));
            }
        }
        None => text.line("north: -"),
    }
    text.line(format_args!(
        "south: {} ({})",
        link(&s.south),
        s.south_mode.as_deref().unwrap_or("-")
    ));
    text.line(format_args!(
        "backend: {}",
        match &s.backend {
            Some(b) => format!(
                "{} since {}, last ack {}",
                if b.present { "present" } else { "silent" },
                fmt_ms(b.since_ms),
                b.last_ack_ms.map_or("none yet".into(), fmt_ms)
            ),
            None => "-".into(),
        }
    ));
    text.line(format_args!(
        "devices online: {}",
        s.devices_online.map_or("-".into(), |n| n.to_string())
    ));
    text.line(format_args!(
        "uplink backlog: {} (oldest {})",
        s.uplink_backlog,
        age(s.uplink_oldest_age_s)
    ));
    for d in &s.uplink_top {
        text.line(format_args!("  {}: {}", d.device, d.messages));
    }
    text.line(format_args!(
        "downlink backlog: {} (oldest {})",
        s.downlink_backlog,
        age(s.downlink_oldest_age_s)
    ));
    for d in &s.downlink_top {
        text.line(format_args!("  {}: {}", d.device, d.messages));
    }
    text.line(format_args!("dead letters: {}", s.dead_letters));
    for d in &s.dead_letter_top {
        text.line(format_args!(
            "  {}: {} rows, {} bytes, {} summarised",
            d.share, d.rows, d.bytes, d.summarised
        ));
    }
    text.line(format_args!(
        "store: {} bytes (db {}, wal {}), budget {} bytes",
        s.store.total_bytes, s.store.db_bytes, s.store.wal_bytes, s.store.budget_bytes
    ));
    text
}
