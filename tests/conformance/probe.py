"""The harness of the conformance cases: a device's connection as a paho
client that records what it gets.

paho-mqtt 1.6.1 hides some of the wire (v5 PUBACK reason codes, DUP on a
resend it makes itself, holding a PUBACK back), so `Probe` subclasses its
Client: it records every incoming packet in `_packet_handle`, can hold back
its PUBACKs and PUBRELs, and sends a PUBLISH again with DUP through the
client's own `_send_publish`. It runs paho's loop itself (`until`), so a
case is one thread and every wait is bounded. Packets paho cannot send at
all (a protocol level of 6, a topic alias of 0) are written by hand.
"""


import json
import socket
import struct
import sys
import time

try:
    import paho.mqtt.client as mqtt
    from paho.mqtt.properties import Properties
    from paho.mqtt.packettypes import PacketTypes
except ImportError as e:  # pragma: no cover - the Rust side checks first
    print(
        f"paho-mqtt is missing for {sys.executable} ({e}): install Debian's "
        "python3-paho-mqtt (`apt-get install -y python3-paho-mqtt`, or run "
        "./scripts/test.sh, which does)",
        file=sys.stderr,
    )
    sys.exit(3)

HOST = "127.0.0.1"
# The gateway's south port, set by paho_cases.py.
PORT = 0
# How long a case waits for something that comes within milliseconds when it
# comes at all (a receipt, a CONNACK), and how long it waits to show that
# something does not come.
WAIT = 5.0
QUIET = 0.6

NAMES = {
    0x10: "CONNECT", 0x20: "CONNACK", 0x30: "PUBLISH", 0x40: "PUBACK",
    0x50: "PUBREC", 0x60: "PUBREL", 0x70: "PUBCOMP", 0x90: "SUBACK",
    0xB0: "UNSUBACK", 0xD0: "PINGRESP", 0xE0: "DISCONNECT",
}
VERSIONS = {"31": mqtt.MQTTv31, "311": mqtt.MQTTv311, "5": mqtt.MQTTv5}


def envelope(msg_id, **payload):
    return json.dumps({"msg_id": msg_id, "payload": payload or {"t": 1}})


class RawProperties:
    """Properties paho refuses to build (a topic alias of 0), as their bytes."""

    def __init__(self, raw):
        self.raw = raw

    def pack(self):
        return bytes([len(self.raw)]) + self.raw

    def __str__(self):
        return self.raw.hex()


def alias(n):
    """A PUBLISH's Topic Alias property (0x23), any value."""
    return RawProperties(b"\x23" + struct.pack("!H", n))


def props(kind, **values):
    p = Properties(kind)
    for name, value in values.items():
        setattr(p, name, value)
    return p


