//! The backend side of the protocol. See the module doc of [`crate::client`].
//!
//! Every topic comes from [`NorthTopics`] and every body is a wire type of
//! [`crate::protocol`]; the MQTT transport is the `Task::run` loop alone.

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::warn;

use super::resends::Resends;
use crate::ids::{DeviceId, GatewayId, IdError, MsgId};
use crate::mqtt::{self, Event, Session};
use crate::protocol::ack::{encode_acks, BackendAck};
use crate::protocol::control::Status;
use crate::protocol::envelope::{RejectCode, WireDownlink, WireEnvelope};
use crate::protocol::north::NorthMessage;
use crate::protocol::receipt::{NorthReceipt, NorthStatus};
use crate::protocol::topics::{NorthTopic, NorthTopics};

#[derive(Debug, Clone)]
pub struct BackendOptions {
    pub host: String,
    pub port: u16,
    pub client_id: String,
    /// The gateway id (`[A-Za-z0-9._-]{1,64}`).
    pub gateway: String,
    /// North topic prefix (before the gateway id).
    pub prefix: String,
    /// Resend a downlink still missing `stored` receipts after this long.
    pub resend_after: Duration,
    /// Keep the MQTT session (and receipts queued for it) across reconnects.
    pub persistent_session: bool,
    /// `(username, password)` on the upstream broker; `None`: anonymous.
    pub credentials: Option<(String, String)>,
    /// Plain TCP, or TLS to the upstream broker.
    pub transport: mqtt::Transport,
    /// The MQTT version the backend connects with (3.1.1 by default).
    pub mqtt_version: mqtt::MqttVersion,
}

impl BackendOptions {
    pub fn new(host: impl Into<String>, port: u16, gateway: impl Into<String>) -> BackendOptions {
        let gateway = gateway.into();
        BackendOptions {
            host: host.into(),
            port,
            client_id: format!("backend-{gateway}"),
            gateway,
            prefix: "ferry".into(),
            resend_after: Duration::from_secs(5),
            persistent_session: true,
            credentials: None,
            transport: mqtt::Transport::Tcp,
            mqtt_version: mqtt::MqttVersion::V311,
        }
    }

    /// These options, connecting with MQTT 5.
    pub fn v5(self) -> BackendOptions {
        BackendOptions {
            mqtt_version: mqtt::MqttVersion::V5,
            ..self
        }
    }
}

/// What the backend hears, each message as received; the typed forms are
/// [`NorthMessage`], [`NorthReceipt`] and [`crate::protocol::control::Status`]
/// (`T::deserialize(&value)`).
#[derive(Debug, Clone, PartialEq)]
pub enum BackendEvent {
    Connected,
    /// An uplink message (`{prefix}/{gateway}/up/...`, or one of a batch's
    /// on `{prefix}/{gateway}/up`); ack it after committing.
    Uplink(NorthMessage),
    /// A receipt from `{prefix}/{gateway}/receipts` (arrays are split).
    Receipt(NorthReceipt),
    /// The gateway's retained status.
    Status(Status),
}

enum Command {
    Publish {
        topic: String,
        body: Bytes,
    },
    Down {
        msg_id: String,
        topic: String,
        body: Bytes,
        to: HashSet<String>,
    },
}

pub struct BackendClient {
    commands: mpsc::UnboundedSender<Command>,
    pub events: mpsc::UnboundedReceiver<BackendEvent>,
    topics: NorthTopics,
}

impl BackendClient {
    /// Connects (and keeps reconnecting) in a task of its own.
    ///
    /// # Panics
    /// If `opts.gateway` is not a valid gateway id; [`Self::try_connect`] returns the error instead.
    pub fn connect(opts: BackendOptions) -> BackendClient {
        BackendClient::try_connect(opts).expect("BackendOptions::gateway is a valid gateway id")
    }

    /// Connects (and keeps reconnecting) in a task of its own, unless
    /// `opts.gateway` is not a valid gateway id.
    pub fn try_connect(opts: BackendOptions) -> Result<BackendClient, IdError> {
        let topics = NorthTopics::new(&opts.prefix, &GatewayId::new(opts.gateway.as_str())?);
        let mut mqtt = mqtt::Options::new(
            opts.client_id.clone(),
            opts.host.clone(),
            opts.port,
            opts.client_id.clone(),
        );
        mqtt.clean_session = !opts.persistent_session;
        mqtt.credentials = opts.credentials.clone();
        mqtt.transport = opts.transport.clone();
        mqtt.version = opts.mqtt_version;
        mqtt.inflight = 1000;
        mqtt.subscriptions = vec![topics.up_filter(), topics.receipts(), topics.status()];
        let (session, session_events) = Session::start(mqtt);
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let (events_tx, events) = mpsc::unbounded_channel();
        let task = Task {
            session,
            topics: topics.clone(),
            downs: Resends::new(opts.resend_after),
            events: events_tx,
            resend_after: opts.resend_after,
        };
        tokio::spawn(task.run(session_events, commands_rx));
        Ok(BackendClient {
            commands,
            events,
            topics,
        })
    }

