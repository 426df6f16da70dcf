//! The well-behaved peers, on [`Session`]: a field device on ferry's south
//! broker and the backend on the upstream Mosquitto, both reading JSON.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry::ids::{DeviceId, GatewayId, MsgId};
use ferry::mqtt::{self, Message};
use ferry::protocol::ack::{encode_acks, BackendAck};
use ferry::protocol::envelope::{Payload, WireEnvelope};
use ferry::protocol::topics::{DeviceTopics, NorthTopics};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::now_ms;
use super::session::{unique_client_id, Client, PublishHook, Session};

/// A field device on ferry's south broker; its client id is its device id.
pub struct Device {
    pub id: String,
    pub topics: DeviceTopics,
    session: Session,
}

impl Device {
    /// Connects with a clean session and subscribes to `devices/{id}/ack`.
    pub async fn connect(south_port: u16, id: &str) -> Device {
        Device::connect_with_session(south_port, id, true).await
    }

    /// Like `connect`, choosing `clean_session`.
    pub async fn connect_with_session(south_port: u16, id: &str, clean_session: bool) -> Device {
        Device::connect_via(mqtt::Transport::Tcp, south_port, id, clean_session).await
    }

    /// Like `connect`, over TLS with `tls` (which may present a client
    /// certificate).
    pub async fn connect_tls(south_port: u16, id: &str, tls: Arc<rustls::ClientConfig>) -> Device {
        Device::connect_via(mqtt::Transport::Tls(tls), south_port, id, true).await
    }

    async fn connect_via(
        transport: mqtt::Transport,
        south_port: u16,
        id: &str,
        clean_session: bool,
    ) -> Device {
        let topics = device_topics(id);
        let filters = vec![topics.ack()];
        let session =
            Session::connect_via(transport, id, south_port, filters, clean_session, None).await;
        Device {
            id: id.to_string(),
            topics,
            session,
        }
    }

    /// The device's MQTT client, for sending from another task.
    pub fn client(&self) -> Client {
        self.session.client.clone()
    }

    pub fn up_topic(&self, stream: &str) -> String {
        self.topics.up(stream)
    }

    /// Publishes `{"msg_id", "ts", "payload"}` on `devices/{id}/up/{stream}`.
    pub async fn publish_envelope(&self, stream: &str, msg_id: &str, payload: Value) {
        let envelope = WireEnvelope {
            msg_id: MsgId::new(msg_id).unwrap_or_else(|e| panic!("msg_id {msg_id:?}: {e}")),
            ts: Some(now_ms() as i64),
            payload: Payload::Json(payload),
            ttl_s: None,
            retry: true,
            extra: Default::default(),
        };
        let bytes = serde_json::to_vec(&envelope).expect("serialize envelope");
        self.publish_raw(&self.up_topic(stream), bytes).await;
    }

    /// Publishes `count` envelopes `{boot}-{tag}{i:04}` on `stream`; returns
    /// their msg_ids in order.
    pub async fn publish_many(
        &self,
        stream: &str,
        boot: &str,
        tag: &str,
        count: usize,
    ) -> Vec<String> {
        let mut ids = Vec::with_capacity(count);
        for i in 0..count {
            let id = format!("{boot}-{tag}{i:04}");
            self.publish_envelope(stream, &id, json!({"i": i, "tag": tag}))
                .await;
            ids.push(id);
        }
        ids
    }

    /// Publishes bytes on any topic at QoS 1.
    pub async fn publish_raw(&self, topic: &str, bytes: impl Into<Vec<u8>>) {
        assert!(
            self.session.client.publish(topic, bytes).await,
            "publish queued"
        );
    }

    /// The next receipt, parsed; `None` after `timeout`.
    pub async fn next_receipt(&mut self, timeout: Duration) -> Option<Value> {
        let p = self.session.next(timeout).await?;
        Some(receipt_json(&self.id, &p))
    }

    /// Collects receipts until `done(all collected so far)` holds or
    /// `timeout` passes; returns what it collected either way.
    pub async fn receipts_until(
        &mut self,
        timeout: Duration,
        done: impl FnMut(&[Value]) -> bool,
    ) -> Vec<Value> {
        let id = self.id.clone();
        self.session
            .collect_until(timeout, |m| receipt_json(&id, m), done)
            .await
    }

