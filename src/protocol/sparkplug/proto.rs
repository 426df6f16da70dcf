//! The Sparkplug B payload messages, written by hand after Eclipse Tahu's
//! `sparkplug_b.proto` (vendored in `vendor/tahu/`, proto2): every message,
//! field number, type and oneof of the file, laid out as prost-build would
//! (nested messages in a snake_case module named after their parent,
//! `value` oneofs as a `Value` enum beside them, repeated scalars unpacked
//! as proto2 writes them).
//!
//! The messages with an extension range are [`Extensible`]: the derived
//! `*Fields` struct plus the extension fields as they came, so no
//! third-party data is lost on re-encoding. The `*ValueExtension`
//! messages, nothing but a range, are [`Extensions`].

pub use super::ext::{Extensible, Extensions};

/// `DataType`: what a metric's, parameter's, property's or dataset
/// column's `uint32` type field holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum DataType {
    /// Placeholder for future expansion.
    Unknown = 0,
    /// 8-bit signed integer, in `int_value`.
    Int8 = 1,
    /// 16-bit signed integer, in `int_value`.
    Int16 = 2,
    /// 32-bit signed integer, in `int_value`.
    Int32 = 3,
    /// 64-bit signed integer, in `long_value`.
    Int64 = 4,
    /// 8-bit unsigned integer, in `int_value`.
    UInt8 = 5,
    /// 16-bit unsigned integer, in `int_value`.
    UInt16 = 6,
    /// 32-bit unsigned integer, in `int_value` (or `long_value`).
    UInt32 = 7,
    /// 64-bit unsigned integer, in `long_value`.
    UInt64 = 8,
    /// 32-bit float, in `float_value`.
    Float = 9,
    /// 64-bit float, in `double_value`.
    Double = 10,
    /// Boolean, in `boolean_value`.
    Boolean = 11,
    /// String, in `string_value`.
    String = 12,
    /// Milliseconds since the epoch, in `long_value`.
    DateTime = 13,
    /// Text, in `string_value`.
    Text = 14,
    /// A UUID as a string, in `string_value`.
    Uuid = 15,
    /// A table, in `dataset_value`.
    DataSet = 16,
    /// Bytes, in `bytes_value`.
    Bytes = 17,
    /// A file's bytes, in `bytes_value`.
    File = 18,
    /// A template definition or instance, in `template_value`.
    Template = 19,
    /// A property set (properties only).
    PropertySet = 20,
    /// A list of property sets (properties only).
    PropertySetList = 21,
    /// Array of Int8, packed in `bytes_value`.
    Int8Array = 22,
    /// Array of Int16, packed in `bytes_value`.
    Int16Array = 23,
    /// Array of Int32, packed in `bytes_value`.
    Int32Array = 24,
    /// Array of Int64, packed in `bytes_value`.
    Int64Array = 25,
    /// Array of UInt8, packed in `bytes_value`.
    UInt8Array = 26,
    /// Array of UInt16, packed in `bytes_value`.
    UInt16Array = 27,
    /// Array of UInt32, packed in `bytes_value`.
    UInt32Array = 28,
    /// Array of UInt64, packed in `bytes_value`.
    UInt64Array = 29,
    /// Array of Float, packed in `bytes_value`.
    FloatArray = 30,
    /// Array of Double, packed in `bytes_value`.
    DoubleArray = 31,
    /// Array of Boolean, packed in `bytes_value`.
    BooleanArray = 32,
    /// Array of String, packed in `bytes_value`.
    StringArray = 33,
    /// Array of DateTime, packed in `bytes_value`.
    DateTimeArray = 34,
}

/// `Payload`: one Sparkplug B message body (`extensions 6 to max`).
pub type Payload = Extensible<PayloadFields, 6>;

/// The declared fields of [`Payload`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct PayloadFields {
    /// 1: when the message was sent, ms since the epoch.
    #[prost(uint64, optional, tag = "1")]
    pub timestamp: Option<u64>,
    /// 2: the metrics.
    #[prost(message, repeated, tag = "2")]
    pub metrics: Vec<payload::Metric>,
    /// 3: the sequence number (0..=255).
    #[prost(uint64, optional, tag = "3")]
    pub seq: Option<u64>,
    /// 4: a UUID naming the payload's schema.
    #[prost(string, optional, tag = "4")]
    pub uuid: Option<String>,
    /// 5: a body bypassing the rest of the definition.
    #[prost(bytes = "vec", optional, tag = "5")]
    pub body: Option<Vec<u8>>,
}

