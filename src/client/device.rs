//! The device side of the protocol. See the module doc of [`crate::client`].

use std::time::Duration;

use bytes::Bytes;
use rumqttc::{AsyncClient, Event, EventLoop, LastWill, MqttOptions, Packet, QoS, SubscribeFilter};
use serde_json::Value;
use tokio::sync::mpsc;

use super::outbox::Outbox;
use super::reconnect_delay;

#[derive(Debug, Clone)]
pub struct DeviceOptions {
    pub host: String,
    pub port: u16,
    /// The device id, also its MQTT client id.
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
        }
    }
}

/// One message from the inbox, new to this device.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxMessage {
    pub seq: u64,
    pub msg_id: String,
    /// `None` for a tombstone (`expired`/`failed` before it was sent).
    pub body: Option<Value>,
    pub status: Option<String>,
}

/// What the device hears.
#[derive(Debug, Clone, PartialEq)]
pub enum DeviceEvent {
    /// Connected and subscribed (again); the backlog has been pulled.
    Connected,
    Disconnected,
    /// A receipt on `{prefix}/{device}/ack`.
    Receipt(Value),
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
    Confirm(u64),
    Publish {
        topic: String,
        body: Bytes,
    },
}

/// A connected device. Dropping it stops its event loop.
pub struct DeviceClient {
    commands: mpsc::UnboundedSender<Command>,
    pub events: mpsc::UnboundedReceiver<DeviceEvent>,
    prefix: String,
    device: String,
}

impl DeviceClient {
    pub fn connect(opts: DeviceOptions) -> DeviceClient {
        let base = format!("{}/{}", opts.prefix, opts.device);
        let mut mqtt = MqttOptions::new(opts.device.clone(), opts.host.clone(), opts.port);
        mqtt.set_keep_alive(opts.keep_alive)
            .set_clean_session(!opts.persistent_session)
            .set_max_packet_size(4 << 20, 4 << 20)
            .set_inflight(200)
            .set_last_will(LastWill::new(
                format!("{base}/status"),
                r#"{"online":false}"#,
                QoS::AtLeastOnce,
                false,
            ));
        let (client, mut eventloop) = AsyncClient::new(mqtt, 1024);
        let mut net = rumqttc::NetworkOptions::new();
        net.set_tcp_nodelay(true);
        eventloop.set_network_options(net);
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let (events_tx, events) = mpsc::unbounded_channel();
        let task = Task {
            client,
            base,
            handed: opts.cursor,
            confirmed: opts.cursor,
            unanswered: Outbox::new(opts.resend_after),
            events: events_tx,
            resend_after: opts.resend_after,
        };
        tokio::spawn(task.run(eventloop, commands_rx));
        DeviceClient {
            commands,
            events,
            prefix: opts.prefix,
            device: opts.device,
        }
    }

    /// Sends an uplink envelope on `up/{stream}`, resent until answered.
    pub fn send(&self, stream: &str, msg_id: &str, payload: Value) {
        let body = serde_json::to_vec(&serde_json::json!({"msg_id": msg_id, "payload": payload}))
            .expect("json");
        self.send_raw(stream, msg_id, Bytes::from(body));
    }

    /// Sends a prepared envelope (it must carry `msg_id`), resent until answered.
    pub fn send_raw(&self, stream: &str, msg_id: &str, body: Bytes) {
        let topic = format!("{}/{}/up/{stream}", self.prefix, self.device);
        let _ = self.commands.send(Command::Send {
            msg_id: msg_id.to_string(),
            topic,
            body,
        });
    }

    /// The application committed everything up to `upto`.
    pub fn confirm(&self, upto: u64) {
        let _ = self.commands.send(Command::Confirm(upto));
    }

    /// The user has seen everything up to `upto`.
    pub fn read(&self, upto: u64) {
        self.control("read", serde_json::json!({ "upto": upto }));
    }

    /// The device can never take message `seq`.
    pub fn nack(&self, seq: u64, reason: &str) {
        self.control("nack", serde_json::json!({ "seq": seq, "reason": reason }));
    }

    pub fn pull(&self, after: Option<u64>, limit: Option<usize>) {
        self.control(
            "pull",
            serde_json::json!({ "after": after, "limit": limit }),
        );
    }

    fn control(&self, kind: &str, body: Value) {
        let topic = format!("{}/{}/{kind}", self.prefix, self.device);
        let _ = self.commands.send(Command::Publish {
            topic,
            body: Bytes::from(body.to_string()),
        });
    }
}

