use crate::link::alerts::{self};
use crate::link::console::ConsoleLink;
use crate::link::network::{self, Network, N};
use crate::link::remote::{self, mqtt_connect, RemoteLink};
use crate::link::{bridge, timer};
use crate::local::LinkBuilder;
use crate::protocol::v4::V4;
use crate::protocol::v5::V5;
use crate::protocol::{ConnAck, ConnectReturnCode};
use crate::protocol::{Packet, Protocol};
use crate::refusals::{self, Clip};
#[cfg(any(feature = "use-rustls", feature = "use-native-tls"))]
use crate::server::tls::{self, TLSAcceptor};
use crate::{meters, ConnectionSettings, Meter};
use flume::{RecvError, SendError, Sender};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tracing::{debug, error, field, info, warn, Instrument};
use uuid::Uuid;

#[cfg(feature = "websocket")]
use async_tungstenite::tokio::accept_hdr_async;
#[cfg(feature = "websocket")]
use async_tungstenite::tungstenite::handshake::server::{
    Callback, ErrorResponse, Request, Response,
};
#[cfg(feature = "websocket")]
use async_tungstenite::tungstenite::http::HeaderValue;
#[cfg(feature = "websocket")]
use ws_stream_tungstenite::WsStream;

use metrics::gauge;
use metrics_exporter_prometheus::PrometheusBuilder;
use std::time::Duration;
use std::{io, thread};

use crate::link::console;
use crate::link::local::{self, LinkRx, LinkTx};
use crate::router::{Event, Router};
use crate::{Config, ConnectionId, ServerSettings};

use tokio::net::TcpStream;
use tokio::time::error::Elapsed;
use tokio::{task, time};

