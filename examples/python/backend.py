"""A backend behind ferry, on the upstream broker (docs/PROTOCOL.md, "North").

    python3 backend.py --gateway edge-01 [--gateway edge-02 ...] [--port 1884]
                       [--db backend.db] [--share GROUP]
    python3 backend.py --send DEVICE JSON [--send ...] [--until delivered] [--serve]

The protocol points it shows:

- Uplinks arrive on `ferry/{gateway}/up/{device}/{stream...}` with the
  gateway's `seq`, or, from a gateway with `north.batch_max` > 1, as JSON
  arrays of the same bodies on `ferry/{gateway}/up` (a batch is committed
  in one transaction and acked with one ack array). Each is committed to SQLite, deduplicated by
  (gateway, device, msg_id), and only then acked on `ferry/{gateway}/ack`
  with `{"device", "msg_id", "status": "ok"}`. A duplicate (the gateway
  resends what it has no ack for) is acked again and not stored twice.
- Several instances can share the work: `--share GROUP` subscribes to
  `$share/GROUP/ferry/{gateway}/up/#`, so the broker hands each message
  to one of them. One instance may serve several gateways (`--gateway`
  repeated: a fleet of boxes on one broker); each uplink is acked to the
  gateway it came from. They must share the dedup too (the same `--db` here, one
  database in production): a resend may reach another instance than the
  first send did. One device's messages are spread over the instances;
  `seq` (contiguous per device) orders them where order matters.
- Presence: ferry takes the backend as present only from its acks (a
  backend that receives and acks nothing looks absent, and its messages
  wait, uncounted); there is no presence message to publish. The
  gateway's own presence is the retained `ferry/{gateway}/status`.
- Downlinks (`--send DEVICE JSON`): an envelope with a fresh msg_id on
  `ferry/{gateway}/down/{device}`, journaled before it is published and
  resent with the same msg_id until its `stored` receipt (5 s, doubling to
  60 s). Receipts come on `ferry/{gateway}/receipts`, one object or an
  array: `stored`, then `delivered` once the device confirmed it, `read`,
  or `expired`/`failed`/`rejected`. Every instance subscribes to them
  (not shared) and records them once. With `--send` it only sends: it
  takes no uplinks (another instance is the backend) and exits once every
  downlink reached `--until` (`stored`, `delivered`, the default, or
  `read`): 0, or 1 if one ended `expired`, `failed` or `rejected`.
  `--serve` sends and stays the backend, taking uplinks, until stopped.

Prints one JSON line per event; stops on SIGINT/SIGTERM.
"""

import argparse
import json
import os
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

ID = re.compile(r"[A-Za-z0-9._-]{1,64}")

SCHEMA = """
CREATE TABLE IF NOT EXISTS uplink (
    gateway TEXT NOT NULL, device TEXT NOT NULL, msg_id TEXT NOT NULL,
    seq INTEGER, stream TEXT, body TEXT NOT NULL,
    consumer TEXT NOT NULL, received_ms INTEGER NOT NULL,
    PRIMARY KEY (gateway, device, msg_id));
CREATE TABLE IF NOT EXISTS downlink (
    msg_id TEXT NOT NULL, device TEXT NOT NULL, body TEXT NOT NULL,
    sender TEXT NOT NULL, created_ms INTEGER NOT NULL,
    answered INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (msg_id, device));
CREATE TABLE IF NOT EXISTS receipt (
    msg_id TEXT, device TEXT, status TEXT NOT NULL, seq INTEGER,
    reason TEXT, ts INTEGER,
    UNIQUE (msg_id, device, status, seq));
"""


