//! Sparkplug B edge nodes at the door (docs/PROTOCOL.md, "Sparkplug B
//! edge nodes"): a publish on an edge node's `spBv1.0/...` topic is a
//! plain uplink of that edge node ([`super::plain`]: ferry's msg_id, the
//! PUBACK after the commit, withheld over a limit, waiting at the disk
//! budget), on stream `spb`, with what its protobuf says beside it.
//!
//! - Its `seq` and `bdSeq` are checked per edge node, in the order the
//!   publishes arrive ([`crate::protocol::sparkplug::edge::EdgeNodes`]): a gap or
//!   a missing `bdSeq` is logged and counted, never fixed; the message is
//!   stored as it came all the same. So is one whose payload is not
//!   Sparkplug B at all.
//! - One stored while it cannot go north at once (the north link down, or
//!   the primary host not online: [`super::judged::SparkplugIntake::live`])
//!   is stored historical: `"historical": true` in its body and its
//!   payload re-encoded with `is_historical` set on each metric.

use std::borrow::Cow;

use tokio::time::Instant;
use tracing::warn;

use super::answer::{reject, AnswerFuture};
use super::limits::Lines;
use super::plain::{oversized, stored, Store};
use crate::clip::Clip;
use crate::ids::DeviceId;
use crate::metrics::{self, Count};
use crate::protocol::sparkplug::edge::{sparkplug_envelope, SparkplugBody, STREAM};
use crate::protocol::sparkplug::{mark_historical, summarise, Topic, Verdict};
use crate::south::SouthMessage;

/// Counts an edge node's publish as it comes.
pub(super) fn count() {
    metrics::count(Count::SparkplugFromDevices);
}

/// Checks and stores a publish of edge node `device`, answered once it is
/// committed.
pub(super) fn judge(
    to: Store<'_>,
    lines: &mut Lines,
    device: DeviceId,
    msg: &SouthMessage,
) -> AnswerFuture {
    let msg_id = to.cfg.plain.of(msg.number);
    if let Some(rejection) = oversized(to.cfg, &msg_id, msg) {
        return reject(to.store, Some(device), rejection, msg);
    }
    let (Some(topics), Some(intake)) = (to.topics.sparkplug(), to.cfg.sparkplug.as_ref()) else {
        // Routed here only when Sparkplug is on, so never; a plain uplink.
        return super::plain::judge(to, device, msg);
    };
    let Some((_, parsed)) = topics.edge_node(&msg.topic) else {
        return super::plain::judge(to, device, msg);
    };
    let admit = |lines: &mut Lines| lines.admit(&Some(device.clone()), Instant::now());
    let summary = match summarise(&msg.payload) {
        Ok(summary) => Some(summary),
        Err(e) => {
            let total = metrics::count(Count::SparkplugUndecodable);
            if admit(lines) {
                warn!(event = "sparkplug_payload_undecodable", edge_node = %device, topic = %Clip(&msg.topic), error = %Clip(&e.to_string()), total, "Sparkplug B publish whose payload is not Sparkplug B protobuf: stored as it came");
            }
            None
        }
    };
    let verdict = match intake.nodes.lock() {
        Ok(mut nodes) => nodes.check(&parsed, msg.number, summary.as_ref()),
        Err(poisoned) => poisoned
            .into_inner()
            .check(&parsed, msg.number, summary.as_ref()),
    };
    if let Some((verdict, count)) = verdict.and_then(|v| Some((v, counter(v)?))) {
        let total = metrics::count(count);
        if admit(lines) {
            report(&device, &parsed, verdict, total);
        }
    }
    let historical = !*intake.live.borrow();
    let mut payload = Cow::Borrowed(&msg.payload[..]);
    if historical {
        metrics::count(Count::SparkplugHistorical);
        if summary.is_some() {
            if let Ok(marked) = mark_historical(&msg.payload) {
                payload = Cow::Owned(marked);
            }
        }
    }
    let envelope = sparkplug_envelope(SparkplugBody {
        msg_id,
        topic: &msg.topic,
        parsed,
        payload: &payload,
        summary,
        qos: msg.qos,
        retain: msg.retain,
        historical,
    });
    stored(to, device, STREAM, envelope, msg)
}

/// The counter a problem a sequence check saw is counted in (None: no
/// problem).
fn counter(verdict: Verdict) -> Option<Count> {
    Some(match verdict {
        Verdict::Gap { .. } => Count::SparkplugSeqGaps,
        Verdict::MissingBdSeq => Count::SparkplugBdSeqMissing,
        Verdict::NoBirth | Verdict::BdSeqMismatch { .. } | Verdict::MissingSeq => {
            Count::SparkplugOutOfSession
        }
        Verdict::InOrder => return None,
    })
}

/// Logs what a sequence check saw: the message is stored as it came.
fn report(device: &DeviceId, topic: &Topic<'_>, verdict: Verdict, total: u64) {
    let (group, message_type) = (Clip(topic.group), topic.kind.as_str());
    match verdict {
        Verdict::Gap { expected, got } => {
            warn!(event = "sparkplug_seq_gap", edge_node = %device, %group, message_type, expected, got, total, "Sparkplug B seq gap: stored as it came, checking goes on from the seq it carried")
        }
        Verdict::MissingBdSeq => {
            warn!(event = "sparkplug_bdseq_missing", edge_node = %device, %group, message_type, total, "Sparkplug B NBIRTH or NDEATH without a bdSeq metric (or an NDEATH after such an NBIRTH): the two cannot be matched")
        }
        Verdict::NoBirth => {
            warn!(event = "sparkplug_out_of_session", edge_node = %device, %group, message_type, problem = "no_birth", total, "Sparkplug B message before its edge node's NBIRTH or after its NDEATH: stored as it came")
        }
        Verdict::BdSeqMismatch { birth, death } => {
            warn!(event = "sparkplug_out_of_session", edge_node = %device, %group, message_type, problem = "bd_seq_mismatch", birth, death, total, "Sparkplug B NDEATH of another session (its bdSeq is not the NBIRTH's): the current session goes on")
        }
        Verdict::MissingSeq => {
            warn!(event = "sparkplug_out_of_session", edge_node = %device, %group, message_type, problem = "seq_missing", total, "Sparkplug B message without the seq it must carry: stored as it came")
        }
        Verdict::InOrder => {}
    }
}