class Probe(mqtt.Client):
    """One connection of a device: a paho client that records what it gets."""

    def __init__(self, device, version, clean=True, password=None, client_id=None, ws_path=None, ca=None):
        self.device = device
        self.version = version
        self.v5 = version == "5"
        kw = {} if self.v5 else {"clean_session": clean}
        # MQTT over WebSocket on `ws_path` (paho asks for the "mqtt"
        # subprotocol), else over TCP.
        kw["transport"] = "tcp" if ws_path is None else "websockets"
        super().__init__(client_id=client_id or device, protocol=VERSIONS[version], **kw)
        if ws_path is not None:
            self.ws_set_options(path=ws_path)
        # Over TLS, verifying the gateway's certificate against `ca`.
        if ca is not None:
            self.tls_set(ca_certs=ca)
        if password is not None:
            self.username_pw_set(device, password)
        self.clean = clean
        self.packets = []
        self.connacks = []
        self.subacks = []
        self.messages = []
        self.closed_at = None
        self.disconnect_reason = None
        self.hold_acks = False
        self.held_acks = []
        self.hold_pubrel = False
        self.started = time.monotonic()
        self.on_connect = self._rec_connect
        self.on_subscribe = self._rec_subscribe
        self.on_message = self._rec_message
        self.on_disconnect = self._rec_disconnect

    # -- what it records

    def _packet_handle(self):
        cmd = self._in_packet["command"] & 0xF0
        body = bytes(self._in_packet["packet"])
        entry = {"type": NAMES.get(cmd, hex(cmd))}
        if cmd in (0x40, 0x50, 0x60, 0x70) and len(body) >= 2:
            entry["mid"] = struct.unpack("!H", body[:2])[0]
            entry["reason"] = body[2] if len(body) > 2 else 0
        elif cmd == 0xE0:
            entry["reason"] = body[0] if body else 0
        elif cmd == 0x30:
            entry["dup"] = bool(self._in_packet["command"] & 0x08)
        self.packets.append(entry)
        return super()._packet_handle()

    def _rec_connect(self, client, userdata, flags, rc, properties=None):
        code = rc.value if hasattr(rc, "value") else rc
        entry = {"code": code, "session_present": bool(flags.get("session present"))}
        if properties is not None:
            entry["props"] = properties.json()
        self.connacks.append(entry)

    def _rec_subscribe(self, client, userdata, mid, granted, properties=None):
        self.subacks.append([g.value if hasattr(g, "value") else g for g in granted])

    def _rec_message(self, client, userdata, msg):
        try:
            body = json.loads(msg.payload)
        except ValueError:
            body = msg.payload.decode("utf-8", "replace")
        self.messages.append(
            {"topic": msg.topic, "qos": msg.qos, "dup": bool(msg.dup), "mid": msg.mid, "body": body}
        )

    def _rec_disconnect(self, client, userdata, rc, properties=None):
        if self.closed_at is None:
            self.closed_at = time.monotonic()
            self.disconnect_reason = rc.value if hasattr(rc, "value") else rc

    # -- what it holds back

    def _send_puback(self, mid):
        if self.hold_acks:
            self.held_acks.append(mid)
            return mqtt.MQTT_ERR_SUCCESS
        return super()._send_puback(mid)

    def ack(self, mid):
        """Sends a PUBACK held back by `hold_acks`."""
        return mqtt.Client._send_puback(self, mid)

    def _send_pubrel(self, mid):
        if self.hold_pubrel:
            return mqtt.MQTT_ERR_SUCCESS
        return super()._send_pubrel(mid)

    def pubrel(self, mid):
        return mqtt.Client._send_pubrel(self, mid)

    def publish_again(self, mid, topic, payload, qos):
        """The same PUBLISH (same packet id) again, with DUP set."""
        return self._send_publish(mid, topic.encode(), payload.encode(), qos, False, True)

    # -- the loop

    def pump(self, secs):
        self.until(lambda: False, secs)

    def until(self, pred, timeout=WAIT):
        deadline = time.monotonic() + timeout
        while not pred():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self.closed_at is None:
                rc = self.loop(timeout=min(0.05, left))
                if rc not in (mqtt.MQTT_ERR_SUCCESS,) and self.closed_at is None:
                    self.closed_at = time.monotonic()
                    self.disconnect_reason = rc
            else:
                time.sleep(min(0.05, left))
        return True

    def start(self, keepalive=60, clean_start=None, properties=None):
        """CONNECT and wait for the CONNACK (or the close); the CONNACK seen."""
        if self.v5:
            start = mqtt.MQTT_CLEAN_START_FIRST_ONLY if clean_start is None else clean_start
            self.connect(HOST, PORT, keepalive, clean_start=start, properties=properties)
        else:
            self.connect(HOST, PORT, keepalive)
        self.until(lambda: self.connacks or self.closed_at is not None)
        return self.connacks[-1] if self.connacks else None

    def sub(self, *filters, qos=1):
        before = len(self.subacks)
        if self.v5:
            opts = mqtt.SubscribeOptions(qos=qos)
            self.subscribe([(f, opts) for f in filters])
        else:
            self.subscribe([(f, qos) for f in filters])
        self.until(lambda: len(self.subacks) > before or self.closed_at is not None)
        return self.subacks[before] if len(self.subacks) > before else None

    def topic(self, *rest):
        return "/".join(["devices", self.device, *rest])

    def receipts(self):
        return [m["body"] for m in self.messages if m["topic"] == self.topic("ack")]

    def receipt_for(self, msg_id, status="stored", timeout=WAIT):
        self.until(lambda: self.find(msg_id, status) is not None or self.closed_at is not None, timeout)
        return self.find(msg_id, status)

    def find(self, msg_id, status=None):
        for r in self.receipts():
            if isinstance(r, dict) and r.get("msg_id") == msg_id and status in (None, r.get("status")):
                return r
        return None

    def drop(self):
        """Gone without DISCONNECT: the socket closed under the client."""
        sock = self.socket()
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
        self._sock_close()
        self.closed_at = time.monotonic()

    def silent_until_closed(self, timeout):
        """Sends nothing (no PINGREQ) and reads the socket until the broker
        closes it; seconds until then, or None."""
        sock = self.socket()
        sock.settimeout(0.1)
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            try:
                if sock.recv(4096) == b"":
                    return round(time.monotonic() - start, 2)
            except socket.timeout:
                continue
            except OSError:
                return round(time.monotonic() - start, 2)
        return None

    def bye(self, **kw):
        if self.closed_at is None:
            self.disconnect(**kw)
            self.pump(0.05)

    def report(self):
        return {
            "connacks": self.connacks,
            "subacks": self.subacks,
            "packets": [p for p in self.packets if p["type"] != "PINGRESP"],
            "messages": self.messages,
            "closed": self.closed_at is not None,
            "disconnect_reason": self.disconnect_reason,
        }


def acks(probe, kind):
    return [p for p in probe.packets if p["type"] == kind]


def raw_connect(name, level, client_id):
    """A CONNECT for protocol `name` at `level`, written by hand."""
    def s(b):
        return struct.pack("!H", len(b)) + b
    var = s(name) + bytes([level, 0x02]) + struct.pack("!H", 30)
    if level == 5:
        var += b"\x00"
    body = var + s(client_id.encode())
    return bytes([0x10, len(body)]) + body


def raw_exchange(packet, timeout=WAIT):
    """Sends `packet` on a new socket; what came back before the close (hex),
    and whether it closed."""
    sock = socket.create_connection((HOST, PORT), timeout=timeout)
    sock.sendall(packet)
    got = b""
    closed = False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(1024)
        except socket.timeout:
            break
        except ConnectionResetError:
            closed = True
            break
        if not chunk:
            closed = True
            break
        got += chunk
    sock.close()
    return {"reply": got.hex(), "closed": closed}
