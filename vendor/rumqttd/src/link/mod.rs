pub mod alerts;
pub mod bridge;
pub mod console;
// ferry: publishes handed to the gateway, acknowledged after its commit.
pub mod direct;
pub mod local;
pub mod meters;
pub mod network;
// ferry: MQTT 5 properties on a device connection.
pub mod properties;
pub mod remote;
pub mod timer;