/// The messages nested in `Payload`.
pub mod payload {
    use super::{Extensible, Extensions};

    /// `Payload.Template`: a template definition or instance
    /// (`extensions 6 to max`).
    pub type Template = Extensible<TemplateFields, 6>;

    /// The declared fields of [`Template`].
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TemplateFields {
        /// 1: the template's version, to prevent mismatches.
        #[prost(string, optional, tag = "1")]
        pub version: Option<String>,
        /// 2: the template's metrics.
        #[prost(message, repeated, tag = "2")]
        pub metrics: Vec<Metric>,
        /// 3: the template's parameters.
        #[prost(message, repeated, tag = "3")]
        pub parameters: Vec<template::Parameter>,
        /// 4: in an instance, the name of its definition.
        #[prost(string, optional, tag = "4")]
        pub template_ref: Option<String>,
        /// 5: whether this is a definition rather than an instance.
        #[prost(bool, optional, tag = "5")]
        pub is_definition: Option<bool>,
    }

    /// The messages nested in `Template`.
    pub mod template {
        /// `Template.Parameter`: one parameter of a template.
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct Parameter {
            /// 1: the parameter's name.
            #[prost(string, optional, tag = "1")]
            pub name: Option<String>,
            /// 2: its [`DataType`](super::super::DataType).
            #[prost(uint32, optional, tag = "2")]
            pub r#type: Option<u32>,
            /// 3..=9: its value.
            #[prost(oneof = "parameter::Value", tags = "3, 4, 5, 6, 7, 8, 9")]
            pub value: Option<parameter::Value>,
        }

        /// The oneof and message nested in `Parameter`.
        pub mod parameter {
            /// `Parameter.ParameterValueExtension` (`extensions 1 to max`).
            pub type ParameterValueExtension = super::super::Extensions;

            /// `Parameter.value`.
            #[derive(Clone, PartialEq, prost::Oneof)]
            pub enum Value {
                /// 3: `uint32 int_value`.
                #[prost(uint32, tag = "3")]
                IntValue(u32),
                /// 4: `uint64 long_value`.
                #[prost(uint64, tag = "4")]
                LongValue(u64),
                /// 5: `float float_value`.
                #[prost(float, tag = "5")]
                FloatValue(f32),
                /// 6: `double double_value`.
                #[prost(double, tag = "6")]
                DoubleValue(f64),
                /// 7: `bool boolean_value`.
                #[prost(bool, tag = "7")]
                BooleanValue(bool),
                /// 8: `string string_value`.
                #[prost(string, tag = "8")]
                StringValue(String),
                /// 9: `ParameterValueExtension extension_value`.
                #[prost(message, tag = "9")]
                ExtensionValue(ParameterValueExtension),
            }
        }
    }

    /// `Payload.DataSet`: a table (`extensions 5 to max`).
    pub type DataSet = Extensible<DataSetFields, 5>;

    /// The declared fields of [`DataSet`].
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DataSetFields {
        /// 1: how many columns.
        #[prost(uint64, optional, tag = "1")]
        pub num_of_columns: Option<u64>,
        /// 2: the columns' names.
        #[prost(string, repeated, tag = "2")]
        pub columns: Vec<String>,
        /// 3: the columns' [`DataType`](super::DataType)s.
        #[prost(uint32, repeated, packed = "false", tag = "3")]
        pub types: Vec<u32>,
        /// 4: the rows.
        #[prost(message, repeated, tag = "4")]
        pub rows: Vec<data_set::Row>,
    }

    /// The messages nested in `DataSet`.
    pub mod data_set {
        use super::Extensible;

        /// `DataSet.DataSetValue`: one cell.
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct DataSetValue {
            /// 1..=7: the cell's value.
            #[prost(oneof = "data_set_value::Value", tags = "1, 2, 3, 4, 5, 6, 7")]
            pub value: Option<data_set_value::Value>,
        }

