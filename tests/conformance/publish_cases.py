"""Conformance cases on publishing and subscribing: Paho's
test_retained_messages, test_subscribe_failure, test_client_topic_alias,
test_flow_control1 and test_maximum_packet_size, isolation, reserved
properties and the QoS 2 flow, on the device's own topics (see
paho_cases.py)."""

import json

from probe import QUIET, PacketTypes, Probe, acks, alias, envelope, props


def case_retained(a):
    """test_retained_messages: a retained publish on the device's own topics
    is taken like any other (stored, answered) and kept for nobody: a new
    subscription gets no retained message."""
    boot = a.param["boot"]
    p = Probe(a.device, a.version)
    connack = p.start()
    p.sub(p.topic("ack"))
    for q in (0, 1, 2):
        p.publish(p.topic("up", "kept"), envelope(f"{boot}-r{q}"), qos=q, retain=True)
    p.publish(p.topic("status"), json.dumps({"online": True}), qos=1, retain=True)
    p.until(lambda: all(p.find(f"{boot}-r{q}", "stored") for q in (0, 1, 2)))
    p.bye()
    out = p.report()
    out["connack"] = connack
    # A fresh connection subscribing again: nothing retained comes.
    q = Probe(a.device, a.version)
    q.start()
    q.sub(q.topic("ack"), q.topic("inbox"))
    q.pump(QUIET)
    out["later_messages"] = q.messages
    q.bye()
    return out


def case_topic_alias(a):
    """test_client_topic_alias: an alias set with a topic and then used alone
    reaches the same topic; alias 0 or over the maximum is DISCONNECT 0x94;
    an alias never set (or set on an earlier connection) is 0x82."""
    boot = a.param["boot"]
    out = {}
    p = Probe(a.device, "5")
    out["connack"] = p.start(properties=props(PacketTypes.CONNECT, SessionExpiryInterval=60))
    p.sub(p.topic("ack"))
    p.publish(p.topic("up", "aliased"), envelope(f"{boot}-a1"), qos=1, properties=alias(1))
    p.publish("", envelope(f"{boot}-a2"), qos=1, properties=alias(1))
    p.publish(p.topic("up", "top"), envelope(f"{boot}-a3"), qos=1, properties=alias(32))
    p.publish("", envelope(f"{boot}-a4"), qos=1, properties=alias(32))
    ids = [f"{boot}-a{i}" for i in range(1, 5)]
    p.until(lambda: all(p.find(i, "stored") for i in ids))
    out["stored"] = [p.find(i, "stored") for i in ids]
    out["open"] = p.closed_at is None
    p.bye()
    # Aliases belong to the connection: not kept in the session.
    p = Probe(a.device, "5")
    out["resumed"] = p.start(clean_start=False, properties=props(PacketTypes.CONNECT, SessionExpiryInterval=60))
    p.publish("", envelope(f"{boot}-stale"), qos=1, properties=alias(1))
    p.until(lambda: p.closed_at is not None)
    out["stale"] = p.report()
    for name, n in (("zero", 0), ("over", 33)):
        p = Probe(a.device, "5")
        p.start()
        p.publish(p.topic("up", "t"), envelope(f"{boot}-{name}"), qos=1, properties=alias(n))
        p.until(lambda: p.closed_at is not None)
        out[name] = p.report()
    p = Probe(a.device, "5")
    p.start()
    p.publish("", envelope(f"{boot}-unset"), qos=1, properties=alias(7))
    p.until(lambda: p.closed_at is not None)
    out["unset"] = p.report()
    return out


def case_receive_maximum(a):
    """test_flow_control1: with a receive maximum of 2, at most 2 receipts are
    in flight to the device; acknowledging one lets the next come."""
    boot = a.param["boot"]
    p = Probe(a.device, "5")
    out = {"connack": p.start(properties=props(PacketTypes.CONNECT, ReceiveMaximum=2))}
    p.sub(p.topic("ack"))
    p.hold_acks = True
    ids = [f"{boot}-f{i}" for i in range(4)]
    for i in ids:
        p.publish(p.topic("up", "flow"), envelope(i), qos=1)
    p.until(lambda: len(p.messages) >= 2)
    p.pump(QUIET)
    out["before_ack"] = len(p.messages)
    p.ack(p.held_acks[0])
    p.until(lambda: len(p.messages) >= 3)
    p.pump(QUIET)
    out["after_one_ack"] = len(p.messages)
    p.hold_acks = False
    for mid in p.held_acks[1:]:
        p.ack(mid)
    p.until(lambda: len(p.messages) >= 4)
    out["after_all_acks"] = len(p.messages)
    out["stored"] = sorted(r["msg_id"] for r in p.receipts() if r.get("status") == "stored")
    p.bye()
    return out


