//! Conformance: the Eclipse Paho interoperability cases (paho.mqtt.testing,
//! `interoperability/client_test.py` for 3.1.1 and `client_test5.py` for
//! 5) and the stock Mosquitto clients, against the real `ferry` binary in
//! embedded mode, at MQTT 3.1, 3.1.1 and 5 on the one `south.listen`.
//!
//! Paho's suite, unchanged, cannot pass against a gateway that isolates
//! devices: its clients publish and subscribe on shared topics
//! (`TopicA`, `TopicA/B`, `Topic/C`, wildcards over them) and read each
//! other's messages. Here every case is rewritten for ferry's topic rules
//! (docs/PROTOCOL.md): a client is a device whose client id is its device
//! id, and it uses only its own topics. It publishes envelopes
//! (`{"msg_id", "payload"}`) on `devices/{id}/up/{stream}` and controls on
//! its `status`, and subscribes only to `devices/{id}/ack` and
//! `devices/{id}/inbox`. Where Paho's client B reads what client A sent,
//! here the backend on the upstream Mosquitto reads it north, the store
//! (`Ferry::db`) shows it was taken once, and the device reads its
//! receipts. The cases are Python (`paho_cases.py`, with the cases in
//! `connect_cases.py` and `publish_cases.py` and the recording client in
//! `probe.py`), run by [`runner`] with Debian's `/usr/bin/python3` and
//! python3-paho-mqtt 1.6.1 (`scripts/test.sh` installs it, and
//! mosquitto-clients for [`stock`]); each prints what it saw as one JSON
//! line and the Rust test asserts on it. One gateway per test, so the
//! cases run in parallel.
//!
//! | Paho case (3.1.1 / 5) | here | levels |
//! |---|---|---|
//! | `test_basic` | `connect::basic_exchange`: connect, reconnect with keep-alive 0, subscribe own ack at QoS 2 (granted 1), publish QoS 0/1/2, a `stored` receipt each, stored once, seen north | 3.1, 3.1.1, 5 |
//! | `test_basic` (wrong protocol) | `connect::an_unsupported_protocol_level_gets_connack_1_and_is_closed`: level 6 → CONNACK 1, close; a bad protocol name is closed; levels 3, 4, 5 taken on a bare socket | all |
//! | `test_keepalive` | `connect::a_silent_device_is_closed_by_its_keep_alive_and_its_will_published` (will on the device's own `up`), `connect::a_device_that_pings_stays_connected` | 3.1, 3.1.1, 5 / 5 |
//! | `test_server_keep_alive` | `connect::the_connack_says_the_keep_alive_it_was_held_to`: server keep-alive for over `south.max_keep_alive_s` and for 0, none within | 5 |
//! | (CONNACK properties) | `connect::the_v5_connack_says_what_the_connection_is_held_to` | 5 |
//! | (CONNACK codes) | `connect::a_bad_password_or_client_id_is_refused_in_the_versions_own_code`: 0x86 / 0x85, 3.1.x 4 / 2 | 3.1, 3.1.1, 5 |
//! | `test_will_message` | `sessions::a_will_on_the_devices_own_topic_comes_when_it_drops_not_when_it_disconnects`: on its own `up` (stored) and `status` (accepted); on another device's topic the CONNECT is refused (0x87 / 5) | 3.1, 3.1.1, 5 |
//! | `test_will_delay` | `sessions::a_will_delay_past_the_session_expiry_is_cut_to_it`: expiry 0 publishes at once | 5 |
//! | `test_redelivery_on_reconnect`, `test_offline_message_queueing` | `sessions::a_persistent_session_brings_back_what_was_not_acknowledged`: an unacknowledged receipt again with DUP, a downlink stored while away, on the kept subscriptions with session present; a clean session / clean start leaves nothing | 3.1, 3.1.1, 5 |
//! | `test_session_expiry` | `sessions::a_session_lives_as_long_as_its_expiry_held_to_the_cap` | 5 |
//! | `test_retained_messages` / `test_retained_message` | `publish::a_retained_publish_on_its_own_topic_is_taken_and_kept_for_nobody` | 3.1, 3.1.1, 5 |
//! | `test_subscribe_failure` | `publish::a_subscription_beyond_the_devices_own_topics_is_refused`: another device's, wildcards → 0x87 (3.1.x 0x80); QoS 2 on own ack granted 1 | 3.1, 3.1.1, 5 |
//! | (isolation) | `publish::a_publish_on_another_devices_topic_is_refused_and_answered_rejected`: PUBACK/PUBREC 0x87 (v5), `rejected` unauthorized | 3.1, 3.1.1, 5 |
//! | (QoS 2 flow) | `publish::qos_2_is_answered_at_once_and_stored_once`: PUBREC at once, PUBLISH again with DUP taken again and stored once, PUBREL → PUBCOMP, also for an unknown packet id | 3.1, 3.1.1, 5 |
//! | `test_maximum_packet_size` | `v5::the_maximum_packet_size_holds_both_ways`; `publish::an_uplink_over_the_payload_limit_is_answered_rejected` at every level | 5 / all |
//! | `test_client_topic_alias` | `v5::a_topic_alias_reaches_its_topic_and_a_bad_one_ends_the_connection` | 5 |
//! | `test_flow_control1` | `v5::a_receive_maximum_holds_the_receipts_in_flight` | 5 |
//! | `test_user_properties` (reserved names only) | `v5::a_devices_ferry_properties_are_stripped` | 5 |
//! | stock clients | `stock::*`: `mosquitto_rr` gets its `stored` receipt, `mosquitto_sub` a downlink batch, `mosquitto_pub` (with a kept session) its receipt | 3.1, 3.1.1, 5 |
//! | (plain devices) | `plain::*`: `mosquitto_pub` on `south.plain_topics`, stored once, north on `plain`; `plain_sessions::*`: cut off mid-stream, the DUP resends on the kept session stored once, in order; withheld over the rate, then its DUP resend stored once; `plain_edges::*`: another device's level refused `unauthorized` with logins, external mode (the site broker's ACL), waiting at the disk budget | 3.1.1 (`plain`: all) |
//!
//! Not applicable to a gateway that isolates devices, and not run:
//! `test_overlapping_subscriptions` (a device's only filters are its own
//! `ack` and `inbox`: nothing overlaps, wildcards are refused),
//! `test_shared_subscriptions` (`$share/...` is refused; the CONNACK says
//! shared subscriptions are not available), `test_dollar_topics` (`$SYS`
//! and every `$` topic is outside the device topics), retained message
//! *delivery* (ferry keeps no retained message: what a device publishes
//! goes north, never to another device), `test_unsubscribe` (its messages
//! come from another client, which no device can be; a device
//! unsubscribing from its own `ack` is not run),
//! `test_zero_length_clientid` and `test_assigned_clientid` (the client id
//! is the device id: an empty one is refused), `test_subscribe_identifiers`
//! (not available, says the CONNACK), `test_server_topic_alias` (the broker
//! sends no aliases), `test_request_response` (accepted and not acted on:
//! `stock::mosquitto_rr_gets_its_stored_receipt` shows it breaks nothing),
//! `test_flow_control2` (the broker takes QoS 2 at its PUBLISH, so the
//! device's in-flight window is held by `south.max_inflight_per_device`,
//! answered `rate`, not by DISCONNECT 0x93), `test_payload_format`,
//! `test_publication_expiry` and user properties north (ferry carries
//! them as `props` and `ttl_s`: tested with that feature, not here).
//!
//! SUBACK 0x97 (past `south.max_subscriptions`) is not tested: the limit
//! is at least 2, a device has two filters it may hold (`ack`, `inbox`),
//! refused filters and subscribing again count nothing, so no device can
//! pass it. It does not bind the gateway's own link (it did, below 7:
//! `publish::a_low_subscription_limit_leaves_the_gateways_own_link_whole`).
//!
//! Where ferry departs from the letter of MQTT 5 on purpose, the tests
//! assert ferry's rule: a retained publish is taken as a plain one (the
//! spec would have DISCONNECT 0x9A after "retain not available"), and a
//! publish over the CONNACK's maximum packet size is answered `rejected`
//! like any oversized uplink (the spec would have DISCONNECT 0x95).