        /// The oneof and message nested in `DataSetValue`.
        pub mod data_set_value {
            /// `DataSetValue.DataSetValueExtension` (`extensions 1 to max`).
            pub type DataSetValueExtension = super::super::Extensions;

            /// `DataSetValue.value`.
            #[derive(Clone, PartialEq, prost::Oneof)]
            pub enum Value {
                /// 1: `uint32 int_value`.
                #[prost(uint32, tag = "1")]
                IntValue(u32),
                /// 2: `uint64 long_value`.
                #[prost(uint64, tag = "2")]
                LongValue(u64),
                /// 3: `float float_value`.
                #[prost(float, tag = "3")]
                FloatValue(f32),
                /// 4: `double double_value`.
                #[prost(double, tag = "4")]
                DoubleValue(f64),
                /// 5: `bool boolean_value`.
                #[prost(bool, tag = "5")]
                BooleanValue(bool),
                /// 6: `string string_value`.
                #[prost(string, tag = "6")]
                StringValue(String),
                /// 7: `DataSetValueExtension extension_value`.
                #[prost(message, tag = "7")]
                ExtensionValue(DataSetValueExtension),
            }
        }

        /// `DataSet.Row`: one row (`extensions 2 to max`).
        pub type Row = Extensible<RowFields, 2>;

        /// The declared fields of [`Row`].
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct RowFields {
            /// 1: the row's cells, one per column.
            #[prost(message, repeated, tag = "1")]
            pub elements: Vec<DataSetValue>,
        }
    }