    /// The next receipt for `msg_id`, skipping (and returning) others.
    pub async fn next_receipt_for(
        &mut self,
        msg_id: &str,
        timeout: Duration,
    ) -> (Option<Value>, Vec<Value>) {
        let deadline = Instant::now() + timeout;
        let mut skipped = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return (None, skipped);
            }
            match self.next_receipt(left).await {
                Some(r) if r["msg_id"] == msg_id => return (Some(r), skipped),
                Some(r) => skipped.push(r),
                None => return (None, skipped),
            }
        }
    }

    /// SubAcks seen so far (one per (re)connect).
    pub fn subacks(&self) -> u64 {
        *self.session.subacks.borrow()
    }

    /// Waits until at least `n` SubAcks were seen, e.g. after a reconnect.
    pub async fn wait_subacks(&mut self, n: u64, timeout: Duration) -> bool {
        self.session.wait_subacks(n, timeout).await
    }
}

/// One message the backend received on `ferry/{gateway}/up/#`.
#[derive(Clone, Debug)]
pub struct NorthMessage {
    pub topic: String,
    pub raw: Vec<u8>,
    /// The parsed body (`Value::Null` if it was not JSON).
    pub body: Value,
}

impl NorthMessage {
    pub fn from_publish(p: &Message) -> NorthMessage {
        NorthMessage {
            topic: p.topic.clone(),
            raw: p.payload.to_vec(),
            body: serde_json::from_slice(&p.payload).unwrap_or(Value::Null),
        }
    }

    pub fn device(&self) -> &str {
        self.body["device"].as_str().unwrap_or("")
    }

    pub fn msg_id(&self) -> &str {
        self.body["msg_id"].as_str().unwrap_or("")
    }

    pub fn seq(&self) -> Option<u64> {
        self.body["seq"].as_u64()
    }
}

/// A receipt as JSON; a device that gets anything else fails its test.
fn receipt_json(device: &str, m: &Message) -> Value {
    serde_json::from_slice(&m.payload).unwrap_or_else(|e| {
        panic!(
            "device {device} got a receipt that is not JSON ({e}): {:?}",
            String::from_utf8_lossy(&m.payload)
        )
    })
}

/// What an intruder tries on `victim`'s every topic, as (topic, body): an
/// uplink with body `up`, a `stored` receipt for `receipt_for`, an empty
/// batch, and each control (a confirm and read far ahead, a nack, a pull,
/// `online: false`).
pub fn forgeries(victim: &DeviceTopics, up: String, receipt_for: &str) -> Vec<(String, String)> {
    vec![
        (victim.up("t"), up),
        (
            victim.ack(),
            json!({"msg_id": receipt_for, "status": "stored", "seq": 1}).to_string(),
        ),
        (
            victim.inbox(),
            json!({"messages": [], "more": false}).to_string(),
        ),
        (victim.confirm(), json!({"upto": 1000}).to_string()),
        (victim.read(), json!({"upto": 1000}).to_string()),
        (
            victim.nack(),
            json!({"seq": 1, "reason": "forged"}).to_string(),
        ),
        (victim.pull(), json!({"after": 0}).to_string()),
        (victim.status(), json!({"online": false}).to_string()),
    ]
}

/// A device's topics under the tests' `devices` prefix.
pub fn device_topics(id: &str) -> DeviceTopics {
    let device = DeviceId::new(id).unwrap_or_else(|e| panic!("device id {id:?}: {e}"));
    DeviceTopics::new("devices", &device)
}

/// A gateway's north topics under the tests' `ferry` prefix.
pub fn north_topics(gateway: &str) -> NorthTopics {
    let gateway = GatewayId::new(gateway).unwrap_or_else(|e| panic!("gateway {gateway:?}: {e}"));
    NorthTopics::new("ferry", &gateway)
}

/// `ack` or `nack` as the protocol's [`BackendAck`]; ids the protocol
/// would refuse (a test's deliberate junk) go out as written.
fn ack_body(device: &str, msg_id: &str, nack: Option<(&str, bool)>) -> Vec<u8> {
    match (DeviceId::new(device), MsgId::new(msg_id)) {
        (Ok(d), Ok(m)) => encode_acks(&[match nack {
            None => BackendAck::ok(d, m),
            Some((reason, retry)) => BackendAck::nack(d, m, reason, retry),
        }]),
        _ => {
            let body = match nack {
                None => json!({"device": device, "msg_id": msg_id, "status": "ok"}),
                Some((reason, retry)) => json!({"device": device, "msg_id": msg_id,
                    "status": "nack", "reason": reason, "retry": retry}),
            };
            serde_json::to_vec(&body).expect("serialize ack")
        }
    }
}

fn ack_ok_body(device: &str, msg_id: &str) -> Vec<u8> {
    ack_body(device, msg_id, None)
}

