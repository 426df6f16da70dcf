"""Conformance cases on connections and sessions: Paho's test_basic,
test_keepalive, test_server_keep_alive, test_will_message, test_will_delay,
test_redelivery_on_reconnect, test_offline_message_queueing and
test_session_expiry, on the device's own topics (see paho_cases.py)."""

import json
import sys
import time

from probe import QUIET, WAIT, PacketTypes, Probe, envelope, props, raw_connect, raw_exchange


def case_basic(a):
    """test_basic: connect, disconnect, connect again (with the keep-alive
    asked for), subscribe to the own ack at QoS 2, publish at QoS 0, 1 and
    2; a receipt for each."""
    first = Probe(a.device, a.version)
    first.start()
    first.bye()
    p = Probe(a.device, a.version)
    p.start(keepalive=int(a.param.get("keepalive", "60")))
    p.sub(p.topic("ack"), qos=2)
    ids = [f"{a.param['boot']}-q{q}" for q in range(3)]
    for q, msg_id in enumerate(ids):
        p.publish(p.topic("up", "basic"), envelope(msg_id, qos=q), qos=q)
    p.until(lambda: all(p.find(i, "stored") for i in ids))
    p.pump(0.2)
    p.bye()
    out = p.report()
    out["first_connack"] = first.connacks
    out["ids"] = ids
    return out


def case_keepalive(a):
    """test_keepalive: a device that goes silent is closed by its keep-alive
    and its will (on its own up topic) is published; keep-alive 0 is held to
    south.max_keep_alive_s."""
    ka = int(a.param.get("keepalive", "1"))
    p = Probe(a.device, a.version)
    will_id = a.param["will"]
    p.will_set(p.topic("up", "will"), envelope(will_id, will=True), qos=1)
    connack = p.start(keepalive=ka)
    closed_after = p.silent_until_closed(float(a.param.get("within", "10")))
    out = p.report()
    out["connack"] = connack
    out["closed_after_s"] = closed_after
    return out


def case_pinging(a):
    """A device that pings stays connected past its keep-alive."""
    p = Probe(a.device, a.version)
    p.start(keepalive=1)
    p.pump(float(a.param.get("for", "2.5")))
    out = p.report()
    out["still_connected"] = p.closed_at is None
    p.bye()
    return out


def case_server_keep_alive(a):
    """test_server_keep_alive: the CONNACK says the keep-alive it was held to,
    for a keep-alive over south.max_keep_alive_s and for 0, and says nothing
    for one within it."""
    out = {}
    for ka in [int(k) for k in a.param["asks"].split(",")]:
        p = Probe(a.device, "5")
        out[str(ka)] = p.start(keepalive=ka)
        p.bye()
    return out


def case_connack_properties(a):
    """The v5 CONNACK says what the connection is held to."""
    p = Probe(a.device, "5")
    out = {"connack": p.start()}
    p.bye()
    return out


def case_refused_connect(a):
    """CONNACK codes: a bad password, and a client id that is no device id."""
    out = {}
    p = Probe(a.device, a.version, password="not-the-password")
    out["bad_password"] = p.start()
    out["bad_password_closed"] = p.until(lambda: p.closed_at is not None, WAIT)
    p = Probe(a.device, a.version, password=a.param.get("password"), client_id=a.param["bad_id"])
    out["bad_id"] = p.start()
    out["bad_id_closed"] = p.until(lambda: p.closed_at is not None, WAIT)
    if a.param.get("password"):
        p = Probe(a.device, a.version, password=a.param["password"])
        out["good"] = p.start()
        p.bye()
    return out


def case_protocol_levels(a):
    """test_basic's wrong protocol: a level ferry does not speak gets CONNACK
    1 and is closed; 3 (MQIsdp) and 4 are taken on a bare socket too."""
    return {
        "level6": raw_exchange(raw_connect(b"MQTT", 6, a.device)),
        "level3": raw_exchange(raw_connect(b"MQIsdp", 3, a.device), timeout=QUIET),
        "level4": raw_exchange(raw_connect(b"MQTT", 4, a.device), timeout=QUIET),
        "level5": raw_exchange(raw_connect(b"MQTT", 5, a.device), timeout=QUIET),
        "bad_name": raw_exchange(raw_connect(b"hj", 4, a.device)),
    }


def case_will(a):
    """test_will_message: a will on the device's own topics is published when
    its socket drops, not when it says DISCONNECT; one on another device's
    topic refuses the CONNECT."""
    boot = a.param["boot"]
    out = {}
    # DISCONNECT first: its will must never come, the later one must.
    p = Probe(a.device, a.version)
    p.will_set(p.topic("up", "will"), envelope(f"{boot}-bye"), qos=1)
    out["disconnect_connack"] = p.start()
    p.bye()
    p = Probe(a.device, a.version)
    p.will_set(p.topic("up", "will"), envelope(f"{boot}-drop"), qos=1)
    out["drop_connack"] = p.start()
    p.drop()
    # A will on its own status, as PROTOCOL.md asks devices to set.
    p = Probe(a.device, a.version)
    p.will_set(p.topic("status"), json.dumps({"online": False}), qos=1)
    out["status_connack"] = p.start()
    p.publish(p.topic("status"), json.dumps({"online": True}), qos=1)
    p.pump(0.1)
    p.drop()
    # On another device's topic: refused at CONNECT.
    p = Probe(a.device, a.version)
    p.will_set(f"devices/{a.param['other']}/up/will", envelope(f"{boot}-forged"), qos=1)
    out["foreign_connack"] = p.start()
    out["foreign_closed"] = p.until(lambda: p.closed_at is not None, WAIT)
    # The dropped connection's will was stored as this device: a resend of
    # its envelope is answered with its receipt.
    p = Probe(a.device, a.version)
    p.start()
    p.sub(p.topic("ack"))
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        p.publish(p.topic("up", "will"), envelope(f"{boot}-drop"), qos=1)
        if p.receipt_for(f"{boot}-drop", "stored", 0.5):
            break
    out["drop_receipt"] = p.find(f"{boot}-drop", "stored")
    p.bye()
    return out


