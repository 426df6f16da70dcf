//! Device presence from the embedded broker.
//!
//! rumqttd has no connect/disconnect API; its router logs "Client
//! connection registered", "Disconnecting connection" and "Adding
//! subscription on topic ..." inside spans carrying the `client_id`
//! (../shared/notes/RUMQTT.md). [`PresenceLayer`] is a tracing layer that
//! turns exactly those events into [`BrokerEvent`]s. It must be installed in
//! the process's subscriber (see `main.rs`); without it the gateway still
//! learns presence from devices' own `status` and `pull` messages.

use std::sync::OnceLock;

use tokio::sync::mpsc;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::{FilterFn, Filtered};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// The target whose events carry connection changes.
const ROUTER_TARGET: &str = "rumqttd::router::routing";

/// What the broker said about a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerEvent {
    Connected(String),
    Disconnected(String),
    Subscribed { client_id: String, filter: String },
}

static EVENTS: OnceLock<mpsc::UnboundedSender<BrokerEvent>> = OnceLock::new();

/// Connects the layer to a receiver; the first caller gets it, later ones `None`.
pub fn subscribe() -> Option<mpsc::UnboundedReceiver<BrokerEvent>> {
    let (tx, rx) = mpsc::unbounded_channel();
    EVENTS.set(tx).ok().map(|_| rx)
}

/// The layer, filtered to the router's INFO events and the few spans that
/// carry a `client_id`. rumqttd opens a span for every publish; a span that
/// no layer wants is never created, which matters at 20k messages/s.
pub fn layer<S>() -> Filtered<PresenceLayer, FilterFn, S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    PresenceLayer.with_filter(FilterFn::new(|meta| {
        meta.target() == ROUTER_TARGET
            && if meta.is_span() {
                matches!(
                    meta.name(),
                    "incoming_connect" | "incoming_disconnect" | "incoming_payload"
                )
            } else {
                *meta.level() <= tracing::Level::INFO
            }
    }))
}

pub struct PresenceLayer;

/// A span's `client_id`, kept in the span's extensions.
struct ClientId(String);

#[derive(Default)]
struct Fields {
    client_id: Option<String>,
    message: Option<String>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "client_id" {
            self.client_id = Some(value.to_string());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = Some(format!("{value:?}")),
            "client_id" => {
                self.client_id = Some(format!("{value:?}").trim_matches('"').to_string())
            }
            _ => {}
        }
    }
}

impl<S> Layer<S> for PresenceLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if !attrs
            .metadata()
            .fields()
            .iter()
            .any(|f| f.name() == "client_id")
        {
            return;
        }
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let (Some(client_id), Some(span)) = (fields.client_id, ctx.span(id)) {
            span.extensions_mut().insert(ClientId(client_id));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let Some(tx) = EVENTS.get() else { return };
        let mut fields = Fields::default();
        event.record(&mut fields);
        let Some(message) = fields.message else {
            return;
        };
        let client_id = || {
            ctx.event_scope(event)?
                .find_map(|span| span.extensions().get::<ClientId>().map(|c| c.0.clone()))
        };
        let ev = if message == "Client connection registered" {
            client_id().map(BrokerEvent::Connected)
        } else if message == "Disconnecting connection" {
            client_id().map(BrokerEvent::Disconnected)
        } else if let Some(filter) = message.strip_prefix("Adding subscription on topic ") {
            client_id().map(|client_id| BrokerEvent::Subscribed {
                client_id,
                filter: filter.to_string(),
            })
        } else {
            None
        };
        if let Some(ev) = ev {
            let _ = tx.send(ev);
        }
    }
}
