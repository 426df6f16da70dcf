//! The store's files vanish under a running gateway, devices sending all
//! the while: the data directory deleted, the WAL deleted (then ferry
//! SIGKILLed), the database file replaced by another. Each time ferry
//! notices within seconds, answers nothing more, logs `store_file_gone`
//! and exits non-zero; after a restart (following the ERROR line where it
//! says to act) every uplink answered `stored` is in the store.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{logged, missing, SECS_10};
use crate::support::receipts::eventually;
use crate::support::traffic::{one_at_a_time, Traffic};
use crate::support::{Ferry, FerryOpts, Mosquitto};

/// How the store's files vanish.
#[derive(Clone, Copy, Debug)]
enum Vanish {
    /// `rm -rf` of the data directory.
    DataDir,
    /// The WAL deleted, ferry SIGKILLed once it noticed.
    WalThenKill,
    /// Another file renamed over `ferry.db`.
    DbReplaced,
}

/// The rescued copy ferry left beside a replaced database.
fn rescued_in(dir: &Path) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("data dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_string_lossy().contains("ferry.db.rescued-"))
        .collect();
    assert_eq!(found.len(), 1, "one rescued copy: {found:?}");
    found.into_iter().next().expect("one")
}

async fn nothing_answered_stored_is_lost_when(vanish: Vanish, gateway: &str) {
    let _alone = one_at_a_time().await;
    let mq = Mosquitto::start();
    let mut ferry = Ferry::start(FerryOpts::new(gateway, mq.port));
    let traffic = Traffic::devices_only(ferry.south_port, gateway, 4, Duration::from_millis(5));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!traffic.stored().0.is_empty(), "stored before the fault");

    let data = ferry.data_dir.clone();
    match vanish {
        Vanish::DataDir => std::fs::remove_dir_all(&data).expect("rm -rf the data dir"),
        Vanish::WalThenKill => std::fs::remove_file(data.join("ferry.db-wal")).expect("rm the WAL"),
        Vanish::DbReplaced => {
            let other = data.join("other");
            std::fs::write(&other, b"not ferry's store").expect("another file");
            std::fs::rename(&other, data.join("ferry.db")).expect("mv it over ferry.db");
        }
    }
    assert!(
        logged(&ferry, "store_file_gone", SECS_10).await,
        "{vanish:?} not noticed within 10 s"
    );
    match vanish {
        Vanish::WalThenKill => ferry.kill(),
        _ => {
            let status = ferry.exit_within(SECS_10).expect("ferry exits");
            assert_eq!(status.code(), Some(1), "{status}");
        }
    }
    // Taken once ferry is gone: every answer counted left ferry before.
    let (up, _) = traffic.stored();
    let log = ferry.log();
    let line = log
        .lines()
        .find(|l| l.contains("event=\"store_file_gone\""))
        .expect("the ERROR line");
    assert!(line.contains("ERROR"), "{line}");
    if let Vanish::DbReplaced = vanish {
        // As the line says: the replacement away, the rescued copy back.
        let rescued = rescued_in(&data);
        assert!(line.contains(&rescued.display().to_string()), "{line}");
        std::fs::rename(data.join("ferry.db"), data.join("the-replacement")).expect("mv away");
        std::fs::rename(&rescued, data.join("ferry.db")).expect("mv the rescued copy back");
    }
    ferry.restart();
    let lost = missing(&ferry, &up);
    assert!(
        lost.is_empty(),
        "{vanish:?}: {} of {} uplinks answered `stored` are missing after the restart: {:?}",
        lost.len(),
        up.len(),
        &lost[..lost.len().min(10)]
    );
    // And it serves again.
    let before = up.len();
    eventually(SECS_10 * 2, "new uplinks stored after the restart", || {
        traffic.stored().0.len() > before + 10
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_deleted_under_load_stops_the_answers_and_loses_nothing_answered() {
    nothing_answered_stored_is_lost_when(Vanish::DataDir, "gw-rmrf").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_deleted_under_load_then_a_sigkill_loses_nothing_answered() {
    nothing_answered_stored_is_lost_when(Vanish::WalThenKill, "gw-rmwal").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_file_replaced_under_load_is_saved_beside_it_and_loses_nothing_answered() {
    nothing_answered_stored_is_lost_when(Vanish::DbReplaced, "gw-mvdb").await
}