def case_maximum_packet_size(a):
    """test_maximum_packet_size: the CONNACK says the largest packet taken
    (south.max_payload_bytes + 1024); an uplink over max_payload_bytes is
    answered `rejected`; a receipt over the device's own maximum packet size
    is not sent, and the connection goes on."""
    boot = a.param["boot"]
    limit = int(a.param["max_payload"])
    out = {}
    p = Probe(a.device, "5")
    out["connack"] = p.start()
    p.sub(p.topic("ack"))
    big = "x" * (limit + 10)
    p.publish(p.topic("up", "big"), envelope(f"{boot}-big", pad=big), qos=1)
    out["big"] = p.receipt_for(f"{boot}-big", "rejected") or p.receipts()
    out["big_open"] = p.closed_at is None
    # Over the maximum packet size the CONNACK gave.
    huge = "x" * (limit + 2048)
    p.publish(p.topic("up", "big"), envelope(f"{boot}-huge", pad=huge), qos=1)
    p.until(lambda: p.find(f"{boot}-huge") or p.closed_at is not None)
    p.pump(0.2)
    out["huge"] = p.find(f"{boot}-huge")
    out["huge_report"] = p.report()
    p.bye()
    # Receipts the device can read, and one it can't.
    p = Probe(a.device, "5")
    own_max = int(a.param["client_max"])
    out["small_connack"] = p.start(properties=props(PacketTypes.CONNECT, MaximumPacketSize=own_max))
    p.sub(p.topic("ack"))
    long_id = f"{boot}-" + "L" * 100
    p.publish(p.topic("up", "s"), envelope(f"{boot}-s1"), qos=1)
    out["short_1"] = p.receipt_for(f"{boot}-s1")
    p.publish(p.topic("up", "s"), envelope(long_id), qos=1)
    p.publish(p.topic("up", "s"), envelope(f"{boot}-s2"), qos=1)
    out["short_2"] = p.receipt_for(f"{boot}-s2")
    p.pump(0.2)
    out["long_receipt"] = p.find(long_id)
    out["acks"] = acks(p, "PUBACK")
    out["open"] = p.closed_at is None
    out["long_id"] = long_id
    p.bye()
    return out


def case_too_large(a):
    """An uplink over south.max_payload_bytes is answered `rejected` and the
    connection goes on (every level)."""
    boot = a.param["boot"]
    limit = int(a.param["max_payload"])
    p = Probe(a.device, a.version)
    out = {"connack": p.start()}
    p.sub(p.topic("ack"))
    p.publish(p.topic("up", "big"), envelope(f"{boot}-big", pad="x" * (limit + 10)), qos=1)
    out["big"] = p.receipt_for(f"{boot}-big", "rejected")
    p.publish(p.topic("up", "small"), envelope(f"{boot}-small"), qos=1)
    out["small"] = p.receipt_for(f"{boot}-small")
    out["open"] = p.closed_at is None
    p.bye()
    return out


def case_subscribe(a):
    """test_subscribe_failure: another device's topics, wildcards and anything
    past south.max_subscriptions are refused (v5 0x87 / 0x97, 3.1.1 0x80); a
    QoS 2 subscription to the own ack is granted QoS 1."""
    other = a.param["other"]
    p = Probe(a.device, a.version)
    out = {"connack": p.start()}
    out["own_ack_qos2"] = p.sub(p.topic("ack"), qos=2)
    out["foreign"] = p.sub(f"devices/{other}/ack", f"devices/{other}/inbox", qos=1)
    out["wildcards"] = p.sub("devices/+/ack", "devices/#", "#", p.topic("+"), qos=1)
    out["inbox"] = p.sub(p.topic("inbox"), qos=1)
    out["ack_again"] = p.sub(p.topic("ack"), qos=1)
    out["both_again"] = p.sub(p.topic("ack"), p.topic("inbox"), qos=1)
    out["open"] = p.closed_at is None
    p.bye()
    return out


def case_foreign_publish(a):
    """A publish on another device's topic: PUBACK 0x87 (v5), and a
    `rejected` receipt, reason unauthorized, on the device's own ack."""
    boot = a.param["boot"]
    other = a.param["other"]
    p = Probe(a.device, a.version)
    out = {"connack": p.start()}
    p.sub(p.topic("ack"))
    p.publish(f"devices/{other}/up/t", envelope(f"{boot}-forged"), qos=1)
    p.publish(f"devices/{other}/up/t", envelope(f"{boot}-forged2"), qos=2)
    p.until(lambda: p.find(f"{boot}-forged", "rejected") and p.find(f"{boot}-forged2", "rejected"))
    p.pump(0.1)
    out.update(p.report())
    p.bye()
    return out


def case_reserved_properties(a):
    """User properties named ferry-... are the broker's own marks: a device's
    are stripped, so claiming to be an oversized publish from another device
    changes nothing."""
    boot = a.param["boot"]
    p = Probe(a.device, "5")
    p.start()
    p.sub(p.topic("ack"))
    pp = props(PacketTypes.PUBLISH)
    pp.UserProperty = ("ferry-oversize", "99999999")
    pp.UserProperty = ("ferry-publisher", a.param["other"])
    pp.UserProperty = ("ferry-topic", f"devices/{a.param['other']}/up/t")
    p.publish(p.topic("up", "marks"), envelope(f"{boot}-marked"), qos=1, properties=pp)
    out = {"receipt": p.receipt_for(f"{boot}-marked") or p.receipts()}
    p.bye()
    return out


def case_qos2(a):
    """QoS 2 from a device: PUBREC at once, the PUBLISH sent again with DUP
    before its PUBREL is taken again and stored once, PUBREL answered
    PUBCOMP, a PUBREL for a packet id the broker does not know too."""
    boot = a.param["boot"]
    msg_id = f"{boot}-two"
    p = Probe(a.device, a.version)
    out = {"connack": p.start()}
    p.sub(p.topic("ack"))
    p.hold_pubrel = True
    topic = p.topic("up", "q2")
    body = envelope(msg_id)
    info = p.publish(topic, body, qos=2)
    p.until(lambda: acks(p, "PUBREC"))
    p.publish_again(info.mid, topic, body, 2)
    p.until(lambda: len(acks(p, "PUBREC")) >= 2)
    p.pubrel(info.mid)
    p.until(lambda: acks(p, "PUBCOMP"))
    p.pubrel(4321)
    p.until(lambda: len(acks(p, "PUBCOMP")) >= 2)
    p.until(lambda: len([r for r in p.receipts() if r.get("msg_id") == msg_id]) >= 2)
    p.pump(0.2)
    out.update(p.report())
    out["mid"] = info.mid
    out["msg_id"] = msg_id
    p.bye()
    return out
