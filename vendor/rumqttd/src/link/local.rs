use crate::protocol::{
    ConnAck, ConnectReturnCode, Filter, LastWill, LastWillProperties, Packet, Publish, QoS,
    RetainForwardRule, Subscribe, Unsubscribe,
};
use crate::router::Ack;
use crate::router::{
    iobufs::{Incoming, Outgoing},
    Connection, Event, Notification, ShadowRequest,
};
use crate::ConnectionId;
use bytes::Bytes;
use flume::{Receiver, RecvError, RecvTimeoutError, SendError, Sender, TrySendError};
use parking_lot::lock_api::MutexGuard;
use parking_lot::{Mutex, RawMutex};

use std::collections::VecDeque;
use std::mem;
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("Unexpected router message")]
    NotConnectionAck,
    #[error("ConnAck error {0}")]
    ConnectionAck(String),
    #[error("Channel try send error")]
    TrySend(#[from] TrySendError<(ConnectionId, Event)>),
    #[error("Channel send error")]
    Send(#[from] SendError<(ConnectionId, Event)>),
    #[error("Channel recv error")]
    Recv(#[from] RecvError),
    #[error("Channel timeout recv error")]
    RecvTimeout(#[from] RecvTimeoutError),
    #[error("Timeout = {0}")]
    Elapsed(#[from] tokio::time::error::Elapsed),
    /// ferry: the router refused the connection with this CONNACK.
    #[error("Connection refused: {0:?}")]
    Refused(ConnAck),
}

impl LinkError {
    /// ferry: a `recv_deadline` that only ran out of time.
    pub fn is_timeout(&self) -> bool {
        matches!(self, LinkError::RecvTimeout(RecvTimeoutError::Timeout))
    }
}

// used to build LinkTx and LinkRx
pub struct LinkBuilder<'a> {
    tenant_id: Option<String>,
    client_id: &'a str,
    router_tx: Sender<(ConnectionId, Event)>,
    // true by default
    clean_session: bool,
    last_will: Option<LastWill>,
    last_will_properties: Option<LastWillProperties>,
    // false by default
    dynamic_filters: bool,
    // default to 0, indicating to not use topic alias
    topic_alias_max: u16,
    // ferry: false by default (local links are never held back)
    holdable: bool,
    // ferry: 0 by default (a will is published as soon as its connection ends)
    will_delay: u32,
    // ferry: what the client asked of its session and of what it is sent
    // (see `Connection`): no session, no limits by default.
    session_expiry: u32,
    session_expiry_cap: u32,
    receive_max: u16,
    max_packet_size: u32,
}

impl<'a> LinkBuilder<'a> {
    pub fn new(client_id: &'a str, router_tx: Sender<(ConnectionId, Event)>) -> Self {
        LinkBuilder {
            client_id,
            router_tx,
            tenant_id: None,
            clean_session: true,
            last_will: None,
            last_will_properties: None,
            dynamic_filters: false,
            topic_alias_max: 0,
            holdable: false,
            will_delay: 0,
            session_expiry: 0,
            session_expiry_cap: 0,
            receive_max: u16::MAX,
            max_packet_size: 0,
        }
    }

    /// ferry: seconds the session outlives the connection (0: none).
    pub fn session_expiry(mut self, secs: u32) -> Self {
        self.session_expiry = secs;
        self
    }

    /// ferry: the most a DISCONNECT may set the session expiry to (the
    /// broker's cap).
    pub fn session_expiry_cap(mut self, secs: u32) -> Self {
        self.session_expiry_cap = secs;
        self
    }

    /// ferry: the client's receive maximum and maximum packet size (0: no
    /// limit), which what it is sent is held to.
    pub fn client_limits(mut self, receive_max: u16, max_packet_size: u32) -> Self {
        self.receive_max = receive_max;
        self.max_packet_size = max_packet_size;
        self
    }

    /// ferry: seconds from the connection's end to its will's publication
    /// (MQTT 5's will delay, at most the session expiry).
    pub fn will_delay(mut self, secs: u32) -> Self {
        self.will_delay = secs;
        self
    }

    /// ferry: this connection's publishes may be held back (remote clients).
    pub fn holdable(mut self, holdable: bool) -> Self {
        self.holdable = holdable;
        self
    }

    pub fn tenant_id(mut self, tenant_id: Option<String>) -> Self {
        self.tenant_id = tenant_id;
        self
    }

    pub fn last_will(mut self, last_will: Option<LastWill>) -> Self {
        self.last_will = last_will;
        self
    }

    pub fn last_will_properties(
        mut self,
        last_will_properties: Option<LastWillProperties>,
    ) -> Self {
        self.last_will_properties = last_will_properties;
        self
    }

    pub fn topic_alias_max(mut self, max: u16) -> Self {
        self.topic_alias_max = max;
        self
    }

    pub fn clean_session(mut self, clean: bool) -> Self {
        self.clean_session = clean;
        self
    }

    pub fn dynamic_filters(mut self, dynamic_filters: bool) -> Self {
        self.dynamic_filters = dynamic_filters;
        self
    }

    pub fn build(self) -> Result<(LinkTx, LinkRx, Notification), LinkError> {
        // Connect to router
        // Local connections to the router shall have access to all subscriptions
        let mut connection = Connection::new(
            self.tenant_id,
            self.client_id.to_owned(),
            self.clean_session,
            self.dynamic_filters,
        );

        connection
            .last_will(self.last_will, self.last_will_properties)
            .topic_alias_max(self.topic_alias_max);
        connection.holdable = self.holdable;
        connection.will_delay = self.will_delay;
        connection.session_expiry = self.session_expiry;
        connection.session_expiry_cap = self.session_expiry_cap;
        connection.receive_max = self.receive_max;
        connection.max_packet_size = self.max_packet_size;
        let incarnation = connection.incarnation;
        let incoming = Incoming::new(connection.client_id.to_owned());
        let (outgoing, link_rx) = Outgoing::new(connection.client_id.to_owned());
        let outgoing_data_buffer = outgoing.buffer();
        let incoming_data_buffer = incoming.buffer();
        let out = outgoing.out.clone();
        let behind = outgoing.lock().behind.clone();

        let event = Event::Connect {
            connection,
            incoming,
            outgoing,
        };

        self.router_tx.send((0, event))?;

        link_rx.recv()?;
        let notification = outgoing_data_buffer.lock().pop_front().unwrap();

        // Right now link identifies failure with dropped rx in router,
        // which is probably ok. We need this here to get id assigned by router
        let id = match &notification {
            // ferry: a refusal carries its CONNACK back to the caller.
            Notification::DeviceAck(Ack::ConnAck(_, ack, _))
                if ack.code != ConnectReturnCode::Success =>
            {
                return Err(LinkError::Refused(ack.clone()))
            }
            Notification::DeviceAck(Ack::ConnAck(id, ..)) => *id,
            _message => return Err(LinkError::NotConnectionAck),
        };

        let mut tx = LinkTx::new(id, self.router_tx.clone(), incoming_data_buffer);
        tx.incarnation = incarnation;
        tx.behind = behind;
        tx.out = Some(out);
        let rx = LinkRx::new(id, self.router_tx, link_rx, outgoing_data_buffer);
        Ok((tx, rx, notification))
    }
}

/// ferry: delivers publishes for named clients (see [`LinkTx::deliver`])
/// from async code. A publish for a client whose connection is registered
/// is queued on that connection straight away (`iobufs::Out`), woken to
/// send it, without the router's thread; one for a client not connected
/// goes through the router (to its session, if it keeps one), and while
/// any is on its way there, every publish goes that way too, so none
/// overtakes another. Publishes from one task arrive in order.
#[derive(Clone)]
pub struct Deliverer {
    connection_id: ConnectionId,
    router_tx: Sender<(ConnectionId, Event)>,
    directory: Arc<crate::router::Directory>,
}

impl Deliverer {
    pub async fn deliver(&self, publishes: Vec<crate::DirectPublish>) -> Result<(), LinkError> {
        use std::sync::atomic::Ordering;
        let mut via_router = Vec::new();
        if self.directory.via_router.load(Ordering::Acquire) > 0 {
            via_router = publishes;
        } else {
            let links = self.directory.links.read();
            for d in publishes {
                if via_router.is_empty() {
                    if let Some(out) = links.get(&d.client_id) {
                        let mut out = out.lock();
                        if !out.closed {
                            if out.deliver(d) == crate::router::iobufs::Delivered::Queued {
                                out.flush_direct();
                                out.update_behind();
                            }
                            continue;
                        }
                    }
                }
                via_router.push(d);
            }
        }
        if via_router.is_empty() {
            return Ok(());
        }
        self.directory.via_router.fetch_add(1, Ordering::AcqRel);
        let sent = self
            .router_tx
            .send_async((self.connection_id, Event::Direct(via_router, true)))
            .await;
        if let Err(e) = sent {
            self.directory.via_router.fetch_sub(1, Ordering::AcqRel);
            return Err(e.into());
        }
        Ok(())
    }
}

pub struct LinkTx {
    pub(crate) connection_id: ConnectionId,
    /// ferry: the connection this link is, among all that held its slot.
    pub(crate) incarnation: crate::router::Incarnation,
    router_tx: Sender<(ConnectionId, Event)>,
    recv_buffer: Arc<Mutex<VecDeque<Packet>>>,
    /// ferry: set while the client has too many deliveries unread (see
    /// `iobufs::Out::behind`).
    pub(crate) behind: Arc<std::sync::atomic::AtomicBool>,
    /// ferry: what the client is sent (see `iobufs::Out`).
    out: Option<Arc<Mutex<crate::router::iobufs::Out>>>,
}

impl LinkTx {
    pub fn new(
        connection_id: ConnectionId,
        router_tx: Sender<(ConnectionId, Event)>,
        recv_buffer: Arc<Mutex<VecDeque<Packet>>>,
    ) -> LinkTx {
        LinkTx {
            connection_id,
            incarnation: 0,
            router_tx,
            recv_buffer,
            behind: Default::default(),
            out: None,
        }
    }

    /// ferry: settles the client's PUBACK `pkid` here if it is for the
    /// direct publish at the head of what is in flight to it (the next
    /// ones then go into flight); false if it is the router's to settle.
    pub(crate) fn ack_direct(&self, pkid: u16) -> bool {
        self.out
            .as_ref()
            .is_some_and(|out| out.lock().ack_direct(pkid))
    }

    /// ferry: the client has too many deliveries unread: hand none of its
    /// publishes on until this clears (the router wakes the connection).
    pub(crate) fn behind(&self) -> bool {
        self.behind.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn buffer(&self) -> MutexGuard<'_, RawMutex, VecDeque<Packet>> {
        self.recv_buffer.lock()
    }

    /// Send raw device data
    fn push(&mut self, data: Packet) -> Result<usize, LinkError> {
        let len = {
            let mut buffer = self.recv_buffer.lock();
            buffer.push_back(data);
            buffer.len()
        };

        self.router_tx
            .send((self.connection_id, Event::DeviceData))?;

        Ok(len)
    }

    /// Send raw device data
    pub async fn send(&mut self, data: Packet) -> Result<usize, LinkError> {
        let len = {
            let mut buffer = self.recv_buffer.lock();
            buffer.push_back(data);
            buffer.len()
        };

        self.router_tx
            .send((self.connection_id, Event::DeviceData))?;

        Ok(len)
    }

    fn try_push(&mut self, data: Packet) -> Result<usize, LinkError> {
        let len = {
            let mut buffer = self.recv_buffer.lock();
            buffer.push_back(data);
            buffer.len()
        };

        self.router_tx
            .try_send((self.connection_id, Event::DeviceData))?;
        Ok(len)
    }

    pub(crate) async fn notify(&mut self) -> Result<(), LinkError> {
        self.router_tx
            .send_async((self.connection_id, Event::DeviceData))
            .await?;

        Ok(())
    }

    /// Sends a MQTT Publish to the router
    pub fn publish<S, V>(&mut self, topic: S, payload: V) -> Result<usize, LinkError>
    where
        S: Into<Bytes>,
        V: Into<Bytes>,
    {
        let publish = Publish {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: false,
            topic: topic.into(),
            pkid: 0,
            payload: payload.into(),
        };

        let len = self.push(Packet::Publish(publish, None))?;
        Ok(len)
    }

    /// Sends a MQTT Publish to the router
    pub fn try_publish<S, V>(&mut self, topic: S, payload: V) -> Result<usize, LinkError>
    where
        S: Into<Bytes>,
        V: Into<Bytes>,
    {
        let publish = Publish {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: false,
            topic: topic.into(),
            pkid: 0,
            payload: payload.into(),
        };

        let len = self.try_push(Packet::Publish(publish, None))?;
        // TODO: Remote item in buffer after failure and write unittest
        Ok(len)
    }

    /// ferry: subscribes to `filter` with its commit log sized by
    /// `segment` rather than the router's default, as a filter named in
    /// `RouterConfig::custom_segment` at start is: for a filter the link
    /// takes on while running. The size is told first, on the same
    /// channel, so the router has it when the subscribe makes the log.
    pub fn subscribe_sized<S: Into<String>>(
        &mut self,
        filter: S,
        segment: crate::SegmentConfig,
    ) -> Result<usize, LinkError> {
        let filter = filter.into();
        self.router_tx
            .send((self.connection_id, Event::Segment(filter.clone(), segment)))?;
        self.subscribe(filter)
    }

    /// Sends a MQTT Subscribe to the eventloop
    pub fn subscribe<S: Into<String>>(&mut self, filter: S) -> Result<usize, LinkError> {
        let filters = vec![Filter {
            path: filter.into(),
            qos: QoS::AtMostOnce,
            nolocal: false,
            preserve_retain: false,
            retain_forward_rule: RetainForwardRule::Never,
        }];

        let subscribe = Subscribe { pkid: 0, filters };

        let len = self.push(Packet::Subscribe(subscribe, None))?;
        Ok(len)
    }

    /// Sends a MQTT Subscribe to the eventloop
    pub fn try_subscribe<S: Into<String>>(&mut self, filter: S) -> Result<usize, LinkError> {
        let filters = vec![Filter {
            path: filter.into(),
            qos: QoS::AtMostOnce,
            nolocal: false,
            preserve_retain: false,
            retain_forward_rule: RetainForwardRule::Never,
        }];

        let subscribe = Subscribe { pkid: 0, filters };

        let len = self.try_push(Packet::Subscribe(subscribe, None))?;
        Ok(len)
    }

    /// Sends a MQTT Unsubscribe to the eventloop
    pub fn unsubscribe<S: Into<String>>(&mut self, filter: S) -> Result<usize, LinkError> {
        let unsubscribe = Unsubscribe {
            pkid: 0,
            filters: vec![filter.into()],
        };

        let len = self.push(Packet::Unsubscribe(unsubscribe, None))?;
        Ok(len)
    }

    /// Sends a MQTT Unsubscribe to the eventloop
    pub fn try_unsubscribe<S: Into<String>>(&mut self, filter: S) -> Result<usize, LinkError> {
        let unsubscribe = Unsubscribe {
            pkid: 0,
            filters: vec![filter.into()],
        };

        let len = self.try_push(Packet::Unsubscribe(unsubscribe, None))?;
        Ok(len)
    }

    /// ferry: publishes for named clients, each delivered to that client's
    /// connection directly and in order if it is connected and subscribed
    /// to a matching filter, and dropped otherwise. Nothing goes through a
    /// commit log, so nothing is overwritten while a client is slow: its
    /// queue grows, and past `RouterConfig::max_direct_queue` the client's
    /// own publishes are held back until it has read.
    pub fn deliver(&mut self, publishes: Vec<crate::DirectPublish>) -> Result<(), LinkError> {
        self.router_tx
            .send((self.connection_id, Event::Direct(publishes, false)))?;
        Ok(())
    }

    /// ferry: a handle that delivers as [`LinkTx::deliver`] does, from
    /// async code and from many tasks at once, without this link; a
    /// publish for a connected client is queued on its connection
    /// directly (`directory`: [`crate::Router::directory`]).
    pub fn deliverer(&self, directory: Arc<crate::router::Directory>) -> Deliverer {
        Deliverer {
            connection_id: self.connection_id,
            router_tx: self.router_tx.clone(),
            directory,
        }
    }

    /// ferry: hold back (true) or release (false) every remote client's
    /// publishes: none is acknowledged while held. For a consumer that
    /// cannot keep up, so the broker never accepts what it would overwrite.
    pub fn hold_remote(&mut self, hold: bool) -> Result<(), LinkError> {
        self.router_tx
            .send((self.connection_id, Event::HoldRemote(hold)))?;
        Ok(())
    }

    /// Request to get device shadow
    pub fn shadow<S: Into<String>>(&mut self, filter: S) -> Result<(), LinkError> {
        let message = Event::Shadow(ShadowRequest {
            filter: filter.into(),
        });

        self.router_tx.try_send((self.connection_id, message))?;
        Ok(())
    }
}

#[derive(Debug)]
pub struct LinkRx {
    connection_id: ConnectionId,
    router_tx: Sender<(ConnectionId, Event)>,
    router_rx: Receiver<()>,
    send_buffer: Arc<Mutex<VecDeque<Notification>>>,
    cache: VecDeque<Notification>,
}

impl LinkRx {
    pub fn new(
        connection_id: ConnectionId,
        router_tx: Sender<(ConnectionId, Event)>,
        router_rx: Receiver<()>,
        outgoing_data_buffer: Arc<Mutex<VecDeque<Notification>>>,
    ) -> LinkRx {
        LinkRx {
            connection_id,
            router_tx,
            router_rx,
            send_buffer: outgoing_data_buffer,
            // ferry: allocated when used.
            cache: VecDeque::new(),
        }
    }

    pub fn id(&self) -> ConnectionId {
        self.connection_id
    }

    pub fn recv(&mut self) -> Result<Option<Notification>, LinkError> {
        // Read from cache first
        // One router_rx trigger signifies a bunch of notifications. So we
        // should always check cache first
        match self.cache.pop_front() {
            Some(v) => Ok(Some(v)),
            None => {
                // If cache is empty, check for router trigger and get fresh notifications
                self.router_rx.recv()?;
                // Collect 'all' the data in the buffer after a notification.
                // Notification means fresh data which isn't previously collected
                mem::swap(&mut *self.send_buffer.lock(), &mut self.cache);
                Ok(self.cache.pop_front())
            }
        }
    }

    pub fn recv_deadline(&mut self, deadline: Instant) -> Result<Option<Notification>, LinkError> {
        // Read from cache first
        // One router_rx trigger signifies a bunch of notifications. So we
        // should always check cache first
        match self.cache.pop_front() {
            Some(v) => Ok(Some(v)),
            None => {
                // If cache is empty, check for router trigger and get fresh notifications
                self.router_rx.recv_deadline(deadline)?;
                mem::swap(&mut *self.send_buffer.lock(), &mut self.cache);
                Ok(self.cache.pop_front())
            }
        }
    }

    pub async fn next(&mut self) -> Result<Option<Notification>, LinkError> {
        // Read from cache first
        // One router_rx trigger signifies a bunch of notifications. So we
        // should always check cache first
        match self.cache.pop_front() {
            Some(v) => Ok(Some(v)),
            None => {
                // If cache is empty, check for router trigger and get fresh notifications
                self.router_rx.recv_async().await?;
                // Collect 'all' the data in the buffer after a notification.
                // Notification means fresh data which isn't previously collected
                mem::swap(&mut *self.send_buffer.lock(), &mut self.cache);
                Ok(self.cache.pop_front())
            }
        }
    }

    pub(crate) async fn exchange(
        &mut self,
        notifications: &mut VecDeque<Notification>,
    ) -> Result<(), LinkError> {
        self.router_rx.recv_async().await?;
        mem::swap(&mut *self.send_buffer.lock(), notifications);
        Ok(())
    }

    /// ferry: what is queued for the connection now, without waiting: the
    /// wake-ups sent so far are taken, and with them what they announced.
    pub(crate) fn take_ready(&mut self, notifications: &mut VecDeque<Notification>) {
        if self.router_rx.try_recv().is_err() {
            return;
        }
        while self.router_rx.try_recv().is_ok() {}
        notifications.append(&mut self.send_buffer.lock());
    }

    pub fn ready(&self) -> Result<(), LinkError> {
        self.router_tx.send((self.connection_id, Event::Ready))?;
        Ok(())
    }

    /// ferry: as [`LinkTx::hold_remote`], for the side that knows when its
    /// consumer is behind.
    pub fn hold_remote(&self, hold: bool) -> Result<(), LinkError> {
        self.router_tx
            .send((self.connection_id, Event::HoldRemote(hold)))?;
        Ok(())
    }

    pub async fn wake(&self) -> Result<(), LinkError> {
        self.router_tx
            .send_async((self.connection_id, Event::Ready))
            .await?;

        Ok(())
    }
}

#[cfg(test)]
mod test {
    use super::LinkTx;
    use flume::bounded;
    use parking_lot::Mutex;
    use std::{collections::VecDeque, sync::Arc, thread};

    #[test]
    fn push_sends_all_data_and_notifications_to_router() {
        let (router_tx, router_rx) = bounded(10);
        let mut buffers = Vec::new();
        const CONNECTIONS: usize = 1000;
        const MESSAGES_PER_CONNECTION: usize = 100;

        for i in 0..CONNECTIONS {
            let buffer = Arc::new(Mutex::new(VecDeque::new()));
            let mut link_tx = LinkTx::new(i, router_tx.clone(), buffer.clone());
            buffers.push(buffer);
            thread::spawn(move || {
                for _ in 0..MESSAGES_PER_CONNECTION {
                    link_tx.publish("hello/world", vec![1, 2, 3]).unwrap();
                }
            });
        }

        // Router should receive notifications from all the connections
        for _ in 0..CONNECTIONS * MESSAGES_PER_CONNECTION {
            let _v = router_rx.recv().unwrap();
        }

        // Every connection has expected number of messages
        for item in buffers.iter().take(CONNECTIONS) {
            assert_eq!(item.lock().len(), MESSAGES_PER_CONNECTION);
        }

        // TODO: Write a similar test to benchmark buffer vs channels
    }
}
