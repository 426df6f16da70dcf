pub mod alerts;
pub mod bridge;
pub mod console;
pub mod local;
pub mod meters;
pub mod network;
// ferry: MQTT 5 properties on a device connection.
pub mod properties;
pub mod remote;
pub mod timer;