/// The backend on the upstream Mosquitto.
pub struct Backend {
    pub gateway: String,
    auto_ack: Arc<AtomicBool>,
    session: Session,
    acker: JoinHandle<()>,
}

impl Backend {
    /// Connects with a clean session and subscribes to `ferry/{gateway}/up/#`.
    /// Acks nothing by itself.
    pub async fn connect(mosquitto_port: u16, gateway: &str) -> Backend {
        Backend::connect_with(mosquitto_port, gateway, false).await
    }

    /// Like `connect`, but acks `ok` every message it receives.
    pub async fn connect_auto_ack(mosquitto_port: u16, gateway: &str) -> Backend {
        Backend::connect_with(mosquitto_port, gateway, true).await
    }

    async fn connect_with(mosquitto_port: u16, gateway: &str, auto_ack: bool) -> Backend {
        let auto_ack = Arc::new(AtomicBool::new(auto_ack));
        let (ack_tx, mut ack_rx) = mpsc::unbounded_channel::<(String, String)>();
        let flag = auto_ack.clone();
        let hook: PublishHook = Box::new(move |p: &Message| {
            if flag.load(Ordering::Relaxed) {
                let m = NorthMessage::from_publish(p);
                let _ = ack_tx.send((m.device().to_string(), m.msg_id().to_string()));
            }
        });
        let session = Session::connect(
            &unique_client_id(&format!("backend-{gateway}")),
            mosquitto_port,
            vec![north_topics(gateway).up_filter()],
            true,
            Some(hook),
        )
        .await;
        let client = session.client.clone();
        let ack_topic = north_topics(gateway).ack();
        let acker = tokio::spawn(async move {
            while let Some((device, msg_id)) = ack_rx.recv().await {
                client
                    .publish(ack_topic.as_str(), ack_ok_body(&device, &msg_id))
                    .await;
            }
        });
        Backend {
            gateway: gateway.to_string(),
            auto_ack,
            session,
            acker,
        }
    }

    /// Turns acking every received message on or off.
    pub fn set_auto_ack(&self, on: bool) {
        self.auto_ack.store(on, Ordering::Relaxed);
    }

    pub fn ack_topic(&self) -> String {
        north_topics(&self.gateway).ack()
    }

    /// The next message; `None` after `timeout`.
    pub async fn next_message(&mut self, timeout: Duration) -> Option<NorthMessage> {
        let p = self.session.next(timeout).await?;
        Some(NorthMessage::from_publish(&p))
    }

    /// Collects messages until `done(all collected so far)` holds or
    /// `timeout` passes; returns what it collected either way.
    pub async fn messages_until(
        &mut self,
        timeout: Duration,
        done: impl FnMut(&[NorthMessage]) -> bool,
    ) -> Vec<NorthMessage> {
        self.session
            .collect_until(timeout, NorthMessage::from_publish, done)
            .await
    }

    /// Everything that arrives within `window`.
    pub async fn drain_for(&mut self, window: Duration) -> Vec<NorthMessage> {
        self.messages_until(window, |_| false).await
    }

    /// Publishes raw bytes on any topic at QoS 1.
    pub async fn publish_raw(&self, topic: &str, body: Vec<u8>) {
        assert!(
            self.session.client.publish(topic, body).await,
            "publish queued"
        );
    }

    /// Publishes raw bytes on `ferry/{gateway}/ack`.
    pub async fn publish_ack_raw(&self, body: Vec<u8>) {
        assert!(
            self.session.client.publish(self.ack_topic(), body).await,
            "ack queued"
        );
    }

    /// `{"device", "msg_id", "status": "ok"}`.
    pub async fn ack_ok(&self, device: &str, msg_id: &str) {
        self.publish_ack_raw(ack_ok_body(device, msg_id)).await;
    }

    /// `{"device", "msg_id", "status": "nack", "reason", "retry"}`.
    pub async fn nack(&self, device: &str, msg_id: &str, reason: &str, retry: bool) {
        self.publish_ack_raw(ack_body(device, msg_id, Some((reason, retry))))
            .await;
    }

    /// SubAcks seen so far (one per (re)connect).
    pub fn subacks(&self) -> u64 {
        *self.session.subacks.borrow()
    }

    /// Waits until at least `n` SubAcks were seen, e.g. after a reconnect.
    pub async fn wait_subacks(&mut self, n: u64, timeout: Duration) -> bool {
        self.session.wait_subacks(n, timeout).await
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.acker.abort();
    }
}