use ferry::client::backend::{BackendClient, BackendOptions};
#[cfg(feature = "system-tests")]
use serde_json::Value;

use crate::support::{boot_id, Backend, Ferry, FerryOpts, Mosquitto};

/// Runs `$name(level)` once per MQTT level given, as `$name::$test`:
/// `at_levels!(basic_exchange: v31 => "31", v311 => "311", v5 => "5");`
macro_rules! at_levels {
    ($name:ident: $($test:ident => $level:literal),+ $(,)?) => {
        mod $name {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$name($level).await
                }
            )+
        }
    };
}

// The Paho cases, in Python: the `system-tests` feature's. The stock
// clients' and the bare sockets' run in every `cargo test`.
#[cfg(feature = "system-tests")]
mod connect;
mod plain;
mod plain_down;
mod plain_edges;
mod plain_sessions;
#[cfg(feature = "system-tests")]
mod publish;
mod runner;
#[cfg(feature = "system-tests")]
mod sessions;
mod stock;
#[cfg(feature = "system-tests")]
mod v5;

/// The `-V` value for a level.
pub fn v(level: &str) -> &'static str {
    match level {
        "31" => "mqttv31",
        "311" => "mqttv311",
        _ => "mqttv5",
    }
}

/// A gateway for one test: the upstream Mosquitto, ferry on it, and a
/// backend reading north (acking nothing, so the only receipts are
/// `stored`).
pub struct Gw {
    pub ferry: Ferry,
    pub backend: Backend,
    pub boot: String,
    pub mq: Mosquitto,
}

