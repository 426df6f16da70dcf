"""The Paho interoperability cases, rewritten for ferry's topic rules.

Run by the Rust tests in tests/conformance/ as

    /usr/bin/python3 paho_cases.py CASE --port PORT --device ID [--version 31|311|5] [--param K=V ...]

with Debian's python3-paho-mqtt (1.6.1). Each case drives one device on its
own topics (devices/ID/up/..., status, ...; subscriptions on devices/ID/ack
and devices/ID/inbox only), asserts nothing itself, and prints one JSON line
of what it saw: CONNACKs (code, session present, properties), SUBACK codes,
every acknowledgement packet with its reason code, the receipts with their
DUP and QoS flags, and whether and when the connection was closed. The Rust
test asserts on that line and on what the backend and the store got. A case
may stop halfway at a `{"sync": LABEL}` line until the test writes a line
to its stdin.

The cases are in connect_cases.py and publish_cases.py, the harness in
probe.py.
"""

import argparse
import json
import time

import connect_cases
import probe
import publish_cases
from probe import VERSIONS

CASES = {
    name[5:]: f
    for module in (connect_cases, publish_cases)
    for name, f in vars(module).items()
    if name.startswith("case_")
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--version", default="5", choices=sorted(VERSIONS))
    parser.add_argument("--param", action="append", default=[], help="K=V")
    a = parser.parse_args()
    a.param = dict(kv.split("=", 1) for kv in a.param)
    probe.PORT = a.port
    started = time.monotonic()
    out = CASES[a.case](a)
    out["elapsed_s"] = round(time.monotonic() - started, 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