def case_will_delay(a):
    """test_will_delay (MQTT 5): a will delay longer than the session expiry
    is cut to it; a session expiry of 0 publishes the will at once."""
    p = Probe(a.device, "5")
    p.will_set(
        p.topic("up", "will"),
        envelope(a.param["will"]),
        qos=1,
        properties=props(PacketTypes.WILLMESSAGE, WillDelayInterval=int(a.param["delay"])),
    )
    expiry = int(a.param["expiry"])
    out = {"connack": p.start(properties=props(PacketTypes.CONNECT, SessionExpiryInterval=expiry))}
    p.drop()
    out["dropped_at"] = time.time()
    return out


def session_start(p, expiry, clean_start=False):
    if p.v5:
        return p.start(clean_start=clean_start, properties=props(PacketTypes.CONNECT, SessionExpiryInterval=expiry))
    return p.start()


def sync(label):
    """Tells the Rust test it reached `label` and waits for its go-ahead."""
    print(json.dumps({"sync": label}), flush=True)
    sys.stdin.readline()


def case_redelivery(a):
    """test_redelivery_on_reconnect and test_offline_message_queueing: a QoS 1
    receipt the device had not acknowledged when its socket dropped comes
    again (DUP) after it reconnects with its session, and so does a downlink
    stored while it was away, both on the subscriptions it kept (it does not
    subscribe again); a clean session (clean start) ends it all."""
    boot = a.param["boot"]
    out = {}
    p = Probe(a.device, a.version, clean=False)
    out["first"] = session_start(p, 60, clean_start=True)
    out["first_suback"] = p.sub(p.topic("ack"), p.topic("inbox"))
    p.hold_acks = True
    p.publish(p.topic("up", "s"), envelope(f"{boot}-1"), qos=1)
    out["unacked"] = p.receipt_for(f"{boot}-1")
    p.drop()
    # The backend sends a downlink while the device is away.
    sync("away")
    p = Probe(a.device, a.version, clean=False)
    out["resumed"] = session_start(p, 60)
    inbox = p.topic("inbox")
    p.until(lambda: p.find(f"{boot}-1") and any(m["topic"] == inbox for m in p.messages))
    out["redelivered"] = list(p.messages)
    p.publish(p.topic("up", "s"), envelope(f"{boot}-2"), qos=1)
    out["kept_subscription"] = p.receipt_for(f"{boot}-2")
    p.bye()
    # A clean session (clean start) ends the session.
    p = Probe(a.device, a.version, clean=True)
    out["clean"] = session_start(p, 0, clean_start=True)
    p.bye()
    p = Probe(a.device, a.version, clean=False)
    out["after_clean"] = session_start(p, 60)
    p.publish(p.topic("up", "s"), envelope(f"{boot}-3"), qos=1)
    p.pump(QUIET)
    out["after_clean_messages"] = p.messages
    p.bye()
    return out


def case_session_expiry(a):
    """test_session_expiry (MQTT 5): expiry 0 ends the session at DISCONNECT;
    one of 1 s keeps it for a second; one over south.max_session_expiry_s is
    granted the cap; a DISCONNECT with expiry 0 ends it."""
    out = {}
    cap = int(a.param["cap"])

    def connect(expiry, clean_start):
        p = Probe(a.device, "5")
        return p, p.start(clean_start=clean_start, properties=props(PacketTypes.CONNECT, SessionExpiryInterval=expiry))

    p, out["zero_first"] = connect(0, True)
    p.sub(p.topic("ack"))
    p.bye()
    p, out["zero_again"] = connect(0, False)
    p.bye()

    p, out["one_first"] = connect(1, True)
    p.sub(p.topic("ack"))
    p.bye()
    p, out["one_at_once"] = connect(1, False)
    p.bye()
    time.sleep(1.6)
    p, out["one_later"] = connect(1, False)
    p.bye()

    p, out["over_cap"] = connect(cap * 100, True)
    p.sub(p.topic("ack"))
    p.bye(properties=props(PacketTypes.DISCONNECT, SessionExpiryInterval=0))
    p, out["after_disconnect_zero"] = connect(cap * 100, False)
    p.bye()
    return out


def case_websocket(a):
    """MQTT over WebSocket (over TLS with the `ca` param) on the listener's
    path: at every level, publishes at QoS 0, 1 and 2 are stored and
    answered over the WebSocket; a handshake for another path is refused
    before any MQTT."""
    boot = a.param["boot"]
    ca = a.param.get("ca")  # set: wss, the gateway's certificate checked
    p = Probe(a.device, a.version, ws_path=a.param["path"], ca=ca)
    connack = p.start()
    p.sub(p.topic("ack"))
    for q in (0, 1, 2):
        p.publish(p.topic("up", "t"), envelope(f"{boot}-w{q}"), qos=q)
    p.until(lambda: all(p.find(f"{boot}-w{q}", "stored") for q in (0, 1, 2)))
    p.bye()
    out = p.report()
    out["connack"] = connack
    wrong = Probe(a.device, a.version, ws_path=a.param["path"] + "-not", ca=ca)
    try:
        out["wrong_path_connack"] = wrong.start()
        out["wrong_path_refused"] = None
    except Exception as e:  # paho raises on a handshake that is not a 101
        out["wrong_path_connack"] = None
        out["wrong_path_refused"] = f"{type(e).__name__}: {e}"
    return out