class Backend:
    def __init__(self, args):
        self.args = args
        # Topic base -> gateway id; downlinks go through the first.
        self.bases = {f"{args.prefix}/{g}": g for g in args.gateway}
        self.base = f"{args.prefix}/{args.gateway[0]}"
        self.id = args.client_id or f"backend-{os.getpid()}"
        # Several instances may share the file: WAL, and wait for the lock.
        self.db = sqlite3.connect(args.db, timeout=10, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)
        self.lock = threading.Lock()  # the db and the timers, both threads
        self.online = False
        self.timers = {}  # (msg_id, device) -> [resend at, timeout]
        # `--send` without `--serve`: the downlinks still to reach
        # `--until`, and whether one ended otherwise.
        self.sender_only = bool(args.send) and not args.serve
        self.waiting = set()
        self.failed = False
        self.stop = threading.Event()

        self.client = make_client(self.id, args.mqtt)
        configure(self.client, args, default_username=self.id)
        self.client.on_connect = self.on_connect
        self.client.on_subscribe = self.on_subscribe
        self.client.on_disconnect = self.on_disconnect
        self.client.on_message = self.on_message

    def on_connect(self, client, userdata, flags, rc, *rest):
        if code(rc) != 0:
            emit("refused", rc=str(rc))
            return
        filters = []
        for base in self.bases:
            up = f"{base}/up/#"
            if self.args.share:
                up = f"$share/{self.args.share}/{up}"
            if not self.sender_only:
                filters.append((up, 1))
            filters += [(f"{base}/receipts", 1), (f"{base}/status", 1)]
        client.subscribe(filters)

    def on_subscribe(self, client, userdata, mid, granted, *rest):
        if any(code(g) >= 0x80 for g in granted):
            emit("subscribe_refused", granted=[str(g) for g in granted])
            return
        with self.lock:
            self.online = True
            for timer in self.timers.values():
                timer[0] = 0.0
        emit("online", client_id=self.id, paho=PAHO_VERSION)

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
        for base, gateway in self.bases.items():
            if msg.topic.startswith(f"{base}/"):
                rest = msg.topic[len(base) + 1:]
                break
        else:
            return
        if rest.startswith("up/"):
            self.on_uplinks(gateway, [body])
        elif rest == "up":
            self.on_uplinks(gateway, body if isinstance(body, list) else [body], batch=True)
        elif rest == "receipts":
            for r in as_list(body):
                if isinstance(r, dict):
                    self.on_receipt(r)
        elif rest == "status" and isinstance(body, dict):
            emit("gateway_status", gateway=gateway, online=body.get("online") is True)

    # Uplinks: commit (dedup), then ack.

    def on_uplinks(self, gateway, messages, batch=False):
        """One uplink, or a batch (a gateway with north.batch_max > 1
        publishes a JSON array on ferry/{gateway}/up): committed in one
        transaction, then acked with one ack array."""
        good = []
        for m in messages:
            if (isinstance(m, dict) and isinstance(m.get("device"), str)
                    and isinstance(m.get("msg_id"), str)):
                good.append(m)
            else:
                emit("ignored", body=shown(m))  # nothing to ack it by
        if not good:
            return
        with self.lock, self.db:
            new = [self.db.execute(
                "INSERT OR IGNORE INTO uplink VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (gateway, m["device"], m["msg_id"], m.get("seq"),
                 str(m.get("stream")), json.dumps(m), self.id, now_ms())).rowcount
                for m in good]
        # Committed: now, and only now, the ack.
        acks = [{"device": m["device"], "msg_id": m["msg_id"], "status": "ok"} for m in good]
        self.client.publish(f"{self.args.prefix}/{gateway}/ack",
                            json.dumps(acks[0] if len(acks) == 1 else acks), qos=1)
        for m, n in zip(good, new):
            emit("uplink", gateway=gateway, device=shown(m["device"]), msg_id=shown(m["msg_id"]),
                 seq=m.get("seq"), duplicate=not n, batch=batch, payload=shown(m.get("payload")))

    # Downlinks: journal, publish, resend until stored; record receipts.

    def send_downlink(self, device, payload):
        msg_id = f"down-{secrets.token_hex(6)}"
        body = json.dumps({"msg_id": msg_id, "ts": now_ms(), "payload": payload})
        with self.lock, self.db:
            self.db.execute("INSERT INTO downlink (msg_id, device, body, sender, "
                            "created_ms) VALUES (?, ?, ?, ?, ?)",
                            (msg_id, device, body, self.id, now_ms()))
            self.timers[(msg_id, device)] = [0.0, self.args.receipt_timeout]
            self.waiting.add((msg_id, device))
        emit("downlink_journaled", msg_id=msg_id, device=device)

    def load_pending(self):
        """This instance's downlinks that have no answer yet (after a restart)."""
        rows = self.db.execute("SELECT msg_id, device FROM downlink "
                               "WHERE answered = 0 AND sender = ?", (self.id,))
        for key in rows.fetchall():
            self.timers[key] = [0.0, self.args.receipt_timeout]

    def resend_due(self):
        now = time.monotonic()
        with self.lock:
            if not self.online:
                return
            for (msg_id, device), timer in self.timers.items():
                if timer[0] > now:
                    continue
                (body,) = self.db.execute(
                    "SELECT body FROM downlink WHERE msg_id = ? AND device = ?",
                    (msg_id, device)).fetchone()
                self.client.publish(f"{self.base}/down/{device}", body, qos=1)
                timer[0] = now + timer[1]
                timer[1] = min(timer[1] * 2, 60.0)
                emit("downlink_sent", msg_id=msg_id, device=device)

    def on_receipt(self, r):
        msg_id, device, status = r.get("msg_id"), r.get("device"), r.get("status")
        reason = r.get("reason")
        with self.lock, self.db:
            self.db.execute("INSERT OR IGNORE INTO receipt VALUES (?, ?, ?, ?, ?, ?)",
                            (str(msg_id), str(device), str(status), r.get("seq"),
                             None if reason is None else str(reason), r.get("ts")))
            # Any answer but a retryable refusal ends the resending.
            if not (status == "rejected" and str(reason).startswith("disk_budget")):
                self.db.execute("UPDATE downlink SET answered = 1 "
                                "WHERE msg_id = ? AND device = ?",
                                (str(msg_id), str(device)))
                self.timers.pop((msg_id, device), None)
        emit("receipt", msg_id=shown(str(msg_id)), device=shown(str(device)),
             status=shown(str(status)), seq=r.get("seq"), reason=shown(str(reason or "")))
        self.settle((msg_id, device), status, reason)

    def settle(self, key, status, reason):
        """`--send`: one of this run's downlinks reached `--until`, or
        ended otherwise; the run ends when none is left."""
        order = ["stored", "delivered", "read"]
        ended = status in ("expired", "failed") or (
            status == "rejected" and not str(reason).startswith("disk_budget"))
        reached = status in order and order.index(status) >= order.index(self.args.until)
        with self.lock:
            if key not in self.waiting or not (ended or reached):
                return
            self.waiting.discard(key)
            self.failed |= ended
            done = self.sender_only and not self.waiting
        if done:
            self.stop.set()

    def run(self, stop):
        args = self.args
        self.stop = stop
        self.load_pending()
        for device, text in args.send:
            value = parse_json(text)  # JSON, or else the text as a string
            self.send_downlink(device, text if value is None else value)
        say_connect_failures(self.client, args.host, args.port)
        self.client.connect_async(args.host, args.port, keepalive=30)
        self.client.loop_start()
        while not stop.is_set():
            self.resend_due()
            stop.wait(0.05)
        self.client.disconnect()
        self.client.loop_stop()
        emit("stopped")
        return 1 if self.failed else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gateway", action="append", help="gateway.id (repeatable; "
                   "default edge-01); downlinks go through the first")
    add_connection_args(p, 1884, "default: the client id")
    p.add_argument("--prefix", default="ferry", help="north.topic_prefix")
    p.add_argument("--client-id",
                   help="stable per instance, so it resends its own downlinks "
                   "after a restart (default: backend-PID)")
    p.add_argument("--db", default="backend.db", help="SQLite file (shared by instances)")
    p.add_argument("--share", metavar="GROUP", help="take uplinks through "
                   "the shared subscription $share/GROUP/...")
    p.add_argument("--send", nargs=2, action="append", default=[],
                   metavar=("DEVICE", "JSON"), help="send a downlink (repeatable); "
                   "then exit once each reached --until (no uplinks taken)")
    p.add_argument("--until", choices=["stored", "delivered", "read"], default="delivered",
                   help="with --send: the receipt to wait for (default: delivered)")
    p.add_argument("--serve", action="store_true",
                   help="with --send: also take uplinks and keep running")
    p.add_argument("--receipt-timeout", type=float, default=5.0)
    args = p.parse_args()
    args.gateway = args.gateway or ["edge-01"]
    if args.receipt_timeout <= 0:
        p.error("--receipt-timeout must be > 0")
    for name in args.gateway + [device for device, _ in args.send]:
        if not ID.fullmatch(name):
            p.error(f"{name!r} is not an id: [A-Za-z0-9._-]{{1,64}}")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        sys.exit(Backend(args).run(stop))
    except (OSError, sqlite3.Error) as e:  # a file, the journal, TLS (SSLError)
        sys.exit(f"backend.py: {e}")


if __name__ == "__main__":
    main()
