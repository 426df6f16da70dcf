"""A field device talking to ferry (docs/PROTOCOL.md, "South").

    python3 device.py --id press-7 --send 3 [--port 1883] [--data-dir DIR]

The protocol points it shows:

- One MQTT connection per device, its client id the device id (the
  embedded broker refuses any other); with `--password-file` it logs in
  with the device id as username. `--cafile` turns TLS on.
- Last will `{"online": false}` on `devices/{id}/status`, and
  `{"online": true}` there once subscribed, both retained (docs/EXTERNAL.md
  says why), then a `pull` for anything the gateway sent before the
  subscriptions were in place.
- Uplinks: an envelope `{"msg_id", "ts", "payload"}` on
  `devices/{id}/up/{stream}`. Each is written to a local journal (SQLite,
  `outbox`) *before* it is published, and stays there until its receipt
  on `devices/{id}/ack` says `stored` (or `delivered`, `failed`: the
  answers to a duplicate). Until then it is resent with the same msg_id
  after every reconnect and when no receipt came within the receipt
  timeout (5 s, doubling to 60 s); a `rejected` for `rate` or
  `disk_budget` is retried the same way, any other `rejected` is final.
  A device killed at any point and started again resends what its
  journal holds, so the gateway, which dedups by (device, msg_id), stores
  each reading once.
- msg_ids are `{boot}-{n}` with a random boot id per start: never reused,
  even if the journal is lost.
- Downlinks: batches on `devices/{id}/inbox`. Each message with a `seq`
  past the local cursor is committed (SQLite `inbox`, with the cursor, in
  one transaction); duplicates (`seq` <= cursor) are dropped; then
  `{"upto": last seq}` goes to `devices/{id}/confirm`. With `--read` the
  device also reports them read (`devices/{id}/read`).

Prints one JSON line per event. Stops on SIGINT/SIGTERM (publishing
`{"online": false}` first), or with `--exit-when-done` once its readings
are all stored.
"""

import argparse
import json
import os
import random
import re
import secrets
import signal
import sqlite3
import sys
import threading
import time

from ferrymqtt import (PAHO_VERSION, add_connection_args, as_list, code,
                       configure, emit, make_client, now_ms, parse_json,
                       say_connect_failures, shown)

RETRYABLE = ("rate", "disk_budget")
FINAL = ("stored", "delivered", "failed")

SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    msg_id TEXT PRIMARY KEY, topic TEXT NOT NULL, body TEXT NOT NULL,
    created_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS inbox (
    seq INTEGER PRIMARY KEY, msg_id TEXT, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cursor (
    one INTEGER PRIMARY KEY CHECK (one = 1), seq INTEGER NOT NULL);
"""


class Device:
    def __init__(self, args):
        self.args = args
        self.prefix = f"{args.prefix}/{args.id}"
        os.makedirs(args.data_dir, exist_ok=True)
        path = os.path.join(args.data_dir, f"{args.id}.db")
        self.db = sqlite3.connect(path, check_same_thread=False)
        self.db.executescript(SCHEMA)
        self.lock = threading.Lock()  # the db and the timers, both threads
        self.online = False
        self.boot = secrets.token_hex(4)
        self.sent = 0
        # msg_id -> [when to resend (monotonic), current receipt timeout]
        self.timers = {m: [0.0, args.receipt_timeout] for (m,) in
                       self.db.execute("SELECT msg_id FROM outbox")}
        emit("started", boot=self.boot, pending=sorted(self.timers), paho=PAHO_VERSION)

        self.client = make_client(args.id, args.mqtt)
        configure(self.client, args, default_username=args.id)
        self.client.will_set(f"{self.prefix}/status",
                             json.dumps({"online": False}), qos=1, retain=True)
        self.client.on_connect = self.on_connect
        self.client.on_subscribe = self.on_subscribe
        self.client.on_disconnect = self.on_disconnect
        self.client.on_message = self.on_message

    # The connection.

    def on_connect(self, client, userdata, flags, rc, *rest):
        if code(rc) != 0:
            emit("refused", rc=str(rc))
            return
        emit("connected")
        client.subscribe([(f"{self.prefix}/ack", 1), (f"{self.prefix}/inbox", 1)])

    def on_subscribe(self, client, userdata, mid, granted, *rest):
        if any(code(g) >= 0x80 for g in granted):
            emit("subscribe_refused", granted=[str(g) for g in granted])
            return
        client.publish(f"{self.prefix}/status", json.dumps({"online": True}),
                       qos=1, retain=True)
        client.publish(f"{self.prefix}/pull", "{}", qos=1)
        with self.lock:
            self.online = True
            for timer in self.timers.values():
                timer[0] = 0.0  # resend everything pending now
        emit("online")

    def on_disconnect(self, client, userdata, *rest):
        with self.lock:
            self.online = False
        emit("disconnected")

    def on_message(self, client, userdata, msg):
        try:
            self.handle(msg)
        except Exception as e:  # noqa: BLE001 - the loop must go on
            # Nothing was confirmed or acked for it: the gateway sends it
            # again, as it does anything lost.
            emit("error", topic=shown(msg.topic), error=shown(repr(e)))

    def handle(self, msg):
        body = parse_json(msg.payload)
        if msg.topic.endswith("/ack"):
            for receipt in as_list(body):
                if isinstance(receipt, dict):
                    self.on_receipt(receipt)
        elif msg.topic.endswith("/inbox") and isinstance(body, dict):
            self.on_batch(body)
        else:
            emit("ignored", topic=shown(msg.topic), body=shown(repr(msg.payload)))

    # Uplinks: journal, publish, resend until stored.

    def journal(self, stream, payload):
        """Writes a new reading to the outbox; the tick publishes it."""
        msg_id = f"{self.boot}-{self.sent + 1:06d}"
        body = json.dumps({"msg_id": msg_id, "ts": now_ms(), "payload": payload})
        with self.lock, self.db:
            self.db.execute("INSERT INTO outbox VALUES (?, ?, ?, ?)",
                            (msg_id, f"{self.prefix}/up/{stream}", body, now_ms()))
            self.timers[msg_id] = [0.0, self.args.receipt_timeout]
        self.sent += 1
        emit("journaled", msg_id=msg_id)

    def resend_due(self):
        """Publishes what is pending and due, oldest first."""
        now = time.monotonic()
        with self.lock:
            if not self.online:
                return
            rows = self.db.execute(
                "SELECT msg_id, topic, body FROM outbox ORDER BY created_ms, msg_id")
            for msg_id, topic, body in rows.fetchall():
                timer = self.timers.get(msg_id)
                if timer is None or timer[0] > now:
                    continue
                self.client.publish(topic, body, qos=1)
                timer[0] = now + timer[1]
                timer[1] = min(timer[1] * 2, 60.0)
                emit("sent", msg_id=msg_id)

    def on_receipt(self, r):
        msg_id, status = r.get("msg_id"), r.get("status")
        reason = str(r.get("reason", ""))
        emit("receipt", msg_id=shown(str(msg_id)), status=shown(str(status)),
             seq=r.get("seq"), reason=shown(reason))
        if status in FINAL or (status == "rejected" and not reason.startswith(RETRYABLE)):
            with self.lock, self.db:
                self.db.execute("DELETE FROM outbox WHERE msg_id = ?", (str(msg_id),))
                self.timers.pop(msg_id, None)

    # Downlinks: commit, then confirm.

    def on_batch(self, batch):
        messages = [m for m in batch.get("messages", [])
                    if isinstance(m, dict) and isinstance(m.get("seq"), int)]
        if not messages:
            return
        with self.lock, self.db:
            (cursor,) = self.db.execute(
                "SELECT coalesce(max(seq), 0) FROM cursor").fetchone()
            for m in sorted(messages, key=lambda m: m["seq"]):
                if m["seq"] <= cursor:
                    continue  # delivered before: drop, and still confirm
                # A tombstone ({"status": "expired"}) has no payload; it is
                # committed too, so the cursor passes it.
                self.db.execute("INSERT INTO inbox VALUES (?, ?, ?)",
                                (m["seq"], str(m.get("msg_id")), json.dumps(m)))
                cursor = m["seq"]
                emit("downlink", seq=m["seq"], msg_id=shown(str(m.get("msg_id"))),
                     payload=shown(m.get("payload", m.get("status"))))
            self.db.execute("INSERT OR REPLACE INTO cursor VALUES (1, ?)", (cursor,))
        upto = max(m["seq"] for m in messages)
        self.client.publish(f"{self.prefix}/confirm", json.dumps({"upto": upto}), qos=1)
        emit("confirmed", upto=upto)
        if self.args.read:
            self.client.publish(f"{self.prefix}/read", json.dumps({"upto": upto}), qos=1)

    def pending(self):
        with self.lock:
            return len(self.timers)

    def run(self, stop):
        args = self.args
        say_connect_failures(self.client, args.host, args.port)
        self.client.connect_async(args.host, args.port, keepalive=30)
        self.client.loop_start()
        next_reading = time.monotonic()
        while not stop.is_set():
            if self.sent < args.send and time.monotonic() >= next_reading:
                self.journal(args.stream, {"n": self.sent + 1,
                                           "temp": round(random.uniform(60, 90), 1)})
                next_reading = time.monotonic() + args.interval
            self.resend_due()
            if args.exit_when_done and self.sent >= args.send and not self.pending():
                break
            stop.wait(0.05)
        if self.online:
            info = self.client.publish(f"{self.prefix}/status",
                                       json.dumps({"online": False}), qos=1, retain=True)
            try:
                info.wait_for_publish(2)
            except (RuntimeError, ValueError):
                pass  # the link went meanwhile: the will says offline
        self.client.disconnect()
        self.client.loop_stop()
        emit("stopped", pending=self.pending())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--id", required=True, help="the device id (client id)")
    add_connection_args(p, 1883, "default: the device id")
    p.add_argument("--prefix", default="devices", help="south.topic_prefix")
    p.add_argument("--data-dir", default="device-data",
                   help="where the journal lives ({id}.db)")
    p.add_argument("--send", type=int, default=0, help="readings to send")
    p.add_argument("--interval", type=float, default=1.0,
                   help="seconds between readings")
    p.add_argument("--stream", default="telemetry")
    p.add_argument("--receipt-timeout", type=float, default=5.0)
    p.add_argument("--read", action="store_true",
                   help="report downlinks read after committing them")
    p.add_argument("--exit-when-done", action="store_true",
                   help="exit once every reading has its receipt")
    args = p.parse_args()
    if args.receipt_timeout <= 0 or args.interval < 0 or args.send < 0:
        p.error("--receipt-timeout must be > 0, --interval and --send >= 0")
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", args.id):
        p.error(f"{args.id!r} is not a device id: [A-Za-z0-9._-]{{1,64}}")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        Device(args).run(stop)
    except (OSError, sqlite3.Error) as e:  # a file, the journal, TLS (SSLError)
        sys.exit(f"device.py: {e}")


if __name__ == "__main__":
    main()
