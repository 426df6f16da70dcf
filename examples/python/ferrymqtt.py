"""What device.py and backend.py share: a paho client made the same way on
paho-mqtt 1.6 (Debian 12's python3-paho-mqtt) and 2.x, the connection
options (host, port, login, TLS), and the one-JSON-line-per-event output.

paho 2.x wants a callback API version; version 2 passes the same leading
arguments to on_connect, on_subscribe and on_message as version 1 does for
MQTT 5, so the callbacks here take `*rest` for whatever follows and read
reason codes with `code()`, which takes an int (1.6 on MQTT 3.1.1) or a
ReasonCode(s) object alike.
"""

import json
import ssl
import sys
import threading
import time

try:
    import paho.mqtt
    import paho.mqtt.client as mqtt
except ImportError as e:
    sys.exit(
        f"paho-mqtt is missing for {sys.executable} ({e}): install it with "
        "`apt-get install -y python3-paho-mqtt` (or `pip install paho-mqtt`)"
    )

PAHO_VERSION = paho.mqtt.__version__
VERSIONS = {"311": mqtt.MQTTv311, "5": mqtt.MQTTv5}
# Longest text a peer chose that is printed as it came (payloads, reasons).
MAX_SHOWN = 200


def make_client(client_id, version):
    """A paho Client on paho-mqtt 1.6 or 2.x."""
    kwargs = {"client_id": client_id, "protocol": VERSIONS[version]}
    if hasattr(mqtt, "CallbackAPIVersion"):  # paho-mqtt 2.x
        kwargs["callback_api_version"] = mqtt.CallbackAPIVersion.VERSION2
    return mqtt.Client(**kwargs)


def say_connect_failures(client, host, port):
    """Prints each failed attempt to connect (nothing listens, a name that
    does not resolve, TLS refused): paho retries on its own and says
    nothing otherwise."""
    attempts = [0]

    def on_connect_fail(*_):
        attempts[0] += 1
        emit("connect_failed", host=host, port=port, attempt=attempts[0],
             hint="is the broker there? check --host and --port")

    client.on_connect_fail = on_connect_fail


def code(rc):
    """A reason code or QoS as an int (paho gives ints or ReasonCode objects)."""
    return getattr(rc, "value", rc)


def add_connection_args(parser, port, username_help):
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument("--mqtt", choices=sorted(VERSIONS), default="311",
                        help="MQTT version (default 3.1.1)")
    parser.add_argument("--username", help=username_help)
    parser.add_argument("--password-file",
                        help="a file whose first line is the password")
    parser.add_argument("--cafile", help="TLS: the CA that signed the broker's "
                        "certificate (turns TLS on)")
    parser.add_argument("--certfile", help="TLS: this client's certificate")
    parser.add_argument("--keyfile", help="TLS: this client's key")


def configure(client, args, default_username):
    """Login and TLS from the connection options."""
    if args.password_file:
        try:
            with open(args.password_file, encoding="utf-8") as f:
                password = f.readline().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as e:
            sys.exit(f"--password-file {args.password_file}: {e}")
        client.username_pw_set(args.username or default_username, password)
    elif args.username:
        client.username_pw_set(args.username)
    if args.cafile or args.certfile:
        # Verifies the broker's certificate and name, as paho's tls_set
        # would (which on paho 1.6 asks Python 3.10+ for a deprecated mode).
        try:
            context = ssl.create_default_context(cafile=args.cafile)
            if args.certfile:
                context.load_cert_chain(args.certfile, args.keyfile)
        except (OSError, ssl.SSLError) as e:
            sys.exit(f"TLS (--cafile {args.cafile}, --certfile {args.certfile}, "
                     f"--keyfile {args.keyfile}): {e}")
        client.tls_set_context(context)
    client.reconnect_delay_set(min_delay=1, max_delay=30)


def now_ms():
    return int(time.time() * 1000)


def shown(value):
    """A peer's value, as JSON, cut to MAX_SHOWN characters."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "..."


_stdout = threading.Lock()


def emit(event, **fields):
    """One line of JSON on stdout per event (what the tests read), whole
    even when paho's thread and the main one print at once."""
    line = json.dumps({"event": event, **fields}) + "\n"
    with _stdout:
        sys.stdout.write(line)
        sys.stdout.flush()


def parse_json(payload):
    """A message body as JSON, or None if it is not JSON."""
    try:
        return json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None


def as_list(value):
    """A receipt body may be one object or an array of them."""
    return value if isinstance(value, list) else [value]
