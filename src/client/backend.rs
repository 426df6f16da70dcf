//! The backend side of the protocol. See the module doc of [`crate::client`].

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, QoS, SubscribeFilter};
use serde_json::Value;
use tokio::sync::mpsc;

use super::outbox::Outbox;
use super::reconnect_delay;

#[derive(Debug, Clone)]
pub struct BackendOptions {
    pub host: String,
    pub port: u16,
    pub client_id: String,
    pub gateway: String,
    /// North topic prefix (before the gateway id).
    pub prefix: String,
    /// Resend a downlink still missing `stored` receipts after this long.
    pub resend_after: Duration,
    /// Keep the MQTT session (and receipts queued for it) across reconnects.
    pub persistent_session: bool,
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
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum BackendEvent {
    Connected,
    /// An uplink message (`{prefix}/{gateway}/up/...`); ack it after committing.
    Uplink(Value),
    /// A receipt from `{prefix}/{gateway}/receipts` (arrays are split).
    Receipt(Value),
    /// The gateway's retained status.
    Status(Value),
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
    base: String,
}

impl BackendClient {
    pub fn connect(opts: BackendOptions) -> BackendClient {
        let base = format!("{}/{}", opts.prefix, opts.gateway);
        let mut mqtt = MqttOptions::new(opts.client_id.clone(), opts.host.clone(), opts.port);
        mqtt.set_keep_alive(Duration::from_secs(30))
            .set_clean_session(!opts.persistent_session)
            .set_max_packet_size(16 << 20, 16 << 20)
            .set_inflight(1000);
        let (client, mut eventloop) = AsyncClient::new(mqtt, 65_536);
        let mut net = rumqttc::NetworkOptions::new();
        net.set_tcp_nodelay(true);
        eventloop.set_network_options(net);
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let (events_tx, events) = mpsc::unbounded_channel();
        let task = Task {
            client,
            base: base.clone(),
            downs: Outbox::new(opts.resend_after),
            events: events_tx,
            resend_after: opts.resend_after,
        };
        tokio::spawn(task.run(eventloop, commands_rx));
        BackendClient {
            commands,
            events,
            base,
        }
    }

    /// Acks one uplink `ok`.
    pub fn ack_ok(&self, device: &str, msg_id: &str) {
        self.ack_many(&[(device, msg_id)]);
    }

    /// Acks many uplinks `ok` in one message.
    pub fn ack_many(&self, acks: &[(&str, &str)]) {
        let body: Vec<Value> = acks
            .iter()
            .map(|(d, m)| serde_json::json!({"device": d, "msg_id": m, "status": "ok"}))
            .collect();
        self.publish(format!("{}/ack", self.base), Value::Array(body));
    }

    pub fn nack(&self, device: &str, msg_id: &str, reason: &str, retry: bool) {
        let body = serde_json::json!({"device": device, "msg_id": msg_id, "status": "nack", "reason": reason, "retry": retry});
        self.publish(format!("{}/ack", self.base), body);
    }

    /// Sends a downlink to `to` (device ids or `@group`s; one device uses
    /// the per-device topic), resent until each named device has `stored`.
    /// `envelope` must carry `msg_id` and a payload; `to` is added here.
    pub fn send_down(&self, to: &[&str], mut envelope: Value) {
        let msg_id = envelope
            .get("msg_id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let topic = match to {
            [one] if !one.starts_with('@') => format!("{}/down/{one}", self.base),
            _ => {
                envelope["to"] = Value::from(to.to_vec());
                format!("{}/down", self.base)
            }
        };
        // Groups are resolved by the gateway: wait for one receipt per named id.
        let to = to
            .iter()
            .filter(|t| !t.starts_with('@'))
            .map(|t| t.to_string())
            .collect();
        let body = Bytes::from(envelope.to_string());
        let _ = self.commands.send(Command::Down {
            msg_id,
            topic,
            body,
            to,
        });
    }

    fn publish(&self, topic: String, body: Value) {
        let _ = self.commands.send(Command::Publish {
            topic,
            body: Bytes::from(body.to_string()),
        });
    }
}

struct Task {
    client: AsyncClient,
    base: String,
    /// Downlinks awaiting `stored`: msg_id → (topic, body, devices still missing, last sent).
    downs: Outbox<HashSet<String>>,
    events: mpsc::UnboundedSender<BackendEvent>,
    resend_after: Duration,
}

impl Task {
    async fn run(
        mut self,
        mut eventloop: EventLoop,
        mut commands: mpsc::UnboundedReceiver<Command>,
    ) {
        let mut failures = 0u32;
        let mut resend = tokio::time::interval(self.resend_after / 2);
        loop {
            tokio::select! {
                ev = eventloop.poll() => match ev {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        failures = 0;
                        let filters = [format!("{}/up/#", self.base), format!("{}/receipts", self.base), format!("{}/status", self.base)]
                            .map(|path| SubscribeFilter::new(path, QoS::AtLeastOnce));
                        let _ = self.client.try_subscribe_many(filters);
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        self.resend(true);
                        if self.events.send(BackendEvent::Connected).is_err() {
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
                        tokio::time::sleep(reconnect_delay(failures)).await;
                        failures = failures.saturating_add(1);
                    }
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
        let _ = self
            .client
            .try_publish(topic, QoS::AtLeastOnce, false, body.to_vec());
    }

    fn on_publish(&mut self, topic: &str, payload: &[u8]) -> bool {
        let Ok(value) = serde_json::from_slice::<Value>(payload) else {
            return true;
        };
        let rest = topic.strip_prefix(self.base.as_str()).unwrap_or(topic);
        if rest.starts_with("/up/") {
            return self.events.send(BackendEvent::Uplink(value)).is_ok();
        }
        if rest == "/status" {
            return self.events.send(BackendEvent::Status(value)).is_ok();
        }
        let receipts = match value {
            Value::Array(items) => items,
            one => vec![one],
        };
        for r in receipts {
            self.on_receipt(&r);
            if self.events.send(BackendEvent::Receipt(r)).is_err() {
                return false;
            }
        }
        true
    }

    /// A `stored` (or any later status, or `rejected`) answers a downlink for that device.
    fn on_receipt(&mut self, r: &Value) {
        let Some(msg_id) = r.get("msg_id").and_then(Value::as_str) else {
            return;
        };
        let Some(waiting) = self.downs.waiting_mut(msg_id) else {
            return;
        };
        if r.get("status").and_then(Value::as_str) == Some("rejected") {
            self.downs.remove(msg_id);
            return;
        }
        if let Some(device) = r.get("device").and_then(Value::as_str) {
            waiting.remove(device);
        }
        if waiting.is_empty() {
            self.downs.remove(msg_id);
        }
    }
}
