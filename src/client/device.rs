//! The device side of the protocol. See the module doc of [`crate::client`].
//!
//! Every topic comes from [`DeviceTopics`] and every body is a wire type of
//! [`crate::protocol`]; the MQTT transport is the `Task::run` loop alone.

use std::time::Duration;

use bytes::Bytes;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use super::resends::Resends;
use crate::ids::{DeviceId, IdError, MsgId, Seq};
use crate::mqtt::{self, Event, Session, Will};
use crate::protocol::control::{self, Confirm, Nack, Pull, Read, Status};
use crate::protocol::envelope::WireEnvelope;
use crate::protocol::inbox::{InboxBatch, InboxEntry};
use crate::protocol::receipt::Receipt;
use crate::protocol::topics::DeviceTopics;

#[derive(Debug, Clone)]
pub struct DeviceOptions {
    pub host: String,
    pub port: u16,
    /// The device id, also its MQTT client id (`[A-Za-z0-9._-]{1,64}`).
    pub device: String,
    /// Topic prefix on the south side.
    pub prefix: String,
    /// The last inbox seq the application committed (from its own storage).
    pub cursor: u64,
    /// Keep the MQTT session across reconnects.
    pub persistent_session: bool,
    pub keep_alive: Duration,
    /// Resend an uplink with no final receipt after this long.
    pub resend_after: Duration,
    /// The device's password where the gateway (or the site broker)
    /// authenticates devices.
    pub password: Option<String>,
    /// The username sent with the password (`None`: the device id, as the
    /// embedded broker requires).
    pub username: Option<String>,
    /// Plain TCP, or TLS (with the device's certificate, whose CN is its
    /// id, where the gateway requires one).
    pub transport: mqtt::Transport,
    /// The MQTT version the device connects with (3.1.1 by default; with
    /// 5 a keep-alive under 5 s is raised to 5 s).
    pub mqtt_version: mqtt::MqttVersion,
}

impl DeviceOptions {
    pub fn new(host: impl Into<String>, port: u16, device: impl Into<String>) -> DeviceOptions {
        DeviceOptions {
            host: host.into(),
            port,
            device: device.into(),
            prefix: "devices".into(),
            cursor: 0,
            persistent_session: false,
            keep_alive: Duration::from_secs(30),
            resend_after: Duration::from_secs(5),
            password: None,
            username: None,
            transport: mqtt::Transport::Tcp,
            mqtt_version: mqtt::MqttVersion::V311,
        }
    }

    /// These options, connecting with MQTT 5.
    pub fn v5(self) -> DeviceOptions {
        DeviceOptions {
            mqtt_version: mqtt::MqttVersion::V5,
            ..self
        }
    }
}

/// One message from the inbox, new to this device.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxMessage {
    pub seq: u64,
    pub msg_id: String,
    /// The entry as received (`seq`, `msg_id`, `ts`, the payload and any
    /// other field of the envelope); `None` for a tombstone. Its typed form:
    /// [`crate::protocol::inbox::InboxEnvelope`], deserialized.
    pub body: Option<Value>,
    /// A tombstone's `expired` or `failed`.
    pub status: Option<String>,
}

/// What the device hears.
#[derive(Debug, Clone, PartialEq)]
pub enum DeviceEvent {
    /// Connected and subscribed (again); the backlog has been pulled.
    Connected,
    Disconnected,
    /// A connection attempt failed, or the connection broke: why, and of
    /// which kind (a refused CONNECT will not pass by trying again). The
    /// client tries again after its backoff.
    ConnectionFailed(mqtt::Failure),
    /// A receipt on `{prefix}/{device}/ack`.
    Receipt(Receipt),
    /// New inbox messages, in seq order, none at or below the cursor.
    /// Confirm them with [`DeviceClient::confirm`] once committed.
    Inbox {
        messages: Vec<InboxMessage>,
        more: bool,
        duplicates: usize,
    },
}

