//! What intake is given and what it makes of a publish: its
//! configuration ([`IntakeConfig`]), its [`Verdict`] on one publish, and
//! the size of the north packet a message will take, shared by intake and
//! plain devices.

use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};

use super::answer::AnswerFuture;
use super::limits::Sender;
use crate::config::RateLimit;
use crate::protocol::envelope::{RejectCode, Rejection};
use crate::protocol::plain::PlainIds;
use crate::protocol::publish_packet_len;
use crate::protocol::sparkplug::edge::EdgeNodes;
use crate::protocol::topics::Topics;
use crate::south::DeviceControl;
use crate::status_file::LiveSender;
use crate::store::record::uplink::Intake;

pub struct IntakeConfig {
    pub gateway: Arc<str>,
    pub max_payload_bytes: usize,
    /// `north.max_packet_bytes`: a message whose north packet would be
    /// larger can never be published, so it is refused at the door.
    pub max_north_packet: usize,
    /// Where device control messages (confirm, pull, ...) go.
    pub controls: mpsc::Sender<DeviceControl>,
    /// `south.rate_per_s` and `south.burst`, per device.
    pub rate: RateLimit,
    /// `south.max_inflight_per_device`.
    pub max_inflight_per_device: usize,
    /// Both of these again when they change while running (`None`: they
    /// do not).
    pub limits_changed: Option<watch::Receiver<(RateLimit, usize)>>,
    /// External mode: devices' statuses also go to the status file (the
    /// only word of their presence there).
    pub presence: Option<LiveSender>,
    /// Told of every device that sends something, once a second at most
    /// (its last seen time).
    pub seen: LiveSender,
    /// External mode: plain devices are not held to the per-device limits
    /// (the site broker bounds them; a publish ferry does not acknowledge
    /// there would hold every later one).
    pub external: bool,
    /// This run's part of plain uplinks' msg_ids.
    pub plain: PlainIds,
    /// Sparkplug B edge nodes (`[south.sparkplug]`), when they are on.
    pub sparkplug: Option<SparkplugIntake>,
}

/// What intake keeps for Sparkplug B edge nodes.
pub struct SparkplugIntake {
    /// Whether a Sparkplug uplink stored now goes north at once: the north
    /// link is up and the primary host, if one is followed, online. Not:
    /// it is stored marked historical.
    pub live: watch::Receiver<bool>,
    /// Each edge node's sequence check (intake is one task: never
    /// contended).
    pub nodes: Mutex<EdgeNodes>,
}

impl IntakeConfig {
    /// Intake as `cfg` has it, handing controls to `controls`; in external
    /// mode devices' statuses also go to `status_file`. `live`: north's
    /// word on whether a Sparkplug uplink goes north at once.
    pub fn of(
        cfg: &crate::config::Config,
        controls: mpsc::Sender<DeviceControl>,
        status_file: LiveSender,
        live: watch::Receiver<bool>,
    ) -> IntakeConfig {
        let external = matches!(cfg.south.mode, crate::config::SouthMode::External(_));
        IntakeConfig {
            gateway: Arc::from(cfg.gateway.as_str()),
            max_payload_bytes: cfg.south.max_payload_bytes,
            max_north_packet: cfg.north.max_packet_bytes,
            controls,
            rate: cfg.south.rate,
            max_inflight_per_device: cfg.south.max_inflight_per_device,
            limits_changed: None,
            presence: external.then(|| status_file.clone()),
            seen: status_file,
            external,
            plain: PlainIds::new(),
            sparkplug: cfg.sparkplug.as_ref().map(|_| SparkplugIntake {
                live,
                nodes: Mutex::default(),
            }),
        }
    }
}

/// What intake does with one device publish.
pub(super) enum Verdict {
    /// Answer it once `answer` resolves, in arrival order. `in_flight`:
    /// whom it counts against in flight until then.
    Answer {
        answer: AnswerFuture,
        in_flight: Option<Sender>,
    },
    /// Handed on (a control), held, dropped or ignored: nothing to answer.
    Done,
    /// A plain publish over a limit: its acknowledgement is withheld
    /// (`super::plain::withhold`).
    Withheld,
}

/// Why `intake` can never go north, if its north PUBLISH would be larger
/// than `north.max_packet_bytes`: refused at the door instead.
pub(super) fn too_large_north(
    cfg: &IntakeConfig,
    topics: &Topics,
    intake: &Intake,
) -> Option<Rejection> {
    let packet = north_packet_len(topics, intake);
    (packet > cfg.max_north_packet).then(|| Rejection {
        code: RejectCode::TooLarge,
        detail: format!(
            "its north packet would be {packet} bytes > north.max_packet_bytes {}",
            cfg.max_north_packet
        ),
        msg_id: Some(intake.msg_id.clone()),
    })
}

/// The largest the message's north PUBLISH can be once its seq is spliced in.
fn north_packet_len(topics: &Topics, intake: &Intake) -> usize {
    /// `"seq":` plus a u64 and a comma, in place of nothing.
    const SEQ_FIELD: usize = 7 + 20;
    let topic_len = topics.north_up_len(&intake.device, &intake.stream);
    publish_packet_len(topic_len, intake.body.len() + SEQ_FIELD)
}
