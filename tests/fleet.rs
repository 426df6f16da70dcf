//! Past one box: three gateways and two backend instances on one upstream
//! Mosquitto, the backends sharing the uplinks through one shared
//! subscription (`$share/fleet/ferry/+/up/#` per gateway, the Python
//! example backend serving every gateway) and one database that dedups by
//! `(gateway, device, msg_id)`. Faults at random under traffic, seeded
//! (`FERRY_FLEET_SEED` repeats a run), `FERRY_FLEET_FAULTS` of them (5 in
//! CI): a gateway SIGKILLed, a backend SIGKILLed and started again a while
//! later, the broker killed and restarted. Then: every uplink a
//! device had `stored` is committed, once; each device's seqs are
//! gap-free; both backends took a share; no gateway dead-lettered
//! anything. The duplicates the backends saw (resends after a kill: acked
//! again, committed by none) are counted and bounded.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tokio::time::Instant;

use crate::examples_python::{Script, SECS_10};
use crate::support::traffic::{env_or, one_at_a_time, Traffic};
use crate::support::{Ferry, FerryOpts, Mosquitto};

const GATEWAYS: [&str; 3] = ["gw-fleet-a", "gw-fleet-b", "gw-fleet-c"];
const BACKENDS: [&str; 2] = ["be-1", "be-2"];
const DEVICES: usize = 4;
const EVERY: Duration = Duration::from_millis(50);

/// One instance of examples/python/backend.py serving every gateway.
async fn backend(port: u16, db: &Path, id: &str) -> Script {
    let port = port.to_string();
    let db = db.to_string_lossy().into_owned();
    let mut args = vec![
        "--port",
        &port,
        "--db",
        &db,
        "--share",
        "fleet",
        "--client-id",
        id,
    ];
    for gw in GATEWAYS {
        args.extend(["--gateway", gw]);
    }
    let mut b = Script::start("backend", &args, None);
    b.until("online", SECS_10, |e| e["event"] == "online").await;
    b
}