enum Command {
    Send {
        msg_id: String,
        topic: String,
        body: Bytes,
    },
    Confirm(Seq),
    Publish {
        topic: String,
        body: Bytes,
    },
    /// Leave cleanly within this long, then answer.
    Close(Duration, oneshot::Sender<()>),
}

/// A connected device. Dropping it stops its event loop (the broker then
/// sees the connection drop and fires the last will); [`DeviceClient::close`]
/// leaves cleanly instead.
pub struct DeviceClient {
    commands: mpsc::UnboundedSender<Command>,
    pub events: mpsc::UnboundedReceiver<DeviceEvent>,
    topics: DeviceTopics,
}

impl DeviceClient {
    /// Connects (and keeps reconnecting) in a task of its own.
    ///
    /// # Panics
    /// If `opts.device` is not a valid device id; [`Self::try_connect`] returns the error instead.
    pub fn connect(opts: DeviceOptions) -> DeviceClient {
        DeviceClient::try_connect(opts).expect("DeviceOptions::device is a valid device id")
    }

    /// Connects (and keeps reconnecting) in a task of its own, unless
    /// `opts.device` is not a valid device id.
    pub fn try_connect(opts: DeviceOptions) -> Result<DeviceClient, IdError> {
        let topics = DeviceTopics::new(&opts.prefix, &DeviceId::new(opts.device.as_str())?);
        let mut mqtt = mqtt::Options::new(
            opts.device.clone(),
            opts.host.clone(),
            opts.port,
            opts.device.clone(),
        );
        mqtt.keep_alive = opts.keep_alive;
        mqtt.credentials = opts.password.clone().map(|password| {
            let username = opts.username.clone();
            (username.unwrap_or_else(|| opts.device.clone()), password)
        });
        mqtt.transport = opts.transport.clone();
        mqtt.version = opts.mqtt_version;
        mqtt.clean_session = !opts.persistent_session;
        mqtt.max_outgoing_packet = 4 << 20;
        mqtt.inflight = 200;
        mqtt.subscriptions = vec![topics.ack(), topics.inbox()];
        mqtt.last_will = Some(Will {
            topic: topics.status(),
            payload: Bytes::from(status_body(false)),
            // Retained, like the `online: true` after connecting, so a
            // gateway that (re)subscribes later learns where the device
            // stands (external mode: docs/EXTERNAL.md).
            retain: true,
        });
        let (session, session_events) = Session::start(mqtt);
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let (events_tx, events) = mpsc::unbounded_channel();
        let task = Task {
            session,
            topics: topics.clone(),
            ack_topic: topics.ack(),
            cursor: Cursor::new(opts.cursor),
            unanswered: Resends::new(opts.resend_after),
            events: events_tx,
            resend_after: opts.resend_after,
        };
        tokio::spawn(task.run(session_events, commands_rx));
        Ok(DeviceClient {
            commands,
            events,
            topics,
        })
    }

    /// This device's topics.
    pub fn topics(&self) -> &DeviceTopics {
        &self.topics
    }

    /// Sends `{"msg_id", "payload"}` on `up/{stream}`, resent until answered;
    /// an invalid `msg_id` is refused here rather than by the gateway.
    pub fn send(&self, stream: &str, msg_id: &str, payload: Value) -> Result<(), IdError> {
        self.send_envelope(stream, &WireEnvelope::json(MsgId::new(msg_id)?, payload));
        Ok(())
    }

    /// Sends an envelope on `up/{stream}`, resent until answered.
    pub fn send_envelope(&self, stream: &str, envelope: &WireEnvelope) {
        self.send_raw(
            stream,
            envelope.msg_id.as_str(),
            Bytes::from(envelope.to_bytes()),
        );
    }

    /// Sends bytes as they are on `up/{stream}` (an envelope carrying
    /// `msg_id`, or anything a test wants the gateway to judge), resent
    /// until a receipt names `msg_id`.
    pub fn send_raw(&self, stream: &str, msg_id: &str, body: Bytes) {
        let _ = self.commands.send(Command::Send {
            msg_id: msg_id.to_string(),
            topic: self.topics.up(stream),
            body,
        });
    }