    /// `Payload.PropertyValue`: one property's value.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PropertyValue {
        /// 1: its [`DataType`](super::DataType).
        #[prost(uint32, optional, tag = "1")]
        pub r#type: Option<u32>,
        /// 2: whether the value is null.
        #[prost(bool, optional, tag = "2")]
        pub is_null: Option<bool>,
        /// 3..=11: the value.
        #[prost(oneof = "property_value::Value", tags = "3, 4, 5, 6, 7, 8, 9, 10, 11")]
        pub value: Option<property_value::Value>,
    }

    /// The oneof and message nested in `PropertyValue`.
    pub mod property_value {
        /// `PropertyValue.PropertyValueExtension` (`extensions 1 to max`).
        pub type PropertyValueExtension = super::Extensions;

        /// `PropertyValue.value`.
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Value {
            /// 3: `uint32 int_value`.
            #[prost(uint32, tag = "3")]
            IntValue(u32),
            /// 4: `uint64 long_value`.
            #[prost(uint64, tag = "4")]
            LongValue(u64),
            /// 5: `float float_value`.
            #[prost(float, tag = "5")]
            FloatValue(f32),
            /// 6: `double double_value`.
            #[prost(double, tag = "6")]
            DoubleValue(f64),
            /// 7: `bool boolean_value`.
            #[prost(bool, tag = "7")]
            BooleanValue(bool),
            /// 8: `string string_value`.
            #[prost(string, tag = "8")]
            StringValue(String),
            /// 9: `PropertySet propertyset_value`.
            #[prost(message, tag = "9")]
            PropertysetValue(super::PropertySet),
            /// 10: `PropertySetList propertysets_value`.
            #[prost(message, tag = "10")]
            PropertysetsValue(super::PropertySetList),
            /// 11: `PropertyValueExtension extension_value`.
            #[prost(message, tag = "11")]
            ExtensionValue(PropertyValueExtension),
        }
    }

    /// `Payload.PropertySet`: named properties (`extensions 3 to max`).
    pub type PropertySet = Extensible<PropertySetFields, 3>;

    /// The declared fields of [`PropertySet`].
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PropertySetFields {
        /// 1: the properties' names.
        #[prost(string, repeated, tag = "1")]
        pub keys: Vec<String>,
        /// 2: their values, in the same order.
        #[prost(message, repeated, tag = "2")]
        pub values: Vec<PropertyValue>,
    }

    /// `Payload.PropertySetList`: a list of property sets
    /// (`extensions 2 to max`).
    pub type PropertySetList = Extensible<PropertySetListFields, 2>;

    /// The declared fields of [`PropertySetList`].
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PropertySetListFields {
        /// 1: the property sets.
        #[prost(message, repeated, tag = "1")]
        pub propertyset: Vec<PropertySet>,
    }

    /// `Payload.MetaData`: a metric's metadata (`extensions 9 to max`).
    pub type MetaData = Extensible<MetaDataFields, 9>;

    /// The declared fields of [`MetaData`].
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MetaDataFields {
        /// 1: whether the bytes are one part of several.
        #[prost(bool, optional, tag = "1")]
        pub is_multi_part: Option<bool>,
        /// 2: content (media) type.
        #[prost(string, optional, tag = "2")]
        pub content_type: Option<String>,
        /// 3: file, string or multi-part size.
        #[prost(uint64, optional, tag = "3")]
        pub size: Option<u64>,
        /// 4: sequence number of a multi-part message.
        #[prost(uint64, optional, tag = "4")]
        pub seq: Option<u64>,
        /// 5: file name.
        #[prost(string, optional, tag = "5")]
        pub file_name: Option<String>,
        /// 6: file type (xml, json, ...).
        #[prost(string, optional, tag = "6")]
        pub file_type: Option<String>,
        /// 7: MD5 of the data.
        #[prost(string, optional, tag = "7")]
        pub md5: Option<String>,
        /// 8: free-form description.
        #[prost(string, optional, tag = "8")]
        pub description: Option<String>,
    }

    /// `Payload.Metric`: one metric (no extension range).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Metric {
        /// 1: the metric's name (on birth, or without aliases).
        #[prost(string, optional, tag = "1")]
        pub name: Option<String>,
        /// 2: the alias the birth tied to the name.
        #[prost(uint64, optional, tag = "2")]
        pub alias: Option<u64>,
        /// 3: when the value was acquired, ms since the epoch.
        #[prost(uint64, optional, tag = "3")]
        pub timestamp: Option<u64>,
        /// 4: its [`DataType`](super::DataType).
        #[prost(uint32, optional, tag = "4")]
        pub datatype: Option<u32>,
        /// 5: historical data, not to update the live value.
        #[prost(bool, optional, tag = "5")]
        pub is_historical: Option<bool>,
        /// 6: not to be stored as a tag by consumers.
        #[prost(bool, optional, tag = "6")]
        pub is_transient: Option<bool>,
        /// 7: the value is null.
        #[prost(bool, optional, tag = "7")]
        pub is_null: Option<bool>,
        /// 8: metadata.
        #[prost(message, optional, tag = "8")]
        pub metadata: Option<MetaData>,
        /// 9: properties.
        #[prost(message, optional, tag = "9")]
        pub properties: Option<PropertySet>,
        /// 10..=19: the value.
        #[prost(
            oneof = "metric::Value",
            tags = "10, 11, 12, 13, 14, 15, 16, 17, 18, 19"
        )]
        pub value: Option<metric::Value>,
    }

    /// The oneof and message nested in `Metric`.
    pub mod metric {
        /// `Metric.MetricValueExtension` (`extensions 1 to max`).
        pub type MetricValueExtension = super::Extensions;

        /// `Metric.value`.
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Value {
            /// 10: `uint32 int_value`.
            #[prost(uint32, tag = "10")]
            IntValue(u32),
            /// 11: `uint64 long_value`.
            #[prost(uint64, tag = "11")]
            LongValue(u64),
            /// 12: `float float_value`.
            #[prost(float, tag = "12")]
            FloatValue(f32),
            /// 13: `double double_value`.
            #[prost(double, tag = "13")]
            DoubleValue(f64),
            /// 14: `bool boolean_value`.
            #[prost(bool, tag = "14")]
            BooleanValue(bool),
            /// 15: `string string_value`.
            #[prost(string, tag = "15")]
            StringValue(String),
            /// 16: `bytes bytes_value` (Bytes, File, arrays).
            #[prost(bytes = "vec", tag = "16")]
            BytesValue(Vec<u8>),
            /// 17: `DataSet dataset_value`.
            #[prost(message, tag = "17")]
            DatasetValue(super::DataSet),
            /// 18: `Template template_value`.
            #[prost(message, tag = "18")]
            TemplateValue(super::Template),
            /// 19: `MetricValueExtension extension_value`.
            #[prost(message, tag = "19")]
            ExtensionValue(MetricValueExtension),
        }
    }
}
