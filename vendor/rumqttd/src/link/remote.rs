use crate::link::direct::{Acks, PublishSink};
use crate::link::local::{LinkError, LinkRx, LinkTx};
use crate::link::network;
use crate::link::network::Network;
use crate::link::properties;
use crate::local::LinkBuilder;
use crate::protocol::{ConnAck, Connect, ConnectReturnCode, Login, Packet, Protocol};
use crate::router::{Event, Notification};
use crate::{ConnectionId, ConnectionSettings};

use flume::{RecvError, SendError, Sender, TrySendError};
use std::cmp::min;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use subtle::ConstantTimeEq;
use tokio::time::error::Elapsed;
use tokio::{select, time};
use tracing::{debug, trace, warn, Span};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("I/O")]
    Io(#[from] io::Error),
    #[error("Zero keep alive")]
    ZeroKeepAlive,
    #[error("Not connect packet")]
    NotConnectPacket(Packet),
    #[error("Network {0}")]
    Network(#[from] network::Error),
    #[error("Timeout")]
    Timeout(#[from] Elapsed),
    #[error("Channel send error")]
    Send(#[from] SendError<(ConnectionId, Event)>),
    #[error("Channel recv error")]
    Recv(#[from] RecvError),
    #[error("Got new session, disconnecting old one")]
    SessionEnd,
    #[error("Persistent session requires valid client id")]
    InvalidClientId,
    #[error("Unexpected router message")]
    NotConnectionAck,
    #[error("ConnAck error {0}")]
    ConnectionAck(String),
    #[error("Authentication error")]
    InvalidAuth,
    /// ferry: the connect hook refused the CONNECT (and said why).
    #[error("CONNECT refused")]
    Refused,
    /// ferry: a second CONNECT on an established connection, a protocol
    /// violation (MQTT 3.1.1 §3.1.0-2): the connection is closed.
    #[error("second CONNECT on one connection")]
    SecondConnect,
    /// ferry: a publish whose MQTT 5 properties break the rules (a topic
    /// alias out of range or never set, a subscription identifier).
    #[error("publish properties: {0:?}")]
    BadProperties(crate::protocol::DisconnectReasonCode),
    #[error("Channel try send error")]
    TrySend(#[from] TrySendError<(ConnectionId, Event)>),
    #[error("Link error = {0}")]
    Link(#[from] LinkError),
    /// ferry: the gateway no longer takes publishes (it is stopping).
    #[error("the gateway takes no more publishes")]
    GatewayGone,
    /// ferry: the gateway dropped a publish's ack unanswered (its store
    /// failed, or it is stopping): the client sends it again.
    #[error("a publish was not acknowledged by the gateway")]
    NotAcknowledged,
    /// ferry: the client went on publishing while its deliveries were
    /// unread, past what its task holds for it meanwhile.
    #[error("the client neither reads its messages nor waits for acknowledgements")]
    Stalled,
}

/// ferry: what a client whose deliveries are unread may send meanwhile,
/// held in its task (publishes and PUBRELs, and their bytes); past either
/// it is disconnected, and resends what was never acknowledged.
const MAX_HELD: usize = 1024;
const MAX_HELD_BYTES: usize = 16 << 20;

/// Orchestrates between Router and Network.
pub struct RemoteLink<P> {
    connect: Connect,
    pub(crate) connection_id: ConnectionId,
    network: Network<P>,
    link_tx: LinkTx,
    link_rx: LinkRx,
    notifications: VecDeque<Notification>,
    pub(crate) will_delay_interval: u32,
    /// ferry: the client's id and the isolation prefix, when isolated.
    isolation: Option<(String, String)>,
    /// ferry: where else it may publish (`ConnectionSettings::also_publish`).
    also_publish: Option<crate::PublishHook>,
    /// ferry: the topic aliases the client set (MQTT 5).
    aliases: properties::Aliases,
    /// ferry: where the client's publishes go instead of the router, and
    /// their acknowledgements, in order (`link::direct`).
    sink: Option<PublishSink>,
    client: Arc<str>,
    acks: Acks,
    /// ferry: the packets read for the sink, and the acks to write.
    direct: Vec<Packet>,
    acked: Vec<Packet>,
}

impl<P: Protocol> RemoteLink<P> {
    pub async fn new(
        router_tx: Sender<(ConnectionId, Event)>,
        tenant_id: Option<String>,
        mut network: Network<P>,
        connect_packet: Packet,
        dynamic_filters: bool,
        assigned_client_id: Option<String>,
        // ferry: for the line about a refusal.
        peer: std::net::SocketAddr,
        // ferry: the limits the connection is held to (session expiry,
        // aliases, packet size, keep-alive).
        config: &ConnectionSettings,
        // ferry: the keep-alive the client asked for, when it was capped.
        asked_keep_alive: Option<u16>,
    ) -> Result<RemoteLink<P>, Error> {
        let Packet::Connect(connect, props, lastwill, lastwill_props, _) = connect_packet else {
            return Err(Error::NotConnectPacket(connect_packet));
        };
        let v5 = network.speaks_v5();
        let level = network.protocol_level();

        // Register this connection with the router. Router replys with ack which if ok will
        // start the link. Router can sometimes reject the connection (ex max connection limit)
        let client_id = assigned_client_id.as_ref().unwrap_or(&connect.client_id);
        let clean_session = connect.clean_session;

        // ferry: the session expiry, held to the cap (a 3.1.1 client
        // without a clean session gets the cap).
        let (session_expiry, expiry_capped) = properties::session_expiry(
            v5,
            clean_session,
            props.as_ref(),
            config.max_session_expiry,
        );
        let receive_max = props
            .as_ref()
            .and_then(|p| p.receive_maximum)
            .unwrap_or(u16::MAX);
        let client_max_packet = props.as_ref().and_then(|p| p.max_packet_size).unwrap_or(0);

        let delay_interval = lastwill_props
            .as_ref()
            .and_then(|f| f.delay_interval)
            .unwrap_or(0);

        // The Server delays publishing the Client’s Will Message until
        // the Will Delay Interval has passed or the Session ends, whichever happens first
        let will_delay_interval = min(session_expiry, delay_interval);

        let built = LinkBuilder::new(client_id, router_tx)
            .tenant_id(tenant_id)
            .clean_session(clean_session)
            .last_will(lastwill)
            .last_will_properties(lastwill_props)
            .dynamic_filters(dynamic_filters)
            // ferry: the broker sends no topic aliases of its own.
            .topic_alias_max(0)
            .holdable(true)
            .will_delay(will_delay_interval)
            .session_expiry(session_expiry)
            .session_expiry_cap(config.max_session_expiry)
            .client_limits(receive_max, client_max_packet)
            .build();
        let (link_tx, link_rx, notification) = match built {
            Ok(link) => link,
            // ferry: tell the client it was refused before closing.
            Err(LinkError::Refused(ack)) => {
                // Said before the client can read it, so the log is never
                // behind what the client knows.
                refused_by_router(peer, client_id, &ack);
                network.write(Packet::ConnAck(ack.clone(), None)).await?;
                return Err(LinkError::Refused(ack).into());
            }
            Err(e) => return Err(e.into()),
        };

        let id = link_rx.id();
        Span::current().record("connection_id", id);
        // ferry: connections accepted, by protocol level.
        let by_level = match level {
            3 => &crate::counters::CONNECTS_V31,
            5 => &crate::counters::CONNECTS_V5,
            _ => &crate::counters::CONNECTS_V311,
        };
        by_level.fetch_add(1, Ordering::Relaxed);

        if let Some(mut packet) = notification.into() {
            if let Packet::ConnAck(_ack, props) = &mut packet {
                let mut new_props = props.clone().unwrap_or_default();
                new_props.assigned_client_identifier = assigned_client_id;
                // ferry: what the connection is held to, told (MQTT 5).
                let granted = properties::Granted {
                    server_keep_alive: asked_keep_alive.map(|_| connect.keep_alive),
                    session_expiry: expiry_capped.then_some(session_expiry),
                    max_packet_size: config.max_payload_size.min(u32::MAX as usize) as u32,
                    topic_alias_max: config.topic_alias_max,
                    receive_max: config.max_inflight_count.clamp(1, u16::MAX as usize) as u16,
                };
                *props = Some(granted.into_properties(new_props));
                network.write(packet).await?;
            }
        }

        // ferry: a clean session resends nothing of an earlier connection.
        if let (true, Some(sink)) = (clean_session, &config.publish_sink) {
            sink.clean_start(&connect.client_id);
        }

        Ok(RemoteLink {
            connection_id: id,
            network,
            link_tx,
            link_rx,
            // ferry: allocated when used.
            notifications: VecDeque::new(),
            will_delay_interval,
            isolation: None,
            also_publish: config.also_publish.clone(),
            aliases: properties::Aliases::new(config.topic_alias_max),
            sink: config.publish_sink.clone(),
            client: Arc::from(connect.client_id.as_str()),
            acks: Acks::default(),
            direct: Vec::new(),
            acked: Vec::new(),
            connect,
        })
    }

    /// ferry: holds this client to its own topics under `prefix` (see
    /// [`crate::ConnectionSettings::isolation`]).
    pub fn set_isolation(&mut self, prefix: Option<String>) {
        self.isolation = prefix.map(|p| (self.client_id().to_owned(), p));
    }

    fn client_id(&self) -> &str {
        &self.connect.client_id
    }

    /// ferry: which connection this is, among all that held its slot.
    pub(crate) fn incarnation(&self) -> crate::router::Incarnation {
        self.link_tx.incarnation
    }

    /// ferry: sends a publish outside the client's own topics to the
    /// quarantine topic instead, naming the publisher and its topic.
    fn quarantine(&self, packets: &mut VecDeque<Packet>, from: usize) {
        let Some((client_id, prefix)) = &self.isolation else {
            return;
        };
        for packet in packets.iter_mut().skip(from) {
            let Packet::Publish(publish, props) = packet else {
                continue;
            };
            let topic = String::from_utf8_lossy(&publish.topic).into_owned();
            if crate::may_publish(prefix, self.also_publish.as_ref(), client_id, &topic) {
                continue;
            }
            debug!(
                client_id = %crate::refusals::Clip(client_id),
                topic = %crate::refusals::Clip(&topic),
                "publish outside the client's own topics quarantined"
            );
            let props = props.get_or_insert_with(Default::default);
            props
                .user_properties
                .push((crate::PUBLISHER_PROPERTY.to_owned(), client_id.clone()));
            props
                .user_properties
                .push((crate::TOPIC_PROPERTY.to_owned(), topic));
            publish.topic = bytes::Bytes::from_static(crate::QUARANTINE_TOPIC.as_bytes());
        }
    }

    /// ferry: resolves the topic aliases and checks the properties of the
    /// publishes from `from` on; the first that breaks the rules, and why.
    fn check_properties(
        aliases: &mut properties::Aliases,
        packets: &mut VecDeque<Packet>,
        from: usize,
    ) -> Option<(usize, crate::protocol::DisconnectReasonCode)> {
        for (at, packet) in packets.iter_mut().enumerate().skip(from) {
            let Packet::Publish(publish, props) = packet else {
                continue;
            };
            let checked = aliases
                .resolve(publish, props)
                .and_then(|()| properties::check_client_properties(props));
            if let Err(reason) = checked {
                return Some((at, reason));
            }
        }
        None
    }

    /// ferry: hands what was read for the sink on, in order, each
    /// publish with its place among the acks.
    async fn hand_on(&mut self) -> Result<(), Error> {
        let Some(sink) = &self.sink else {
            return Ok(());
        };
        // ferry: held while its deliveries are unread (the router wakes
        // this task once they are read), within bounds.
        if self.link_tx.behind() {
            let bytes: usize = self
                .direct
                .iter()
                .map(|p| match p {
                    Packet::Publish(publish, _) => publish.topic.len() + publish.payload.len(),
                    _ => 0,
                })
                .sum();
            if self.direct.len() > MAX_HELD || bytes > MAX_HELD_BYTES {
                if crate::refusals::admit_client(&self.client) {
                    warn!(
                        event = "client_stalled_disconnected",
                        client_id = %crate::refusals::Clip(&self.client),
                        held = self.direct.len(),
                        bytes,
                        "client neither reads its messages nor waits for acknowledgements; disconnected"
                    );
                }
                return Err(Error::Stalled);
            }
            return Ok(());
        }
        for packet in self.direct.drain(..) {
            match packet {
                Packet::Publish(publish, props) => {
                    let number = sink.number(&self.client, &publish);
                    let ack = self.acks.slot(&publish, number);
                    if !sink.send(&self.client, publish, props, number, ack).await {
                        return Err(Error::GatewayGone);
                    }
                }
                Packet::PubRel(rel, _) => self.acks.release(rel.pkid),
                _ => {}
            }
        }
        Ok(())
    }

    /// ferry: writes the acks answered and the notifications queued, in
    /// one write; an unscheduled connection asks the router to go on.
    async fn write_out(&mut self) -> Result<(), Error> {
        if self.acked.is_empty() && self.notifications.is_empty() {
            return Ok(());
        }
        // ferry: the notifications are encoded straight into the write
        // buffer (patch 60); upstream built a new `VecDeque` of packets for
        // every exchange and grew it one push at a time.
        let mut unscheduled = false;
        let notifications = self.notifications.drain(..).filter_map(|notif| {
            let packet: Option<Packet> = notif.into();
            unscheduled |= packet.is_none();
            packet
        });
        let packets = self.acked.drain(..).chain(notifications);
        self.network.writev(packets).await?;
        if unscheduled {
            self.link_rx.wake().await?;
        }
        Ok(())
    }

    pub async fn start(&mut self) -> Result<(), Error> {
        self.network.set_keepalive(self.connect.keep_alive);

        // Note:
        // Shouldn't result in bounded queue deadlocks because of blocking n/w send
        loop {
            select! {
                o = self.network.read(), if self.acks.has_room() => {
                    let packet = o?;
                    let (len, routed, second_connect, bad) = {
                        let mut buffer = self.link_tx.buffer();
                        let from = buffer.len();
                        buffer.push_back(packet);
                        self.network.readv(&mut buffer)?;
                        // ferry: real topics and no forged marks before
                        // isolation looks (a bad alias ends the connection
                        // after what came before it).
                        let bad = Self::check_properties(&mut self.aliases, &mut buffer, from);
                        if let Some((at, _)) = bad {
                            buffer.truncate(at);
                        }
                        self.quarantine(&mut buffer, from);
                        // ferry: what came before a second CONNECT is
                        // handled; the CONNECT and what follows it are not.
                        let second = buffer
                            .iter()
                            .skip(from)
                            .position(|p| matches!(p, Packet::Connect(..)));
                        if let Some(at) = second {
                            buffer.truncate(from + at);
                        }
                        // ferry: publishes (and PUBRELs) go to the gateway.
                        if self.sink.is_some() {
                            let read: Vec<Packet> = buffer.drain(from..).collect();
                            let behind = self.link_tx.behind();
                            for packet in read {
                                match packet {
                                    // Its own copy while held: a slice would
                                    // pin the connection's whole read buffer.
                                    Packet::Publish(mut publish, props) if behind => {
                                        publish.topic = bytes::Bytes::copy_from_slice(&publish.topic);
                                        publish.payload = bytes::Bytes::copy_from_slice(&publish.payload);
                                        self.direct.push(Packet::Publish(publish, props));
                                    }
                                    Packet::Publish(..) | Packet::PubRel(..) => self.direct.push(packet),
                                    // A PUBACK for a direct publish is
                                    // settled here, without the router.
                                    Packet::PubAck(ref ack, _) if self.link_tx.ack_direct(ack.pkid) => {}
                                    packet => buffer.push_back(packet),
                                }
                            }
                        }
                        (buffer.len(), buffer.len() > from, second.is_some(), bad)
                    };

                    trace!("Packets read from network, count = {}", len);
                    self.hand_on().await?;
                    if routed {
                        self.link_tx.notify().await?;
                    }
                    if let Some((_, reason)) = bad {
                        self.network.disconnect(reason).await;
                        return Err(Error::BadProperties(reason));
                    }
                    if second_connect {
                        return Err(Error::SecondConnect);
                    }
                }
                // ferry: the gateway answered the first publishes waiting;
                // what is queued for the client meanwhile (their `stored`
                // receipts) goes in the same write.
                _ = self.acks.ready(), if !self.acks.is_empty() => {
                    let answered = self.acks.answered(&mut self.acked);
                    self.link_rx.take_ready(&mut self.notifications);
                    self.write_out().await?;
                    if answered.is_err() {
                        return Err(Error::NotAcknowledged);
                    }
                }
                // Receive from router when previous when state isn't in collision
                // due to previously received data request
                o = self.link_rx.exchange(&mut self.notifications) => {
                    o?;
                    // ferry: acks answered meanwhile go in the same write.
                    let answered = if self.acks.is_empty() {
                        Ok(())
                    } else {
                        self.acks.answered(&mut self.acked)
                    };
                    self.write_out().await?;
                    if answered.is_err() {
                        return Err(Error::NotAcknowledged);
                    }
                    // ferry: what was held while its deliveries were
                    // unread goes on once they are read.
                    if !self.direct.is_empty() {
                        self.hand_on().await?;
                    }
                }
            }
        }
    }
}

/// ferry: counts and logs (within the peer's budget) a CONNECT the router
/// refused: no room (`max_connections`), or a client id it cannot take.
fn refused_by_router(peer: std::net::SocketAddr, client_id: &str, ack: &ConnAck) {
    use crate::refusals::{self, Clip};
    let full = ack.code == ConnectReturnCode::ServiceUnavailable;
    let counter = if full {
        &crate::counters::CONNECTIONS_FULL
    } else {
        &crate::counters::CLIENT_IDS_REFUSED
    };
    counter.fetch_add(1, Ordering::Relaxed);
    if !refusals::admit(peer.ip()) {
    } else if full {
        warn!(
            event = "connections_full",
            %peer,
            client_id = %Clip(client_id),
            "no room for another connection (max_connections); CONNECT refused"
        );
    } else {
        warn!(
            event = "client_id_refused",
            %peer,
            client_id = %Clip(client_id),
            code = ?ack.code,
            "CONNECT refused: the client id cannot be taken"
        );
    }
}

/// Read MQTT connect packet from network and verify it.
/// authentication and checks are done here.
pub async fn mqtt_connect<P>(
    config: Arc<ConnectionSettings>,
    network: &mut Network<P>,
    peer: std::net::SocketAddr,
) -> Result<Packet, Error>
where
    P: Protocol,
{
    // Wait for MQTT connect packet and error out if it's not received in time to prevent
    // DOS attacks by filling total connections that the server can handle with idle open
    // connections which results in server rejecting new connections
    let connection_timeout_ms = config.connection_timeout_ms.into();
    let packet = time::timeout(Duration::from_millis(connection_timeout_ms), async {
        let packet = network.read().await?;
        Ok::<_, network::Error>(packet)
    })
    .await?;
    // ferry: a CONNECT too large to read is answered, not reset: CONNACK 2
    // when its client id is over the limit, 5 when the rest of it is.
    let packet = match packet {
        Err(network::Error::ConnectTooLarge {
            size,
            client_id_len,
        }) => {
            let id_too_long =
                config.max_client_id_len > 0 && client_id_len > config.max_client_id_len;
            // ferry: packet too large is 0x95 to an MQTT 5 client, 5 (not
            // authorized) to 3.1.1, as before.
            let code = if id_too_long {
                ConnectReturnCode::ClientIdentifierNotValid
            } else {
                ConnectReturnCode::PacketTooLarge
            };
            crate::counters::CLIENT_IDS_REFUSED.fetch_add(1, Ordering::Relaxed);
            if crate::refusals::admit(peer.ip()) {
                warn!(
                    event = "connect_too_large",
                    %peer,
                    size,
                    client_id_len,
                    limit = config.max_payload_size,
                    "CONNECT refused: over the packet size limit"
                );
            }
            let ack = ConnAck {
                session_present: false,
                code,
            };
            network.write(Packet::ConnAck(ack, None)).await?;
            return Err(Error::Refused);
        }
        other => other?,
    };

    let (connect, _props, login) = match packet {
        Packet::Connect(ref connect, ref props, _, _, ref login) => (connect, props, login),
        packet => return Err(Error::NotConnectPacket(packet)),
    };

    Span::current().record(
        "client_id",
        crate::refusals::Clip(&connect.client_id).to_string(),
    );

    // ferry: a client id over the limit is refused before anything else
    // looks at it (CONNACK 2, identifier rejected).
    if config.max_client_id_len > 0 && connect.client_id.len() > config.max_client_id_len {
        crate::counters::CLIENT_IDS_REFUSED.fetch_add(1, Ordering::Relaxed);
        if crate::refusals::admit(peer.ip()) {
            warn!(
                event = "client_id_too_long",
                %peer,
                client_id = %crate::refusals::Clip(&connect.client_id),
                limit = config.max_client_id_len,
                "CONNECT refused: client id too long"
            );
        }
        let ack = ConnAck {
            session_present: false,
            code: ConnectReturnCode::ClientIdentifierNotValid,
        };
        network.write(Packet::ConnAck(ack, None)).await?;
        return Err(Error::Refused);
    }

    // ferry: MQTT 5's enhanced authentication (AUTH exchanges) is not
    // offered: a CONNECT naming a method is told so (0x8C), not let in
    // as if it had none.
    if let Some(method) = _props
        .as_ref()
        .and_then(|p| p.authentication_method.as_ref())
    {
        if crate::refusals::admit(peer.ip()) {
            warn!(
                event = "connect_auth_method_refused",
                %peer,
                client_id = %crate::refusals::Clip(&connect.client_id),
                method = %crate::refusals::Clip(method),
                "CONNECT refused: enhanced authentication is not offered"
            );
        }
        let ack = ConnAck {
            session_present: false,
            code: ConnectReturnCode::BadAuthenticationMethod,
        };
        network.write(Packet::ConnAck(ack, None)).await?;
        return Err(Error::Refused);
    }

    // ferry: a receive maximum or maximum packet size of 0 is the client's
    // protocol error (MQTT 5 §3.1.2.11.3, §3.1.2.11.4): told so (0x82) and
    // closed, not taken as "no limit".
    if let Some(why) = properties::connect_protocol_error(_props.as_ref()) {
        crate::counters::PROTOCOL_VIOLATIONS.fetch_add(1, Ordering::Relaxed);
        if crate::refusals::admit(peer.ip()) {
            warn!(
                event = "connect_protocol_error",
                %peer,
                client_id = %crate::refusals::Clip(&connect.client_id),
                why,
                "CONNECT refused: a protocol error in its properties"
            );
        }
        let ack = ConnAck {
            session_present: false,
            code: ConnectReturnCode::ProtocolError,
        };
        network.write(Packet::ConnAck(ack, None)).await?;
        return Err(Error::Refused);
    }

    handle_auth(config.clone(), login.as_ref(), &connect.client_id).await?;

    // ferry: the connect hook decides, and a refusal gets its CONNACK.
    if let Some(hook) = &config.connect_hook {
        let info = crate::ConnectInfo {
            client_id: connect.client_id.clone(),
            username: login.as_ref().map(|l| l.username.clone()),
            password: login.as_ref().map(|l| l.password.clone()),
            peer,
        };
        if let Err(code) = hook(info).await {
            let ack = ConnAck {
                session_present: false,
                code,
            };
            network.write(Packet::ConnAck(ack, None)).await?;
            return Err(Error::Refused);
        }
    }

    // When keep_alive feature is disabled client can live forever, which is not good in
    // distributed broker context so currenlty we don't allow it.
    // ferry: unless a longest keep-alive is set, which then stands in for 0
    // (see `effective_keep_alive`).
    if connect.keep_alive == 0 && config.max_keep_alive == 0 {
        return Err(Error::ZeroKeepAlive);
    }

    let empty_client_id = connect.client_id.is_empty();
    let clean_session = connect.clean_session;

    if empty_client_id && !clean_session {
        let ack = ConnAck {
            session_present: false,
            code: ConnectReturnCode::ClientIdentifierNotValid,
        };

        let packet = Packet::ConnAck(ack, None);
        network.write(packet).await?;

        return Err(Error::InvalidClientId);
    }

    // Ok((connect, props, lastwill, lastwill_props))
    Ok(packet)
}

/// ferry: the keep-alive a connection is held to: what it asked for, but
/// at most `max` seconds, and `max` when it asked for none (0). `max == 0`
/// means no limit.
pub(crate) fn effective_keep_alive(asked: u16, max: u16) -> u16 {
    match (asked, max) {
        (asked, 0) => asked,
        (0, max) => max,
        (asked, max) => asked.min(max),
    }
}

async fn handle_auth(
    config: Arc<ConnectionSettings>,
    login: Option<&Login>,
    client_id: &str,
) -> Result<(), Error> {
    if config.auth.is_none() && config.external_auth.is_none() {
        return Ok(());
    }

    // if authentication is configured and connect packet doesn't have login details
    // return an error
    let Some(login) = login else {
        return Err(Error::InvalidAuth);
    };

    let username = &login.username;
    let password = &login.password;

    if let Some(auth) = &config.external_auth {
        if !auth(
            client_id.to_owned(),
            username.to_owned(),
            password.to_owned(),
        )
        .await
        {
            return Err(Error::InvalidAuth);
        }

        return Ok(());
    }

    if let Some(pairs) = &config.auth {
        if let Some(stored_password) = pairs.get(username) {
            if stored_password.as_bytes().ct_eq(password.as_bytes()).into() {
                return Ok(());
            }
        }

        return Err(Error::InvalidAuth);
    }

    Err(Error::InvalidAuth)
}

/// ferry: what the connection took and never acknowledged on the wire is
/// remembered for the client's resends (`link::direct`).
impl<P> Drop for RemoteLink<P> {
    fn drop(&mut self) {
        if let Some(sink) = &self.sink {
            sink.left_unacknowledged(&self.client, self.acks.unacknowledged());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, sync::Arc};

    use crate::{protocol::Login, ConnectionSettings};

    use super::handle_auth;

    fn config() -> ConnectionSettings {
        ConnectionSettings {
            connection_timeout_ms: 0,
            max_payload_size: 0,
            max_inflight_count: 0,
            auth: None,
            external_auth: None,
            connect_hook: None,
            also_publish: None,
            dynamic_filters: false,
            max_keep_alive: 0,
            oversize_head: 0,
            isolation: None,
            max_client_id_len: 0,
            max_session_expiry: 0,
            topic_alias_max: 0,
            publish_sink: None,
            ws_path: None,
        }
    }

    #[test]
    fn keep_alive_is_capped_and_zero_stands_for_the_cap() {
        use super::effective_keep_alive;
        assert_eq!(effective_keep_alive(30, 0), 30);
        assert_eq!(effective_keep_alive(0, 0), 0);
        assert_eq!(effective_keep_alive(30, 600), 30);
        assert_eq!(effective_keep_alive(65535, 600), 600);
        assert_eq!(effective_keep_alive(0, 600), 600);
    }

    fn login() -> Login {
        Login {
            username: "u".to_owned(),
            password: "p".to_owned(),
        }
    }

    #[tokio::test]
    async fn no_login_no_auth() {
        let cfg = Arc::new(config());
        let r = handle_auth(cfg, None, "").await;
        assert!(r.is_ok());
    }

    #[tokio::test]
    async fn some_login_no_auth() {
        let cfg = Arc::new(config());
        let login = login();
        let r = handle_auth(cfg, Some(&login), "").await;
        assert!(r.is_ok());
    }

    #[tokio::test]
    async fn login_matches_static_auth() {
        let login = login();
        let mut map = HashMap::<String, String>::new();
        map.insert(login.username.clone(), login.password.clone());

        let mut cfg = config();
        cfg.auth = Some(map);

        let r = handle_auth(Arc::new(cfg), Some(&login), "").await;
        assert!(r.is_ok());
    }

    #[tokio::test]
    async fn login_fails_static_no_external() {
        let login = login();
        let mut map = HashMap::<String, String>::new();
        map.insert("wrong".to_owned(), "wrong".to_owned());

        let mut cfg = config();
        cfg.auth = Some(map);

        let r = handle_auth(Arc::new(cfg), Some(&login), "").await;
        assert!(r.is_err());
    }

    #[tokio::test]
    async fn login_fails_static_matches_external() {
        let login = login();

        let mut map = HashMap::<String, String>::new();
        map.insert("wrong".to_owned(), "wrong".to_owned());

        let dynamic = |_: String, _: String, _: String| async { true };

        let mut cfg = config();
        cfg.auth = Some(map);
        cfg.set_auth_handler(dynamic);

        let r = handle_auth(Arc::new(cfg), Some(&login), "").await;
        assert!(r.is_ok());
    }

    #[tokio::test]
    async fn login_fails_static_fails_external() {
        let login = login();

        let mut map = HashMap::<String, String>::new();
        map.insert("wrong".to_owned(), "wrong".to_owned());

        let dynamic = |_: String, _: String, _: String| async { false };

        let mut cfg = config();
        cfg.auth = Some(map);
        cfg.set_auth_handler(dynamic);

        let r = handle_auth(Arc::new(cfg), Some(&login), "").await;
        assert!(r.is_err());
    }

    #[tokio::test]
    async fn external_auth_clousre_or_fnptr_type_check_or_fail_compile() {
        let closure = |_: String, _: String, _: String| async { false };
        async fn fnptr(_: String, _: String, _: String) -> bool {
            true
        }

        let mut cfg = config();
        cfg.set_auth_handler(closure);
        cfg.set_auth_handler(fnptr);
    }
}