    /// The application committed everything up to `upto`.
    pub fn confirm(&self, upto: u64) {
        let _ = self.commands.send(Command::Confirm(Seq(upto)));
    }

    /// The user has seen everything up to `upto`.
    pub fn read(&self, upto: u64) {
        self.control(self.topics.read(), &Read { upto: Seq(upto) });
    }

    /// The device can never take message `seq`.
    pub fn nack(&self, seq: u64, reason: &str) {
        let nack = Nack {
            seq: Seq(seq),
            reason: Some(reason.to_string()),
        };
        self.control(self.topics.nack(), &nack);
    }

    /// Asks for the next batch after `after` (default: the gateway's cursor).
    pub fn pull(&self, after: Option<u64>, limit: Option<usize>) {
        let pull = Pull {
            after: after.map(Seq),
            limit,
        };
        self.control(self.topics.pull(), &pull);
    }

    /// Leaves cleanly: `{"online": false}` on `status` (a clean
    /// DISCONNECT does not fire the last will), then DISCONNECT, waiting at
    /// most `within`. The client is done afterwards.
    pub async fn close(&self, within: Duration) {
        let (done, closed) = oneshot::channel();
        if self.commands.send(Command::Close(within, done)).is_ok() {
            let _ = closed.await;
        }
    }

    fn control(&self, topic: String, body: &impl serde::Serialize) {
        let _ = self.commands.send(Command::Publish {
            topic,
            body: Bytes::from(control::to_bytes(body)),
        });
    }
}

fn status_body(online: bool) -> Vec<u8> {
    control::to_bytes(&Status { online, ts: None })
}

struct Task {
    session: Session<()>,
    topics: DeviceTopics,
    /// `topics.ack()`, to tell receipts from batches.
    ack_topic: String,
    cursor: Cursor,
    /// Uplinks without a final receipt: msg_id → (topic, body, last sent).
    unanswered: Resends<()>,
    events: mpsc::UnboundedSender<DeviceEvent>,
    resend_after: Duration,
}

impl Task {
    async fn run(
        mut self,
        mut session: mpsc::Receiver<Event<()>>,
        mut commands: mpsc::UnboundedReceiver<Command>,
    ) {
        let mut connected = false;
        let mut resend = tokio::time::interval(self.resend_after / 2);
        loop {
            tokio::select! {
                ev = session.recv() => match ev {
                    Some(Event::Up { .. }) => {
                        connected = true;
                        self.session.send(self.topics.status(), status_body(true), true);
                        // From the gateway's cursor: an unconfirmed batch comes
                        // again, and what the application already has is dropped.
                        self.publish(self.topics.pull(), Bytes::from(control::to_bytes(&Pull::default())));
                        self.resend(true);
                        if self.events.send(DeviceEvent::Connected).is_err() {
                            return;
                        }
                    }
                    Some(Event::Message(m)) => {
                        if !self.on_publish(&m.topic, &m.payload) {
                            return;
                        }
                    }
                    Some(Event::Down) => {
                        connected = false;
                        let _ = self.events.send(DeviceEvent::Disconnected);
                    }
                    Some(Event::Failed(error)) => {
                        let _ = self.events.send(DeviceEvent::ConnectionFailed(error));
                    }
                    Some(_) => {}
                    None => return,
                },
                cmd = commands.recv() => match cmd {
                    Some(Command::Send { msg_id, topic, body }) => {
                        self.publish(topic.clone(), body.clone());
                        self.unanswered.insert(msg_id, topic, body, ());
                    }
                    Some(Command::Confirm(upto)) => {
                        self.cursor.confirmed(upto);
                        self.confirm(upto);
                    }
                    Some(Command::Publish { topic, body }) => self.publish(topic, body),
                    Some(Command::Close(within, done)) => {
                        if connected {
                            self.session.send(self.topics.status(), status_body(false), true);
                        }
                        self.session.close(None, within).await;
                        let _ = done.send(());
                        return;
                    }
                    None => return,
                },
                _ = resend.tick(), if connected => self.resend(false),
            }
        }
    }