#[derive(Debug, thiserror::Error)]
#[error("Acceptor error")]
pub enum Error {
    #[error("I/O {0}")]
    Io(#[from] io::Error),
    #[error("Timeout")]
    Timeout(#[from] Elapsed),
    #[error("Channel recv error")]
    Recv(#[from] RecvError),
    #[error("Channel send error")]
    Send(#[from] SendError<(ConnectionId, Event)>),
    #[cfg(any(feature = "use-rustls", feature = "use-native-tls"))]
    #[error("Certs error = {0}")]
    Certs(#[from] tls::Error),
    #[error("Accept error = {0}")]
    Accept(String),
    #[error("Remote error = {0}")]
    Remote(#[from] remote::Error),
    #[error("Invalid configuration")]
    Config(String),
}

pub struct Broker {
    config: Arc<Config>,
    router_tx: Sender<(ConnectionId, Event)>,
}

impl Broker {
    pub fn new(config: Config) -> Broker {
        let config = Arc::new(config);
        let router_config = config.router.clone();
        let router: Router = Router::new(config.id, router_config);

        // Setup cluster if cluster settings are configured.
        match config.cluster.clone() {
            Some(_cluster_config) => {
                // let node_id = cluster_config.node_id;
                // let listen = cluster_config.listen;
                // let seniors = cluster_config.seniors;
                // let mut cluster = RemoteCluster::new(node_id, &listen, seniors);
                // Broker::setup_remote_cluster(&mut router, node_id, &mut cluster);

                // Start router first and then cluster in the background
                let router_tx = router.spawn();
                // cluster.spawn();
                Broker { config, router_tx }
            }
            None => {
                let router_tx = router.spawn();
                Broker { config, router_tx }
            }
        }
    }

    // pub fn new_local_cluster(
    //     config: Config,
    //     node_id: NodeId,
    //     seniors: Vec<(NodeId, Sender<ReplicationData>)>,
    // ) -> (Broker, Sender<ReplicationData>) {
    //     let config = Arc::new(config);
    //     let router_config = config.router.clone();

    //     let mut router = Router::new(config.id, router_config);
    //     let (mut cluster, tx) = LocalCluster::new(node_id, seniors);
    //     Broker::setup_local_cluster(&mut router, node_id, &mut cluster);

    //     // Start router first and then cluster in the background
    //     let router_tx = router.spawn();
    //     cluster.spawn();

    //     (Broker { config, router_tx }, tx)
    // }

    // fn setup_remote_cluster(router: &mut Router, node_id: NodeId, cluster: &mut RemoteCluster) {
    //     // Retrieve pre-configured list of router <-> replica link from router
    //     // and add the link to cluster
    //     let nodes: Vec<NodeId> = (0..MAX_NODES).filter(|v| *v != node_id).collect();
    //     for node_id in nodes {
    //         let link = router.get_replica_handle(node_id);
    //         cluster.add_replica_router_handle(node_id, link);
    //     }
    // }

    // fn setup_local_cluster(router: &mut Router, node_id: NodeId, cluster: &mut LocalCluster) {
    //     // Retrieve pre-configured list of router <-> replica link from router
    //     // and add the link to cluster
    //     let nodes: Vec<NodeId> = (0..MAX_NODES).filter(|v| *v != node_id).collect();
    //     for node_id in nodes {
    //         let link = router.get_replica_handle(node_id);
    //         cluster.add_replica_router_handle(node_id, link);
    //     }
    // }

    // Link to get meters
    pub fn meters(&self) -> Result<meters::MetersLink, meters::LinkError> {
        let link = meters::MetersLink::new(self.router_tx.clone())?;
        Ok(link)
    }

    // Link to get alerts
    pub fn alerts(&self) -> Result<alerts::AlertsLink, alerts::LinkError> {
        let link = alerts::AlertsLink::new(self.router_tx.clone())?;
        Ok(link)
    }

    pub fn link(&self, client_id: &str) -> Result<(LinkTx, LinkRx), local::LinkError> {
        // Register this connection with the router. Router replies with ack which if ok will
        // start the link. Router can sometimes reject the connection (ex. max connection limit).
        let (link_tx, link_rx, _ack) =
            LinkBuilder::new(client_id, self.router_tx.clone()).build()?;
        Ok((link_tx, link_rx))
    }

    #[tracing::instrument(skip(self))]
    pub fn start(&mut self) -> Result<(), Error> {
        if self.config.v4.is_none()
            && self.config.v5.is_none()
            && (cfg!(not(feature = "websocket")) || self.config.ws.is_none())
        {
            return Err(Error::Config(
                "Atleast one server config must be specified, \
                consider adding either of [v4.x]/[v5.x] or [ws.x] (if enabled) in config file."
                    .to_string(),
            ));
        }

        // we don't know which servers (v4/v5/ws) user will spawn
        // so we collect handles for all of the spawned servers
        let mut server_thread_handles = Vec::new();

        if let Some(metrics_config) = self.config.metrics.clone() {
            let timer_thread = thread::Builder::new().name("timer".to_owned());
            let router_tx = self.router_tx.clone();
            timer_thread.spawn(move || {
                let mut runtime = tokio::runtime::Builder::new_current_thread();
                let runtime = runtime.enable_all().build().unwrap();

                runtime.block_on(async move {
                    timer::start(metrics_config, router_tx).await;
                });
            })?;
        }

        // Spawn bridge in a separate thread.
        if let Some(bridge_config) = self.config.bridge.clone() {
            let bridge_thread = thread::Builder::new().name(bridge_config.name.clone());
            let router_tx = self.router_tx.clone();
            bridge_thread.spawn(move || {
                let mut runtime = tokio::runtime::Builder::new_current_thread();
                let runtime = runtime.enable_all().build().unwrap();

                runtime.block_on(async move {
                    if let Err(e) = bridge::start(bridge_config, router_tx, V4).await {
                        error!(event = "bridge_failed", error=?e, "Bridge Link error");
                    };
                });
            })?;
        }

        // Spawn servers in a separate thread.
        if let Some(v4_config) = &self.config.v4 {
            for (_, config) in v4_config.clone() {
                let server_thread = thread::Builder::new().name(config.name.clone());
                let mut server = Server::new(config, self.router_tx.clone(), V4);
                let handle = server_thread.spawn(move || {
                    let mut runtime = tokio::runtime::Builder::new_current_thread();
                    let runtime = runtime.enable_all().build().unwrap();

                    runtime.block_on(async {
                        if let Err(e) = server.start(LinkType::Remote).await {
                            error!(event = "listener_failed", error=?e, "Server error - V4");
                        }
                    });
                })?;
                server_thread_handles.push(handle)
            }
        }

        if let Some(v5_config) = &self.config.v5 {
            for (_, config) in v5_config.clone() {
                let server_thread = thread::Builder::new().name(config.name.clone());
                let mut server = Server::new(config, self.router_tx.clone(), V5);
                let handle = server_thread.spawn(move || {
                    let mut runtime = tokio::runtime::Builder::new_current_thread();
                    let runtime = runtime.enable_all().build().unwrap();

                    runtime.block_on(async {
                        if let Err(e) = server.start(LinkType::Remote).await {
                            error!(event = "listener_failed", error=?e, "Server error - V5");
                        }
                    });
                })?;
                server_thread_handles.push(handle)
            }
        }

        #[cfg(not(feature = "websocket"))]
        if self.config.ws.is_some() {
            warn!(
                event = "websocket_ignored",
                "websocket feature is disabled, [ws] config will be ignored."
            );
        }

        #[cfg(feature = "websocket")]
        if let Some(ws_config) = &self.config.ws {
            for (_, config) in ws_config.clone() {
                let server_thread = thread::Builder::new().name(config.name.clone());
                //TODO: Add support for V5 procotol with websockets. Registered in config or on ServerSettings
                let mut server = Server::new(config, self.router_tx.clone(), V4);
                let handle = server_thread.spawn(move || {
                    let mut runtime = tokio::runtime::Builder::new_current_thread();
                    let runtime = runtime.enable_all().build().unwrap();

                    runtime.block_on(async {
                        if let Err(e) = server.start(LinkType::Websocket).await {
                            error!(event = "listener_failed", error=?e, "Server error - WS");
                        }
                    });
                })?;
                server_thread_handles.push(handle)
            }
        }

        if let Some(prometheus_setting) = &self.config.prometheus {
            let timeout = prometheus_setting.interval;
            // If port is specified use it instead of listen.
            // NOTE: This means listen is ignored when `port` is specified.
            // `port` will be removed in future release in favour of `listen`
            let addr = {
                #[allow(deprecated)]
                match prometheus_setting.port {
                    Some(port) => SocketAddr::new("127.0.0.1".parse().unwrap(), port),
                    None => prometheus_setting.listen.unwrap_or(SocketAddr::new(
                        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
                        9042,
                    )),
                }
            };
            let metrics_thread = thread::Builder::new().name("Metrics".to_owned());
            let meter_link = self.meters().unwrap();
            metrics_thread.spawn(move || {
                let builder = PrometheusBuilder::new().with_http_listener(addr);
                builder.install().unwrap();

                let total_publishes = gauge!("metrics.router.total_publishes");
                let total_connections = gauge!("metrics.router.total_connections");
                let failed_publishes = gauge!("metrics.router.failed_publishes");
                loop {
                    if let Ok(metrics) = meter_link.recv() {
                        for m in metrics {
                            match m {
                                Meter::Router(_, ref r) => {
                                    total_connections.set(r.total_connections as f64);
                                    total_publishes.set(r.total_publishes as f64);
                                    failed_publishes.set(r.failed_publishes as f64);
                                }
                                _ => continue,
                            }
                        }
                    }

                    std::thread::sleep(Duration::from_secs(timeout));
                }
            })?;
        }

        if let Some(console) = self.config.console.clone() {
            let console_link = ConsoleLink::new(console, self.router_tx.clone());

            let console_link = Arc::new(console_link);
            let console_thread = thread::Builder::new().name("Console".to_string());
            console_thread.spawn(move || {
                let mut runtime = tokio::runtime::Builder::new_current_thread();
                let runtime = runtime.enable_all().build().unwrap();
                runtime.block_on(console::start(console_link));
            })?;
        }

        // in ideal case, where server doesn't crash, join() will never resolve
        // we still try to join threads so that we don't return from function
        // unless everything crashes.
        server_thread_handles.into_iter().for_each(|handle| {
            // join() might panic in case the thread panics
            // we just ignore it
            let _ = handle.join();
        });

        Ok(())
    }
}

#[derive(Copy, Clone)]
pub enum LinkType {
    #[cfg(feature = "websocket")]
    Websocket,
    Remote,
}

pub struct Server<P> {
    config: ServerSettings,
    router_tx: Sender<(ConnectionId, Event)>,
    protocol: P,
}

impl<P: Protocol + Clone + Send + 'static> Server<P> {
    pub fn new(
        config: ServerSettings,
        router_tx: Sender<(ConnectionId, Event)>,
        protocol: P,
    ) -> Server<P> {
        Server {
            config,
            router_tx,
            protocol,
        }
    }

    pub async fn start(&mut self, link_type: LinkType) -> Result<(), Error> {
        // ferry: the TLS acceptor is built once, before listening (upstream
        // read the certificate files again for every connection, on the
        // accept loop).
        let acceptor = Arc::new(acceptor(&self.config)?);
        // ferry: listen with a backlog of 4096 instead of 128, so a reconnect
        // storm of thousands of devices is queued, not dropped.
        let socket = if self.config.listen.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.bind(self.config.listen)?;
        let listener = socket.listen(4096)?;
        let delay = Duration::from_millis(self.config.next_connection_delay_ms);
        let mut count: usize = 0;

        let config = Arc::new(self.config.connections.clone());
        // ferry: refusals left out of the log are summarised even when the
        // peer stops coming (see `refusals`).
        task::spawn(async {
            let mut tick = time::interval(Duration::from_secs(5));
            loop {
                tick.tick().await;
                refusals::flush();
            }
        });
        info!(
            event = "listening",
            config = self.config.name,
            listen_addr = self.config.listen.to_string(),
            "Listening for remote connections",
        );
        loop {
            // Await new network connection.
            let (stream, addr) = match listener.accept().await {
                Ok((s, r)) => (s, r),
                Err(e) => {
                    error!(event = "accept_failed", error=?e, "Unable to accept socket.");
                    continue;
                }
            };
            // ferry: receipts are small and latency matters; without this a
            // receipt can wait for the device's delayed ACK (~40 ms).
            let _ = stream.set_nodelay(true);

            // ferry: the TLS (and websocket) handshake runs in the
            // connection's own task, bounded with its CONNECT by
            // `connection_timeout_ms`: upstream awaited it here, so one
            // client that never finished it stalled every accept.
            let accepted = Accepted {
                peer: addr,
                connect_by: time::Instant::now()
                    + Duration::from_millis(config.connection_timeout_ms.into()),
                identity: CertIdentity::None,
            };
            let span = tracing::error_span!(
                "remote_link",
                peer = %addr,
                tenant_id = field::Empty,
                client_id = field::Empty,
                connection_id = field::Empty,
            );
            task::spawn(
                connection(
                    acceptor.clone(),
                    link_type,
                    stream,
                    accepted,
                    count,
                    config.clone(),
                    self.router_tx.clone(),
                    self.protocol.clone(),
                )
                .instrument(span),
            );
            count += 1;

            // ferry: no timer round trip per accept when there is no delay (a
            // zero sleep still waits a timer tick, capping accepts at ~200/s).
            if !delay.is_zero() {
                time::sleep(delay).await;
            }
        }
    }
}

/// ferry: a listener's TLS acceptor, if it serves TLS.
#[cfg(any(feature = "use-rustls", feature = "use-native-tls"))]
type Acceptor = TLSAcceptor;
/// ferry: without the TLS features there is never an acceptor.
#[cfg(not(any(feature = "use-rustls", feature = "use-native-tls")))]
type Acceptor = std::convert::Infallible;

#[cfg(any(feature = "use-rustls", feature = "use-native-tls"))]
fn acceptor(config: &ServerSettings) -> Result<Option<Acceptor>, Error> {
    match &config.tls {
        Some(c) => Ok(Some(TLSAcceptor::new(c)?)),
        None => Ok(None),
    }
}

#[cfg(not(any(feature = "use-rustls", feature = "use-native-tls")))]
fn acceptor(_config: &ServerSettings) -> Result<Option<Acceptor>, Error> {
    Ok(None)
}

/// ferry: who a client certificate says the client is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CertIdentity {
    /// Nothing: no client certificate, or its CN is not taken as the
    /// client id (`cn_is_client_id` off).
    None,
    /// Its CN: the only client id this connection may CONNECT with.
    ClientId(String),
    /// Its CN is missing or cannot be a client id (the reason): every
    /// CONNECT on this connection is refused.
    Invalid(String),
}

/// ferry: what a connection's task knows before its CONNECT.
pub(crate) struct Accepted {
    /// Where it came from, for the log lines about it.
    pub(crate) peer: SocketAddr,
    /// The handshake and the CONNECT must be done by then.
    pub(crate) connect_by: time::Instant,
    /// Who its client certificate says it is.
    pub(crate) identity: CertIdentity,
}

/// ferry: a TLS handshake error in words, for the operator: what the
/// alert a client sent (or what it sent instead of TLS) usually means.
pub(crate) fn tls_hint(error: &str) -> &'static str {
    let e = error.to_ascii_lowercase();
    if e.contains("unknownca") {
        "the device does not trust the gateway's certificate: the CA file the device uses is not the CA that signed south.tls.cert"
    } else if e.contains("certificateexpired") {
        "the device says the gateway's certificate has expired (or the device's clock is wrong)"
    } else if e.contains("badcertificate") || e.contains("certificateunknown") {
        "the device refused the gateway's certificate: its subjectAltName must hold the name or IP address the device connects to (docs/SECURITY.md, the certificate recipe)"
    } else if e.contains("protocolversion") || e.contains("peer is incompatible") {
        "no TLS version in common: the device speaks TLS older than 1.2"
    } else if e.contains("handshakefailure")
        || e.contains("no cipher")
        || e.contains("insufficientsecurity")
    {
        "no cipher suite in common with the device"
    } else if e.contains("invalidmessage")
        || e.contains("corrupt message")
        || e.contains("invalid content type")
    {
        "the client does not speak TLS: plain MQTT sent to a TLS listener?"
    } else {
        "see the error"
    }
}

/// ferry: the TLS handshake, if the listener serves TLS: the tenant id, who
/// the client certificate says the client is, and the stream. A failure
/// is logged here, with the peer: never as an error (a port scan, a client
/// speaking plain MQTT to a TLS port, a refused certificate are the
/// client's business; only a refused certificate is worth a warning).
async fn handshake(
    acceptor: &Option<Acceptor>,
    stream: TcpStream,
    peer: SocketAddr,
) -> Option<(Option<String>, CertIdentity, Box<dyn N>)> {
    let Some(acceptor) = acceptor else {
        return Some((None, CertIdentity::None, Box::new(stream)));
    };
    #[cfg(any(feature = "use-rustls", feature = "use-native-tls"))]
    match acceptor.accept(stream).await {
        Ok(accepted) => Some(accepted),
        Err(e) if e.is_certificate() => {
            crate::counters::TLS_HANDSHAKES_FAILED.fetch_add(1, Ordering::Relaxed);
            if refusals::admit(peer.ip()) {
                warn!(event = "tls_certificate_refused", %peer, error = %Clip(&e.to_string()), "TLS handshake failed: client certificate refused");
            }
            None
        }
        // A connection closed before any TLS (a port probe, a health
        // check) is no device that failed to connect.
        Err(e) if e.is_closed_early() => {
            info!(event = "tls_closed_before_handshake", %peer, error = %Clip(&e.to_string()), "connection closed before the TLS handshake");
            None
        }
        Err(e) => {
            crate::counters::TLS_HANDSHAKES_FAILED.fetch_add(1, Ordering::Relaxed);
            if refusals::admit(peer.ip()) {
                let error = e.to_string();
                warn!(event = "tls_handshake_failed", %peer, error = %Clip(&error), hint = tls_hint(&error), "TLS handshake failed");
            }
            None
        }
    }
    #[cfg(not(any(feature = "use-rustls", feature = "use-native-tls")))]
    match *acceptor {}
}

/// ferry: one accepted socket, in its own task: the TLS (and websocket)
/// handshake, bounded by `accepted.connect_by`, then the connection.
#[allow(clippy::too_many_arguments)]
async fn connection<P: Protocol>(
    acceptor: Arc<Option<Acceptor>>,
    link_type: LinkType,
    stream: TcpStream,
    mut accepted: Accepted,
    count: usize,
    config: Arc<ConnectionSettings>,
    router_tx: Sender<(ConnectionId, Event)>,
    protocol: P,
) {
    let peer = accepted.peer;
    let shaken = time::timeout_at(accepted.connect_by, handshake(&acceptor, stream, peer));
    let (tenant_id, network) = match shaken.await {
        Ok(Some((tenant_id, identity, network))) => {
            accepted.identity = identity;
            (tenant_id, network)
        }
        Ok(None) => return,
        Err(_) => {
            crate::counters::TLS_HANDSHAKES_FAILED.fetch_add(1, Ordering::Relaxed);
            if refusals::admit(peer.ip()) {
                warn!(event = "tls_handshake_timeout", %peer, "TLS handshake not done within the connection timeout");
            }
            return;
        }
    };
    if let Some(tenant_id) = &tenant_id {
        tracing::Span::current().record("tenant_id", tenant_id.as_str());
    }
    info!(event = "accepted", %peer, count, tenant = ?tenant_id, "accept");

    let network: Box<dyn N> = match link_type {
        #[cfg(feature = "websocket")]
        LinkType::Websocket => {
            let callback = WSCallback {
                path: config.ws_path.clone(),
            };
            let ws = time::timeout_at(accepted.connect_by, accept_hdr_async(network, callback));
            match ws.await {
                Ok(Ok(s)) => Box::new(WsStream::new(s)),
                Ok(Err(e)) => {
                    info!(event = "websocket_handshake_failed", %peer, error=?e, "Websocket failed handshake");
                    return;
                }
                Err(_) => {
                    info!(event = "websocket_handshake_timeout", %peer, "Websocket handshake not done within the connection timeout");
                    return;
                }
            }
        }
        LinkType::Remote => network,
    };
    remote(config, tenant_id, router_tx, network, protocol, accepted).await
}

/// Configures the Websocket connection to indicate the correct protocol
/// by adding the "sec-websocket-protocol" with value of "mqtt" to the response header
/// ferry: and, with a path, refuses a handshake for any other (404).
#[cfg(feature = "websocket")]
struct WSCallback {
    path: Option<String>,
}
#[cfg(feature = "websocket")]
impl Callback for WSCallback {
    fn on_request(
        self,
        request: &Request,
        mut response: Response,
    ) -> Result<Response, ErrorResponse> {
        if let Some(path) = &self.path {
            if request.uri().path() != path {
                let mut refused =
                    ErrorResponse::new(Some(format!("MQTT is served on {path} here\n")));
                *refused.status_mut() = async_tungstenite::tungstenite::http::StatusCode::NOT_FOUND;
                return Err(refused);
            }
        }
        response
            .headers_mut()
            .insert("sec-websocket-protocol", HeaderValue::from_static("mqtt"));
        Ok(response)
    }
}

/// A new network connection should wait for a mqtt connect packet. This should be handled
/// asynchronously to avoid blocking other new connections while this connection is
/// waiting for mqtt connect packet. Also this honours connection wait time as per config to prevent
/// denial of service attacks (rogue clients which only establish network connections without
/// sending a mqtt connection packet to make the server reach its concurrent connection limit).
async fn remote<P: Protocol>(
    config: Arc<ConnectionSettings>,
    tenant_id: Option<String>,
    router_tx: Sender<(ConnectionId, Event)>,
    stream: Box<dyn N>,
    protocol: P,
    // ferry: the peer, the CONNECT's deadline, the certificate's identity.
    accepted: Accepted,
) {
    let mut network = Network::new(
        stream,
        config.max_payload_size,
        config.max_inflight_count,
        protocol,
    );
    network.set_oversize_head(config.oversize_head);

    let dynamic_filters = config.dynamic_filters;
    let isolation = config.isolation.clone();
    let settings = config.clone();

    let max_keep_alive = config.max_keep_alive;
    // ferry: the CONNECT (and the connect hook's verdict) is due by the
    // deadline the handshake ran under.
    let connect = time::timeout_at(
        accepted.connect_by,
        mqtt_connect(config, &mut network, accepted.peer),
    );
    let mut connect_packet = match connect.await.unwrap_or_else(|e| Err(e.into())) {
        Ok(p) => p,
        // ferry: a client that goes away or times out before its CONNECT
        // (a port probe, a device losing power) is an ordinary event; a bad
        // CONNECT is the client's fault; neither is an error of the broker.
        Err(e @ (remote::Error::Network(network::Error::Io(_)) | remote::Error::Timeout(_))) => {
            info!(event = "connect_missing", peer = %accepted.peer, error=?e, "no CONNECT");
            return;
        }
        // ferry: the connect hook logged why it refused.
        Err(remote::Error::Refused) => {
            debug!("CONNECT refused");
            return;
        }
        // ferry: a protocol level none of the codecs speaks is told so
        // (CONNACK 1, in 3.1.1's format, which every client reads).
        Err(
            e @ remote::Error::Network(network::Error::Protocol(
                crate::protocol::Error::InvalidProtocolLevel(_),
            )),
        ) => {
            crate::counters::PROTOCOL_VIOLATIONS.fetch_add(1, Ordering::Relaxed);
            if refusals::admit(accepted.peer.ip()) {
                warn!(
                    event = "connect_unsupported_version",
                    peer = %accepted.peer,
                    error = %Clip(&e.to_string()),
                    "CONNECT refused: a protocol level the broker does not speak"
                );
            }
            let ack = ConnAck {
                session_present: false,
                code: ConnectReturnCode::RefusedProtocolVersion,
            };
            let _ = network.write(Packet::ConnAck(ack, None)).await;
            return;
        }
        // ferry: said in a bounded line (the error's text, never the packet
        // it carries), and only so often per peer.
        Err(e) => {
            crate::counters::PROTOCOL_VIOLATIONS.fetch_add(1, Ordering::Relaxed);
            if refusals::admit(accepted.peer.ip()) {
                warn!(
                    event = "connect_malformed",
                    peer = %accepted.peer,
                    error = %Clip(&e.to_string()),
                    "Error while handling MQTT connect packet"
                );
            }
            return;
        }
    };
    // ferry: hold the connection to the longest keep-alive allowed.
    let mut asked_keep_alive = None;
    if let Packet::Connect(connect, ..) = &mut connect_packet {
        let effective = remote::effective_keep_alive(connect.keep_alive, max_keep_alive);
        if effective != connect.keep_alive {
            info!(
                event = "keep_alive_capped",
                asked = connect.keep_alive,
                effective,
                "keep-alive capped"
            );
            asked_keep_alive = Some(connect.keep_alive);
            connect.keep_alive = effective;
        }
    }

    let mut client_id = match &connect_packet {
        Packet::Connect(ref connect, _, _, _, _) => connect.client_id.clone(),
        _ => unreachable!(),
    };

    // ferry: a client certificate names the one client id it may use.
    if let Err(why) = cert_allows(&accepted.identity, &client_id) {
        crate::counters::CERTIFICATE_ID_REFUSED.fetch_add(1, Ordering::Relaxed);
        if refusals::admit(accepted.peer.ip()) {
            warn!(
                event = "certificate_id_refused",
                peer = %accepted.peer,
                client_id = %Clip(&client_id),
                why = %Clip(&why),
                "CONNECT refused: not the client its certificate names"
            );
        }
        let ack = ConnAck {
            session_present: false,
            code: ConnectReturnCode::NotAuthorized,
        };
        let _ = network.write(Packet::ConnAck(ack, None)).await;
        return;
    }

    // ferry: a will obeys the rules of the client's publishes: under
    // isolation, only on its own topics. Checked here, at CONNECT, because
    // the router publishes a will with no client's packet to check.
    if let (Some(prefix), Packet::Connect(_, _, Some(will), _, _)) = (&isolation, &connect_packet) {
        let topic = String::from_utf8_lossy(&will.topic);
        if !crate::may_publish(prefix, settings.also_publish.as_ref(), &client_id, &topic) {
            crate::counters::WILLS_REFUSED.fetch_add(1, Ordering::Relaxed);
            if refusals::admit(accepted.peer.ip()) {
                warn!(
                    event = "will_refused",
                    peer = %accepted.peer,
                    client_id = %Clip(&client_id),
                    topic = %Clip(&topic),
                    "CONNECT refused: its will is on a topic the client may not publish on"
                );
            }
            let ack = ConnAck {
                session_present: false,
                code: ConnectReturnCode::NotAuthorized,
            };
            let _ = network.write(Packet::ConnAck(ack, None)).await;
            return;
        }
    }

    let mut assigned_client_id = None;
    if client_id.is_empty() {
        let uuid = Uuid::new_v4().simple();
        client_id = format!("rumqtt-{uuid}");
        assigned_client_id = Some(client_id.clone());
    }

    if let Some(tenant_id) = &tenant_id {
        // client_id is set to "tenant_id.client_id"
        // this is to make sure we are consistent,
        // as Connection uses this format of client_id
        client_id = format!("{tenant_id}.{client_id}");
    }

    // Start the link
    let mut link = match RemoteLink::new(
        router_tx.clone(),
        tenant_id.clone(),
        network,
        connect_packet,
        dynamic_filters,
        assigned_client_id,
        accepted.peer,
        &settings,
        asked_keep_alive,
    )
    .await
    {
        Ok(l) => l,
        // ferry: the router refused it (no room, or a client id it cannot
        // take): counted and logged before the client got its CONNACK.
        Err(remote::Error::Link(local::LinkError::Refused(_))) => return,
        Err(e) => {
            info!(event = "link_setup_failed", error = %e, "Remote link error");
            return;
        }
    };

    // ferry: the client is held to its own topics.
    link.set_isolation(isolation);
    let connection_id = link.connection_id;
    let will_delay_interval = link.will_delay_interval;
    let mut send_disconnect = true;

    // ferry: a device going away (closed, reset, timed out, taken over) is
    // an ordinary event: info, not error. A protocol violation is a warning.
    match link.start().await {
        // Connection got closed. This shouldn't usually happen.
        Ok(_) => warn!(event = "connection_stopped", "connection-stop"),
        // No need to send a disconnect message when disconnection
        // originated internally in the router.
        Err(remote::Error::Link(e)) => {
            info!(event = "connection_dropped_by_router", error=?e, "router-drop");
            send_disconnect = false;
        }
        Err(
            remote::Error::Network(network::Error::Io(_) | network::Error::KeepAlive(_))
            | remote::Error::Io(_),
        ) => {
            info!(event = "connection_closed", "disconnected");
        }
        // ferry: the gateway stopping, or unable to commit: the client
        // sends again what was not acknowledged (the gateway says why).
        Err(e @ (remote::Error::GatewayGone | remote::Error::NotAcknowledged)) => {
            info!(event = "connection_closed_unacknowledged", error = %e, "disconnected");
        }
        // ferry: said (within its budget) where it was found.
        Err(remote::Error::Stalled) => {}
        // Any other error
        Err(e) => {
            crate::counters::PROTOCOL_VIOLATIONS.fetch_add(1, Ordering::Relaxed);
            if refusals::admit(accepted.peer.ip()) {
                warn!(
                    event = "client_protocol_violation",
                    peer = %accepted.peer,
                    client_id = %Clip(&client_id),
                    error = %Clip(&e.to_string()),
                    "disconnected"
                );
            }
        }
    };

    // ferry: the router ignores this if the connection's slot holds a
    // newer connection by now (a reconnect under the same id took it over).
    let incarnation = link.incarnation();
    if send_disconnect {
        router_tx
            .send((connection_id, Event::Disconnect(incarnation)))
            .ok();
    }

    // this is important to stop the connection
    drop(link);

    // ferry: a will with a delay waits for it in the router (a will
    // without one was published as the router saw the connection go).
    if will_delay_interval > 0 {
        time::sleep(Duration::from_secs(will_delay_interval.into())).await;
        let message = Event::PublishWill {
            client_id,
            incarnation,
        };
        router_tx.send((connection_id, message)).ok();
    }
}

/// ferry: whether a CONNECT as `client_id` is allowed on a connection whose
/// client certificate says `identity`; if not, why.
fn cert_allows(identity: &CertIdentity, client_id: &str) -> Result<(), String> {
    match identity {
        CertIdentity::None => Ok(()),
        CertIdentity::ClientId(cn) if cn == client_id => Ok(()),
        CertIdentity::ClientId(cn) => Err(format!("the certificate's CN is {cn:?}")),
        CertIdentity::Invalid(why) => Err(why.clone()),
    }
}

#[cfg(test)]
mod tls_hint_tests {
    use super::tls_hint;

    #[test]
    fn a_tls_alert_is_said_in_words() {
        for (error, words) in [
            ("received fatal alert: UnknownCA", "does not trust"),
            ("received fatal alert: BadCertificate", "subjectAltName"),
            ("received fatal alert: CertificateExpired", "expired"),
            (
                "received corrupt message of type InvalidContentType",
                "does not speak TLS",
            ),
            ("something else", "see the error"),
        ] {
            assert!(tls_hint(error).contains(words), "{error}");
        }
    }
}