    /// This gateway's north topics.
    pub fn topics(&self) -> &NorthTopics {
        &self.topics
    }

    /// Acks uplinks in one message (an object for one, an array for more).
    pub fn ack(&self, acks: &[BackendAck]) {
        if !acks.is_empty() {
            self.publish(self.topics.ack(), encode_acks(acks));
        }
    }

    /// Acks one received uplink `ok`.
    pub fn ack_message(&self, message: &NorthMessage) {
        self.ack(&[BackendAck::ok(
            message.device.clone(),
            message.envelope.msg_id.clone(),
        )]);
    }

    /// Acks one uplink `ok`.
    pub fn ack_ok(&self, device: &str, msg_id: &str) -> Result<(), IdError> {
        self.ack_many(&[(device, msg_id)])
    }

    /// Acks many uplinks `ok` in one message; nothing is sent if an id is invalid.
    pub fn ack_many(&self, acks: &[(&str, &str)]) -> Result<(), IdError> {
        let acks = acks
            .iter()
            .map(|(d, m)| Ok(BackendAck::ok(DeviceId::new(*d)?, MsgId::new(*m)?)))
            .collect::<Result<Vec<_>, IdError>>()?;
        self.ack(&acks);
        Ok(())
    }

    pub fn nack(
        &self,
        device: &str,
        msg_id: &str,
        reason: &str,
        retry: bool,
    ) -> Result<(), IdError> {
        let nack = BackendAck::nack(DeviceId::new(device)?, MsgId::new(msg_id)?, reason, retry);
        self.ack(&[nack]);
        Ok(())
    }

    /// Sends a downlink to `to` (device ids or `@group`s; one device uses
    /// the per-device topic), resent until each named device has `stored`.
    pub fn send_downlink(&self, to: &[&str], mut envelope: WireEnvelope) {
        // `to` here is the one list of recipients.
        envelope.extra.remove("to");
        let msg_id = envelope.msg_id.to_string();
        let (topic, body) = match to {
            [one] if !one.starts_with('@') && DeviceId::new(*one).is_ok() => {
                let device = DeviceId::new(*one).expect("checked");
                (self.topics.down_to(&device), envelope.to_bytes())
            }
            _ => {
                let downlink = WireDownlink {
                    to: to.iter().map(|t| t.to_string()).collect(),
                    envelope,
                };
                (self.topics.down(), downlink.to_bytes())
            }
        };
        // Groups are resolved by the gateway: wait for one receipt per named id.
        let to = to
            .iter()
            .filter(|t| !t.starts_with('@'))
            .map(|t| t.to_string())
            .collect();
        let _ = self.commands.send(Command::Down {
            msg_id,
            topic,
            body: Bytes::from(body),
            to,
        });
    }

    /// [`Self::send_downlink`] for an envelope given as JSON (`msg_id` and a
    /// payload; `to` is added here). One that is not an envelope is sent
    /// once, as it is, for the gateway to answer `rejected`.
    pub fn send_down(&self, to: &[&str], envelope: Value) {
        match WireEnvelope::deserialize(&envelope) {
            Ok(envelope) => self.send_downlink(to, envelope),
            Err(error) => {
                warn!(event = "client_downlink_sent_raw", %error, "not a downlink envelope; sent once as it is");
                let mut body = envelope;
                if let Value::Object(fields) = &mut body {
                    fields.insert("to".into(), to.into());
                }
                self.publish(self.topics.down(), body.to_string().into_bytes());
            }
        }
    }

    fn publish(&self, topic: String, body: Vec<u8>) {
        let _ = self.commands.send(Command::Publish {
            topic,
            body: Bytes::from(body),
        });
    }
}

struct Task {
    session: Session<()>,
    topics: NorthTopics,
    /// Downlinks awaiting `stored`: msg_id → (topic, body, devices still missing, last sent).
    downs: Resends<HashSet<String>>,
    events: mpsc::UnboundedSender<BackendEvent>,
    resend_after: Duration,
}

impl Task {
    async fn run(
        mut self,
        mut session: mpsc::Receiver<Event<()>>,
        mut commands: mpsc::UnboundedReceiver<Command>,
    ) {
        let mut resend = tokio::time::interval(self.resend_after / 2);
        loop {
            tokio::select! {
                ev = session.recv() => match ev {
                    Some(Event::Up { .. }) => {
                        self.resend(true);
                        if self.events.send(BackendEvent::Connected).is_err() {
                            return;
                        }
                    }
                    Some(Event::Message(m)) => {
                        if !self.on_publish(&m.topic, &m.payload) {
                            return;
                        }
                    }
                    Some(_) => {}
                    None => return,
                },
                cmd = commands.recv() => match cmd {
                    Some(Command::Publish { topic, body }) => self.publish(topic, body),
                    Some(Command::Down { msg_id, topic, body, to }) => {
                        self.publish(topic.clone(), body.clone());
                        self.downs.insert(msg_id, topic, body, to);
                    }
                    None => return,
                },
                _ = resend.tick() => self.resend(false),
            }
        }
    }