    fn publish(&self, topic: String, body: Bytes) {
        self.session.send(topic, body.to_vec(), false);
    }

    fn resend(&mut self, all: bool) {
        for (topic, body) in self.unanswered.due(all) {
            self.publish(topic, body);
        }
    }

    fn confirm(&self, upto: Seq) {
        let body = control::to_bytes(&Confirm { upto });
        self.publish(self.topics.confirm(), Bytes::from(body));
    }

    /// False once the application dropped its receiver.
    fn on_publish(&mut self, topic: &str, payload: &[u8]) -> bool {
        if topic == self.ack_topic {
            self.on_receipt(payload)
        } else {
            self.on_inbox(payload)
        }
    }

    fn on_receipt(&mut self, payload: &[u8]) -> bool {
        let receipt = match serde_json::from_slice::<Receipt>(payload) {
            Ok(r) => r,
            Err(e) => {
                warn!(event = "client_receipt_ignored", error = %crate::clip::display(&e), "a receipt that is not one of the protocol's; ignored");
                return true;
            }
        };
        settle(&mut self.unanswered, &receipt);
        self.events.send(DeviceEvent::Receipt(receipt)).is_ok()
    }

    fn on_inbox(&mut self, payload: &[u8]) -> bool {
        let Ok(batch) = serde_json::from_slice::<InboxBatch>(payload) else {
            return true;
        };
        let (event, again) = self.cursor.take(batch);
        if let Some(upto) = again {
            self.confirm(upto);
        }
        self.events.send(event).is_ok()
    }
}

/// Stops resending the message a receipt answers. Every receipt is an
/// answer except a `rejected` with reason `rate`: the gateway kept nothing,
/// so the message stays and goes again after its receipt timeout.
fn settle(unanswered: &mut Resends<()>, receipt: &Receipt) {
    if receipt.is_retryable() {
        return;
    }
    if let Some(id) = &receipt.msg_id {
        unanswered.remove(id.as_str());
    }
}

/// The device's side of the inbox, free of I/O: what it handed to the
/// application and what the application confirmed.
#[derive(Debug)]
struct Cursor {
    /// The last inbox seq handed to the application (duplicates are ≤ it).
    handed: u64,
    /// The last seq the application confirmed.
    confirmed: u64,
}

impl Cursor {
    /// Starts from the application's own committed cursor.
    fn new(committed: u64) -> Cursor {
        Cursor {
            handed: committed,
            confirmed: committed,
        }
    }

    fn confirmed(&mut self, upto: Seq) {
        self.confirmed = self.confirmed.max(upto.0);
    }

    /// The event for the application (what is new in `batch`), and the
    /// confirm to send again when the batch holds nothing new: it came
    /// again because our confirm was lost.
    fn take(&mut self, batch: InboxBatch) -> (DeviceEvent, Option<Seq>) {
        let mut messages = Vec::new();
        let mut duplicates = 0;
        for entry in batch.messages {
            let seq = entry.seq().0;
            if seq <= self.handed {
                duplicates += 1;
                continue;
            }
            self.handed = seq;
            let msg_id = entry.msg_id().to_string();
            let (body, status) = match entry {
                InboxEntry::Message(m) => (
                    Some(serde_json::to_value(m).expect("an inbox entry is JSON")),
                    None,
                ),
                InboxEntry::Tombstone(t) => (None, Some(t.status.as_str().to_string())),
            };
            messages.push(InboxMessage {
                seq,
                msg_id,
                body,
                status,
            });
        }
        let again = (messages.is_empty() && duplicates > 0 && self.confirmed > 0)
            .then_some(Seq(self.confirmed));
        let event = DeviceEvent::Inbox {
            messages,
            more: batch.more,
            duplicates,
        };
        (event, again)
    }
}

#[cfg(test)]
mod tests;