impl Gw {
    pub async fn start(gateway: &str, opts: impl FnOnce(FerryOpts) -> FerryOpts) -> Gw {
        let mq = Mosquitto::start();
        let ferry = Ferry::start(opts(FerryOpts::new(gateway, mq.port)));
        let backend = Backend::connect(mq.port, gateway).await;
        Gw {
            ferry,
            backend,
            boot: boot_id(),
            mq,
        }
    }

    /// A backend that sends downlinks, each resent until the gateway has
    /// it `stored` (so one sent before ferry's north subscriptions are up
    /// is not lost). Keep it until the downlink has arrived.
    pub fn downlinks(&self, name: &str) -> BackendClient {
        let mut opts = BackendOptions::new("127.0.0.1", self.mq.port, self.ferry.gateway.as_str());
        opts.client_id = name.to_string();
        BackendClient::connect(opts)
    }

    pub fn port(&self) -> u16 {
        self.ferry.south_port
    }

    /// How often `(device, msg_id)` is in the store.
    pub fn stored(&self, device: &str, msg_id: &str) -> i64 {
        self.ferry.query_i64(
            "SELECT COUNT(*) FROM uplink WHERE device = ?1 AND msg_id = ?2",
            [device, msg_id],
        )
    }

    /// The distinct msg_ids the backend got from `device`, in order, until
    /// `done` holds or `timeout` passes (ferry resends what the backend does
    /// not ack, so a message may come more than once).
    pub async fn north_ids(
        &mut self,
        device: &str,
        timeout: std::time::Duration,
        mut done: impl FnMut(&[String]) -> bool,
    ) -> Vec<String> {
        let ids = |all: &[crate::support::NorthMessage]| -> Vec<String> {
            let mut ids: Vec<String> = Vec::new();
            for m in all.iter().filter(|m| m.device() == device) {
                if !ids.iter().any(|id| id == m.msg_id()) {
                    ids.push(m.msg_id().to_string());
                }
            }
            ids
        };
        let got = self
            .backend
            .messages_until(timeout, |all| done(&ids(all)))
            .await;
        ids(&got)
    }
}

/// The CONNACK's code (v5 reason code, or 3.1.x return code).
#[cfg(feature = "system-tests")]
pub fn code(connack: &Value) -> i64 {
    connack["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("no CONNACK: {connack}"))
}

/// A v5 CONNACK's property, as paho names it (`MaximumPacketSize`).
#[cfg(feature = "system-tests")]
pub fn prop<'a>(connack: &'a Value, name: &str) -> &'a Value {
    &connack["props"][name]
}

/// The acknowledgement packets of `kind` (`PUBACK`, `PUBREC`, `PUBCOMP`,
/// `DISCONNECT`) a case saw, in order.
#[cfg(feature = "system-tests")]
pub fn packets<'a>(report: &'a Value, kind: &str) -> Vec<&'a Value> {
    report["packets"]
        .as_array()
        .map(|all| all.iter().filter(|p| p["type"] == kind).collect())
        .unwrap_or_default()
}

/// The receipts (bodies on the device's own `ack`) among a case's messages.
#[cfg(feature = "system-tests")]
pub fn receipts(messages: &Value) -> Vec<&Value> {
    messages
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|m| m["topic"].as_str().is_some_and(|t| t.ends_with("/ack")))
                .map(|m| &m["body"])
                .collect()
        })
        .unwrap_or_default()
}