    fn resend(&mut self, all: bool) {
        for (topic, body) in self.downs.due(all) {
            self.publish(topic, body);
        }
    }

    fn publish(&self, topic: String, body: Bytes) {
        self.session.send(topic, body.to_vec(), false);
    }

    /// False once the application dropped its receiver. What is not one
    /// of the protocol's messages is logged and skipped.
    fn on_publish(&mut self, topic: &str, payload: &[u8]) -> bool {
        let event = match self.topics.parse(topic) {
            Some(NorthTopic::Up { .. }) => {
                serde_json::from_slice(payload).map(BackendEvent::Uplink)
            }
            // A batch: each body as if it had come alone, in order.
            Some(NorthTopic::UpBatch) => {
                match serde_json::from_slice::<Vec<NorthMessage>>(payload) {
                    Ok(batch) => {
                        for m in batch {
                            if self.events.send(BackendEvent::Uplink(m)).is_err() {
                                return false;
                            }
                        }
                        return true;
                    }
                    Err(e) => Err(e),
                }
            }
            Some(NorthTopic::Status) => serde_json::from_slice(payload).map(BackendEvent::Status),
            Some(NorthTopic::Receipts) => match NorthReceipt::parse_many(payload) {
                Ok(receipts) => {
                    for r in receipts {
                        on_receipt(&mut self.downs, &r);
                        if self.events.send(BackendEvent::Receipt(r)).is_err() {
                            return false;
                        }
                    }
                    return true;
                }
                Err(e) => Err(e),
            },
            Some(NorthTopic::Ack | NorthTopic::Down(_)) | None => return true,
        };
        match event {
            Ok(event) => self.events.send(event).is_ok(),
            Err(e) => {
                warn!(event = "client_message_ignored", topic = %crate::clip::Clip(topic), error = %crate::clip::display(&e), "not one of the protocol's messages; ignored");
                true
            }
        }
    }
}

/// A `stored` (or any later status, or `rejected`) answers a downlink for
/// that device; a downlink answered for every named device is done. A
/// retryable rejection (`disk_budget`, `rate`: the gateway cannot take it
/// now) answers nothing: it is sent again after `resend_after`, as the
/// protocol says a sender does.
fn on_receipt(downs: &mut Resends<HashSet<String>>, r: &NorthReceipt) {
    let Some(msg_id) = &r.msg_id else {
        return;
    };
    let Some(waiting) = downs.waiting_mut(msg_id) else {
        return;
    };
    if r.kind() == Some(NorthStatus::Rejected) {
        let code = r.reason.as_deref().and_then(|r| r.split(':').next());
        let for_now = [RejectCode::DiskBudget, RejectCode::Rate].map(RejectCode::as_str);
        if code.is_some_and(|c| for_now.contains(&c)) {
            return;
        }
        downs.remove(msg_id);
        return;
    }
    if let Some(device) = &r.device {
        waiting.remove(device);
    }
    if waiting.is_empty() {
        downs.remove(msg_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt(json: &str) -> NorthReceipt {
        serde_json::from_str(json).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_downlink_is_done_once_every_named_device_has_a_receipt() {
        let mut downs = Resends::new(Duration::from_secs(5));
        let to = ["a", "b"].map(String::from).into_iter().collect();
        downs.insert("n-1".into(), "t".into(), Bytes::from_static(b"{}"), to);
        on_receipt(
            &mut downs,
            &receipt(r#"{"msg_id":"n-1","device":"a","status":"stored","seq":1,"ts":1}"#),
        );
        assert_eq!(downs.waiting_mut("n-1").map(|w| w.len()), Some(1));
        on_receipt(
            &mut downs,
            &receipt(r#"{"msg_id":"n-1","device":"b","status":"delivered","seq":4,"ts":1}"#),
        );
        assert!(downs.waiting_mut("n-1").is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_rejected_downlink_is_done_at_once() {
        let mut downs = Resends::new(Duration::from_secs(5));
        let to = ["a", "b"].map(String::from).into_iter().collect();
        downs.insert("n-2".into(), "t".into(), Bytes::from_static(b"{}"), to);
        on_receipt(
            &mut downs,
            &receipt(r#"{"msg_id":"n-2","status":"rejected","ts":1,"reason":"malformed: x"}"#),
        );
        assert!(downs.waiting_mut("n-2").is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_downlink_refused_for_now_is_sent_again() {
        let mut downs = Resends::new(Duration::from_secs(5));
        let to = ["a"].map(String::from).into_iter().collect();
        downs.insert("n-3".into(), "t".into(), Bytes::from_static(b"{}"), to);
        on_receipt(
            &mut downs,
            &receipt(
                r#"{"msg_id":"n-3","status":"rejected","ts":1,"reason":"disk_budget: the store is at store.max_db_bytes; resend later"}"#,
            ),
        );
        assert_eq!(downs.waiting_mut("n-3").map(|w| w.len()), Some(1));
    }
}