struct Task {
    client: AsyncClient,
    base: String,
    /// The last inbox seq handed to the application (duplicates are ≤ it).
    handed: u64,
    /// The last seq the application confirmed.
    confirmed: u64,
    /// Uplinks without a final receipt: msg_id → (topic, body, last sent).
    unanswered: Outbox<()>,
    events: mpsc::UnboundedSender<DeviceEvent>,
    resend_after: Duration,
}

impl Task {
    async fn run(
        mut self,
        mut eventloop: EventLoop,
        mut commands: mpsc::UnboundedReceiver<Command>,
    ) {
        let mut failures = 0u32;
        let mut connected = false;
        let mut resend = tokio::time::interval(self.resend_after / 2);
        loop {
            tokio::select! {
                ev = eventloop.poll() => match ev {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        failures = 0;
                        let filters = [format!("{}/ack", self.base), format!("{}/inbox", self.base)]
                            .map(|path| SubscribeFilter::new(path, QoS::AtLeastOnce));
                        let _ = self.client.try_subscribe_many(filters);
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        connected = true;
                        self.publish(format!("{}/status", self.base), Bytes::from_static(br#"{"online":true}"#));
                        // From the gateway's cursor: an unconfirmed batch comes
                        // again, and what the application already has is dropped.
                        self.publish(format!("{}/pull", self.base), Bytes::from_static(b"{}"));
                        self.resend(true);
                        if self.events.send(DeviceEvent::Connected).is_err() {
                            return;
                        }
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        if !self.on_publish(&p.topic, &p.payload) {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => {
                        if connected {
                            connected = false;
                            let _ = self.events.send(DeviceEvent::Disconnected);
                        }
                        tokio::time::sleep(reconnect_delay(failures)).await;
                        failures = failures.saturating_add(1);
                    }
                },
                cmd = commands.recv() => match cmd {
                    Some(Command::Send { msg_id, topic, body }) => {
                        self.publish(topic.clone(), body.clone());
                        self.unanswered.insert(msg_id, topic, body, ());
                    }
                    Some(Command::Confirm(upto)) => {
                        self.confirmed = self.confirmed.max(upto);
                        let body = serde_json::json!({ "upto": upto });
                        self.publish(format!("{}/confirm", self.base), Bytes::from(body.to_string()));
                    }
                    Some(Command::Publish { topic, body }) => self.publish(topic, body),
                    None => return,
                },
                _ = resend.tick(), if connected => self.resend(false),
            }
        }
    }

    fn publish(&self, topic: String, body: Bytes) {
        let _ = self
            .client
            .try_publish(topic, QoS::AtLeastOnce, false, body.to_vec());
    }

    fn resend(&mut self, all: bool) {
        for (topic, body) in self.unanswered.due(all) {
            self.publish(topic, body);
        }
    }

    /// False once the application dropped its receiver.
    fn on_publish(&mut self, topic: &str, payload: &[u8]) -> bool {
        let Ok(value) = serde_json::from_slice::<Value>(payload) else {
            return true;
        };
        if topic.ends_with("/ack") {
            if let Some(id) = value.get("msg_id").and_then(Value::as_str) {
                // Any receipt but a lost one is an answer: stop resending.
                self.unanswered.remove(id);
            }
            return self.events.send(DeviceEvent::Receipt(value)).is_ok();
        }
        let more = value.get("more").and_then(Value::as_bool).unwrap_or(false);
        let mut messages = Vec::new();
        let mut duplicates = 0;
        for m in value
            .get("messages")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(seq) = m.get("seq").and_then(Value::as_u64) else {
                continue;
            };
            if seq <= self.handed {
                duplicates += 1;
                continue;
            }
            self.handed = seq;
            let status = m.get("status").and_then(Value::as_str).map(str::to_string);
            messages.push(InboxMessage {
                seq,
                msg_id: m
                    .get("msg_id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                body: if status.is_some() {
                    None
                } else {
                    Some(m.clone())
                },
                status,
            });
        }
        if messages.is_empty() && duplicates > 0 && self.confirmed > 0 {
            // A batch resent after our confirm was lost: confirm again so
            // the gateway moves on.
            let body = serde_json::json!({ "upto": self.confirmed });
            self.publish(
                format!("{}/confirm", self.base),
                Bytes::from(body.to_string()),
            );
        }
        self.events
            .send(DeviceEvent::Inbox {
                messages,
                more,
                duplicates,
            })
            .is_ok()
    }
}