/// Arrivals each backend instance saw again (`duplicate: true`).
fn duplicates(events: &[Value]) -> usize {
    events
        .iter()
        .filter(|e| e["event"] == "uplink" && e["duplicate"] == true)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_and_two_shared_backends_lose_nothing_and_commit_once_under_faults() {
    let _alone = one_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("backend.db");
    let mut mq = Mosquitto::start();
    let mut gateways: Vec<Ferry> = GATEWAYS
        .iter()
        .map(|gw| Ferry::start(FerryOpts::new(gw, mq.port)))
        .collect();
    let mut backends = vec![
        backend(mq.port, &db, BACKENDS[0]).await,
        backend(mq.port, &db, BACKENDS[1]).await,
    ];
    let traffic: Vec<Traffic> = gateways
        .iter()
        .zip(GATEWAYS)
        .map(|(g, gw)| Traffic::devices_only(g.south_port, &format!("{gw}-d"), DEVICES, EVERY))
        .collect();
    let mut seen_by_killed = Vec::new();
    let faults: usize = env_or("FERRY_FLEET_FAULTS", 5);
    let seed: u64 = env_or("FERRY_FLEET_SEED", rand::random());
    eprintln!("fleet: {faults} faults, FERRY_FLEET_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut done: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..faults {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(500..2500))).await;
        let fault = match rng.gen_range(0..3) {
            0 => {
                let g = rng.gen_range(0..gateways.len());
                tokio::task::block_in_place(|| gateways[g].restart());
                "gateway killed"
            }
            1 => {
                // One backend down at a time, back after a while: the other
                // takes the whole share meanwhile.
                let b = rng.gen_range(0..backends.len());
                backends[b].kill();
                seen_by_killed.extend(backends[b].events_now());
                tokio::time::sleep(Duration::from_millis(rng.gen_range(200..2000))).await;
                backends[b] = backend(mq.port, &db, BACKENDS[b]).await;
                "backend killed"
            }
            _ => {
                tokio::task::block_in_place(|| {
                    mq.kill();
                    std::thread::sleep(Duration::from_millis(500));
                    mq.restart();
                });
                "broker restarted"
            }
        };
        *done.entry(fault.into()).or_default() += 1;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for t in &traffic {
        t.stop_sending();
    }

    // Everything answered `stored` at a device reaches the database.
    let deadline = Instant::now() + Duration::from_secs(90);
    let committed = loop {
        let committed = commits(&db);
        let all_sent_stored = traffic.iter().all(|t| {
            let s = t.seen.lock().unwrap();
            s.up_sent.iter().all(|(d, ids)| {
                ids.iter()
                    .all(|m| s.up_stored.contains_key(&(d.clone(), m.clone())))
            })
        });
        let missing: usize = traffic
            .iter()
            .zip(GATEWAYS)
            .map(|(t, gw)| {
                let s = t.seen.lock().unwrap();
                s.up_stored
                    .keys()
                    .filter(|(d, m)| !committed.contains_key(&(gw.to_string(), format!("{d}/{m}"))))
                    .count()
            })
            .sum();
        if all_sent_stored && missing == 0 {
            break committed;
        }
        assert!(
            Instant::now() < deadline,
            "after 90 s (seed {seed}), {missing} uplinks answered `stored` are not committed by a backend \
             (every sent one answered: {all_sent_stored})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let mut seen = seen_by_killed;
    for b in backends {
        seen.extend(b.stop().await);
    }
    // Every device's messages: all sent, each committed once (the primary
    // key), seqs 1..=n without a gap.
    let mut sent = 0;
    for (t, gw) in traffic.iter().zip(GATEWAYS) {
        let s = t.seen.lock().unwrap();
        for (device, ids) in &s.up_sent {
            sent += ids.len();
            let mut seqs: Vec<u64> = ids
                .iter()
                .map(|m| {
                    committed
                        .get(&(gw.to_string(), format!("{device}/{m}")))
                        .unwrap_or_else(|| panic!("{gw} {device} {m} never committed"))
                        .0
                })
                .collect();
            seqs.sort_unstable();
            let want: Vec<u64> = (1..=ids.len() as u64).collect();
            assert_eq!(seqs, want, "{gw} {device}: seqs with a gap or reused");
        }
    }
    assert_eq!(
        committed.len(),
        sent,
        "the database holds exactly what was sent"
    );
    let consumers: HashSet<&str> = committed.values().map(|(_, c)| c.as_str()).collect();
    assert!(
        consumers.contains("be-1") && consumers.contains("be-2"),
        "both backends took a share: {consumers:?}"
    );
    for g in &gateways {
        assert_eq!(
            g.query_i64("SELECT COUNT(*) FROM dead_letter", []),
            0,
            "{}",
            g.gateway
        );
    }
    // Duplicates: what was in flight to a killed gateway's or backend's
    // connection, or lost with the broker, is sent again (one window per
    // device per fault at most).
    let again = duplicates(&seen);
    let window = GATEWAYS.len() * DEVICES * gateways[0].config.north.max_inflight;
    eprintln!(
        "fleet, seed {seed}: {sent} uplinks of {} devices on {} gateways, committed once each; \
         {again} arrivals again over {faults} faults {done:?}",
        GATEWAYS.len() * DEVICES,
        GATEWAYS.len()
    );
    assert!(
        again <= faults.max(1) * window,
        "{again} duplicates over {faults} faults × {window} (seed {seed})"
    );
}

/// The database's uplinks: (gateway, "device/msg_id") -> (seq, consumer).
fn commits(db: &Path) -> BTreeMap<(String, String), (u64, String)> {
    let db = rusqlite::Connection::open(db).expect("the backends' database");
    let mut q = db
        .prepare("SELECT gateway, device, msg_id, seq, consumer FROM uplink")
        .expect("prepare");
    q.query_map([], |r| {
        Ok((
            (
                r.get::<_, String>(0)?,
                format!("{}/{}", r.get::<_, String>(1)?, r.get::<_, String>(2)?),
            ),
            (r.get::<_, i64>(3)? as u64, r.get(4)?),
        ))
    })
    .expect("query")
    .map(|r| r.expect("row"))
    .collect()
}
