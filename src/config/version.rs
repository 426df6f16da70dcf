//! `south.mqtt_version` and `north.mqtt_version`: the protocol level
//! ferry speaks as a client of a broker, a closed choice.

use super::check::ConfigError;

/// The MQTT protocol level ferry speaks as a client of a broker
/// (`south.mqtt_version` in external mode, `north.mqtt_version`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MqttVersion {
    /// MQTT 3.1.1 (protocol level 4).
    #[default]
    V311,
    /// MQTT 5: reason codes on CONNACK, SUBACK and PUBACK, the broker's
    /// limits announced in its CONNACK.
    V5,
}

impl MqttVersion {
    /// `key`'s value: "3.1.1" or "5".
    pub fn parse(key: &str, value: &str) -> Result<MqttVersion, ConfigError> {
        match value {
            "3.1.1" => Ok(MqttVersion::V311),
            "5" => Ok(MqttVersion::V5),
            other => Err(ConfigError::new(
                key,
                format!("must be \"3.1.1\" or \"5\" (got {other:?})"),
            )),
        }
    }

    /// The value a config file writes for it.
    pub fn as_str(self) -> &'static str {
        match self {
            MqttVersion::V311 => "3.1.1",
            MqttVersion::V5 => "5",
        }
    }
}
