// A device on MQTT.js over WebSocket, as a browser panel or a Node
// dashboard connects: ws://127.0.0.1:PORT/mqtt, client id = device id.
// It subscribes to its receipts, publishes one envelope at QoS 1 and waits
// (at most 15 s) for its `delivered` receipt; then it prints one JSON line
// of what it saw and exits. Run by tests/websocket.rs:
//     node ws_device.mjs PORT DEVICE MSG_ID
import mqtt from "mqtt";

const [port, device, msgId] = process.argv.slice(2);
const out = { receipts: [] };
const client = mqtt.connect(`ws://127.0.0.1:${port}/mqtt`, {
  clientId: device,
  protocolVersion: 5,
  reconnectPeriod: 0,
  connectTimeout: 5000,
});
let done = false;
function finish() {
  if (done) return;
  done = true;
  clearTimeout(timer);
  console.log(JSON.stringify(out));
  client.end(true, () => process.exit(0));
  setTimeout(() => process.exit(0), 500);
}
const timer = setTimeout(() => {
  out.timeout = true;
  finish();
}, 15000);
client.on("connect", (ack) => {
  out.connack = ack.reasonCode ?? ack.returnCode ?? 0;
  client.subscribe(`devices/${device}/ack`, { qos: 1 }, (err) => {
    if (err) {
      out.error = String(err);
      return finish();
    }
    const envelope = JSON.stringify({ msg_id: msgId, payload: { t: 21.5 } });
    client.publish(`devices/${device}/up/panel`, envelope, { qos: 1 }, (err) => {
      out.puback = err ? String(err) : "ok";
    });
  });
});
client.on("message", (_topic, payload) => {
  const r = JSON.parse(payload.toString());
  out.receipts.push(r);
  if (r.msg_id === msgId && r.status === "delivered") finish();
});
client.on("error", (e) => {
  out.error = String(e);
  finish();
});
