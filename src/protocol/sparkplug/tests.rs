use super::proto::payload::{
    data_set, metric, property_value, template, DataSet, DataSetFields, MetaData, MetaDataFields,
    Metric, PropertySet, PropertySetFields, PropertySetList, PropertySetListFields, PropertyValue,
    Template, TemplateFields,
};
use super::proto::{DataType, Extensions, Payload, PayloadFields};
use super::*;

#[test]
fn topics_of_every_kind_parse() {
    let kinds = [
        Kind::NBirth,
        Kind::NData,
        Kind::NDeath,
        Kind::NCmd,
        Kind::DBirth,
        Kind::DData,
        Kind::DDeath,
        Kind::DCmd,
    ];
    for kind in kinds {
        assert_eq!(Kind::from_message_type(kind.as_str()), Some(kind));
        let device = kind.is_device().then_some("dev 1");
        let topic = match device {
            Some(d) => format!("spBv1.0/plant.A/{}/edge-1/{d}", kind.as_str()),
            None => format!("spBv1.0/plant.A/{}/edge-1", kind.as_str()),
        };
        assert_eq!(
            parse_topic(&topic),
            Some(Topic {
                group: "plant.A",
                kind,
                edge_node: "edge-1",
                device,
            }),
            "{topic}"
        );
    }
}

#[test]
fn bad_topics_do_not_parse() {
    for topic in [
        "",
        "spBv1.0",
        "spBv1.0/G",
        "spBv1.0/G/NDATA",
        "spBv1.1/G/NDATA/E",
        "spAv1.0/G/NDATA/E",
        "/spBv1.0/G/NDATA/E",
        "spBv1.0/G/ndata/E",
        "spBv1.0/G/STATE/E",
        "spBv1.0/G/NDATA/E/D",
        "spBv1.0/G/DDATA/E",
        "spBv1.0/G/DDATA/E/",
        "spBv1.0/G/DDATA/E/D/more",
        "spBv1.0//NDATA/E",
        "spBv1.0/G/NDATA/",
        "spBv1.0/G/DDATA//D",
        "spBv1.0/+/NDATA/E",
        "spBv1.0/G/NDATA/E#",
        "spBv1.0/G/DDATA/E/+",
        "spBv1.0/G/DDATA/E/a#b",
        "spBv1.0/STATE/host",
    ] {
        assert_eq!(parse_topic(topic), None, "{topic}");
    }
}

#[test]
fn state_topics_parse() {
    assert_eq!(parse_state_topic("spBv1.0/STATE/scada-1"), Some("scada-1"));
    for topic in [
        "spBv1.0/STATE",
        "spBv1.0/STATE/",
        "spBv1.0/STATE/a/b",
        "spBv1.0/STATE/+",
        "spBv1.0/STATE/#",
        "spBv1.0/state/h",
        "spAv1.0/STATE/h",
        "STATE/h",
        "spBv1.0/G/NBIRTH/E",
    ] {
        assert_eq!(parse_state_topic(topic), None, "{topic}");
    }
}

#[test]
fn state_payloads_parse() {
    let online = parse_state(br#"{"online": true, "timestamp": 1668114759262}"#).unwrap();
    assert_eq!(
        online,
        State {
            online: true,
            timestamp: Some(1_668_114_759_262)
        }
    );
    let offline = parse_state(br#"{"timestamp":5,"online":false,"extra":[1]}"#).unwrap();
    assert_eq!(
        offline,
        State {
            online: false,
            timestamp: Some(5)
        }
    );
    assert_eq!(parse_state(br#"{"online":true}"#).unwrap().timestamp, None);

    let deep = format!(
        r#"{{"online":true,"x":{}{}}}"#,
        "[".repeat(40),
        "]".repeat(40)
    );
    for bad in [
        &br#"{"timestamp": 1}"#[..],
        br#"{"online": "true"}"#,
        br#"{"online": null}"#,
        br#"{"online": true, "timestamp": -1}"#,
        br#"{"online": true, "timestamp": "now"}"#,
        b"ONLINE",
        b"",
        deep.as_bytes(),
    ] {
        let err = parse_state(bad).unwrap_err();
        assert!(matches!(err, SparkplugError::State(_)), "{bad:?}");
        assert!(
            err.to_string().starts_with("bad Sparkplug STATE payload: "),
            "{err}"
        );
    }
}

/// A payload encoded by hand from the protobuf wire format (an encoder
/// independent of the structs): a key is `field << 3 | wire type`, a
/// varint is little-endian 7-bit groups, the high bit meaning "more".
#[test]
fn a_payload_assembled_from_the_wire_format_is_read() {
    #[rustfmt::skip]
    let wire: &[u8] = &[
        0x08,       // field 1 (timestamp), wire type 0 (varint)
        0xde,       // 94 | more
        0xfc,       // 124 << 7 | more
        0x8c,       // 12 << 14 | more
        0x9b,       // 27 << 21 | more
        0xc6,       // 70 << 28 | more
        0x30,       // 48 << 35: 1668114759262 in all
        0x12,       // field 2 (metrics), wire type 2 (length-delimited)
        0x11,       // 17 bytes of Metric follow
        0x0a,       //   field 1 (name), wire type 2
        0x04,       //   4 bytes
        b't', b'e', b'm', b'p',
        0x20,       //   field 4 (datatype), wire type 0
        0x0a,       //   10 = Double
        0x69,       //   field 13 (double_value), wire type 1 (64-bit)
        0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x35, 0x40, // 21.5, little-endian
        0x18,       // field 3 (seq), wire type 0
        0x07,       // 7
    ];
    assert_eq!(
        94 + (124 << 7) + (12 << 14) + (27 << 21) + (70u64 << 28) + (48u64 << 35),
        1_668_114_759_262
    );
    assert_eq!(
        summarise(wire).unwrap(),
        Summary {
            seq: Some(7),
            timestamp: Some(1_668_114_759_262),
            bd_seq: None,
            metrics: 1,
        }
    );
    let payload = decode(wire).unwrap();
    let metric = &payload.metrics[0];
    assert_eq!(metric.name.as_deref(), Some("temp"));
    assert_eq!(metric.datatype, Some(DataType::Double as u32));
    assert_eq!(metric.value, Some(metric::Value::DoubleValue(21.5)));
    // And the structs write the same bytes, in field order.
    assert_eq!(encode_example(7, None, &[("temp", 21.5)]), wire);
}

#[test]
fn summaries_find_bd_seq_in_births_and_deaths() {
    let birth = encode_example(0, Some(42), &[("a", 1.0), ("b", 2.0)]);
    assert_eq!(
        summarise(&birth).unwrap(),
        Summary {
            seq: Some(0),
            timestamp: Some(EXAMPLE_TIMESTAMP),
            bd_seq: Some(42),
            metrics: 3,
        }
    );
    let death = summarise(&encode_death_example(42)).unwrap();
    assert_eq!(
        (death.seq, death.bd_seq, death.metrics),
        (None, Some(42), 1)
    );
    // An Int32 bdSeq (int_value) counts as well.
    let mut payload = decode(&birth).unwrap();
    payload.metrics[0].value = Some(metric::Value::IntValue(9));
    let summary = summarise(&payload.encode_to_vec()).unwrap();
    assert_eq!(summary.bd_seq, Some(9));
    // An empty payload is a valid one.
    assert_eq!(summarise(&[]).unwrap(), Summary::default());
}

#[test]
fn what_is_not_a_payload_is_refused() {
    for bad in [
        &br#"{"online":true}"#[..],
        &[0xff],
        &[0x12, 0x05, 0x0a],
        &[0x0a, 0x01, 0x08],
    ] {
        let err = summarise(bad).unwrap_err();
        assert!(matches!(err, SparkplugError::Decode(_)), "{bad:?}");
        assert!(
            err.to_string().starts_with("not a Sparkplug B payload: "),
            "{err}"
        );
        assert_eq!(mark_historical(bad).unwrap_err(), err);
    }
}

fn ext(wire: &[u8]) -> Extensions {
    Extensions::decode(wire).unwrap()
}

fn named(name: &str, datatype: DataType, value: metric::Value) -> Metric {
    Metric {
        name: Some(name.to_owned()),
        datatype: Some(datatype as u32),
        value: Some(value),
        ..Metric::default()
    }
}

fn property(r#type: DataType, value: property_value::Value) -> PropertyValue {
    PropertyValue {
        r#type: Some(r#type as u32),
        is_null: None,
        value: Some(value),
    }
}

/// Every field of every message, every oneof member, and extensions.
fn everything() -> Payload {
    use data_set::data_set_value::Value as Cell;
    use metric::Value as M;
    use property_value::Value as P;
    use template::parameter::Value as T;

    let cells = [
        Cell::IntValue(1),
        Cell::LongValue(2),
        Cell::FloatValue(3.5),
        Cell::DoubleValue(4.25),
        Cell::BooleanValue(true),
        Cell::StringValue("five".into()),
        Cell::ExtensionValue(ext(&[0x08, 0x06])),
    ];
    let row = |cells: &[Cell]| data_set::Row {
        fields: data_set::RowFields {
            elements: cells
                .iter()
                .map(|c| data_set::DataSetValue {
                    value: Some(c.clone()),
                })
                .collect(),
        },
        extensions: ext(&[0x10, 0x01]),
    };
    let dataset = DataSet {
        fields: DataSetFields {
            num_of_columns: Some(7),
            columns: (1..=7).map(|i| format!("c{i}")).collect(),
            types: vec![7, 8, 9, 10, 11, 12, 0],
            rows: vec![row(&cells), row(&cells[..2])],
        },
        extensions: ext(&[0x2a, 0x01, b'x']),
    };
    let params = [
        T::IntValue(1),
        T::LongValue(2),
        T::FloatValue(3.0),
        T::DoubleValue(4.0),
        T::BooleanValue(false),
        T::StringValue("s".into()),
        T::ExtensionValue(ext(&[])),
    ];
    let template = Template {
        fields: TemplateFields {
            version: Some("1.2".into()),
            metrics: vec![named("inner", DataType::Int16, M::IntValue(16))],
            parameters: params
                .into_iter()
                .enumerate()
                .map(|(i, v)| template::Parameter {
                    name: Some(format!("p{i}")),
                    r#type: Some(i as u32),
                    value: Some(v),
                })
                .collect(),
            template_ref: Some("Motor".into()),
            is_definition: Some(false),
        },
        extensions: ext(&[0x30, 0x01]),
    };
    let inner_set = PropertySet::new(PropertySetFields {
        keys: vec!["k".into()],
        values: vec![property(DataType::Int32, P::IntValue(1))],
    });
    let properties = PropertySet {
        fields: PropertySetFields {
            keys: (0..10).map(|i| format!("p{i}")).collect(),
            values: vec![
                property(DataType::Int32, P::IntValue(1)),
                property(DataType::Int64, P::LongValue(2)),
                property(DataType::Float, P::FloatValue(3.0)),
                property(DataType::Double, P::DoubleValue(4.0)),
                property(DataType::Boolean, P::BooleanValue(true)),
                property(DataType::String, P::StringValue("engUnit".into())),
                property(
                    DataType::PropertySet,
                    P::PropertysetValue(inner_set.clone()),
                ),
                property(
                    DataType::PropertySetList,
                    P::PropertysetsValue(PropertySetList {
                        fields: PropertySetListFields {
                            propertyset: vec![inner_set.clone(), inner_set],
                        },
                        extensions: ext(&[0x10, 0x02]),
                    }),
                ),
                property(DataType::Unknown, P::ExtensionValue(ext(&[0x08, 0x01]))),
                PropertyValue {
                    r#type: Some(12),
                    is_null: Some(true),
                    value: None,
                },
            ],
        },
        extensions: ext(&[0x18, 0x03]),
    };
    let metadata = MetaData {
        fields: MetaDataFields {
            is_multi_part: Some(false),
            content_type: Some("application/octet-stream".into()),
            size: Some(3),
            seq: Some(0),
            file_name: Some("a.bin".into()),
            file_type: Some("bin".into()),
            md5: Some("d41d8cd98f00b204e9800998ecf8427e".into()),
            description: Some("three bytes".into()),
        },
        extensions: ext(&[0x48, 0x01]),
    };
    let mut bytes = named("bytes", DataType::Bytes, M::BytesValue(vec![0, 1, 255]));
    bytes.metadata = Some(metadata);
    let mut double = named("double", DataType::Double, M::DoubleValue(-0.5));
    double.properties = Some(properties);
    double.alias = Some(12);
    double.timestamp = Some(99);
    double.is_transient = Some(true);
    double.is_historical = Some(false);
    let null = Metric {
        alias: Some(13),
        datatype: Some(DataType::Int32 as u32),
        is_null: Some(true),
        ..Metric::default()
    };
    Payload {
        fields: PayloadFields {
            timestamp: Some(EXAMPLE_TIMESTAMP),
            metrics: vec![
                named(BD_SEQ, DataType::Int64, M::LongValue(3)),
                named("int", DataType::Int32, M::IntValue(u32::MAX)),
                named("long", DataType::UInt64, M::LongValue(u64::MAX)),
                named("float", DataType::Float, M::FloatValue(1.25)),
                double,
                named("bool", DataType::Boolean, M::BooleanValue(true)),
                named("string", DataType::String, M::StringValue("héllo".into())),
                bytes,
                named("dataset", DataType::DataSet, M::DatasetValue(dataset)),
                named("template", DataType::Template, M::TemplateValue(template)),
                named(
                    "ext",
                    DataType::Unknown,
                    M::ExtensionValue(ext(&[0x08, 0x07])),
                ),
                null,
            ],
            seq: Some(0),
            uuid: Some("a0c8f6f2".into()),
            body: Some(b"raw".to_vec()),
        },
        extensions: ext(&[0x30, 0x2a, 0x3a, 0x02, b'o', b'k']),
    }
}

#[test]
fn every_datatype_family_round_trips() {
    let payload = everything();
    let wire = payload.encode_to_vec();
    assert_eq!(wire.len(), payload.encoded_len());
    let decoded = decode(&wire).unwrap();
    assert_eq!(decoded, payload);
    assert_eq!(decoded.encode_to_vec(), wire);
    assert_eq!(summarise(&wire).unwrap().bd_seq, Some(3));
}

#[test]
fn repeated_scalars_are_written_unpacked_as_proto2_does() {
    let dataset = DataSet::new(DataSetFields {
        types: vec![9, 10],
        ..DataSetFields::default()
    });
    // field 3, varint, twice; not one length-delimited field.
    assert_eq!(dataset.encode_to_vec(), [0x18, 9, 0x18, 10]);
    // A packed encoding (as proto3 writers send) reads the same.
    assert_eq!(DataSet::decode(&[0x1a, 0x02, 9, 10][..]).unwrap(), dataset);
}

#[test]
fn mark_historical_marks_every_metric_and_keeps_everything_else() {
    let original = everything();
    let marked = mark_historical(&original.encode_to_vec()).unwrap();
    let mut marked = decode(&marked).unwrap();
    assert!(marked.metrics.iter().all(|m| m.is_historical == Some(true)));
    // A template's own metrics are left as they were.
    let Some(metric::Value::TemplateValue(template)) = &marked.metrics[9].value else {
        panic!("no template");
    };
    assert_eq!(template.metrics[0].is_historical, None);

    let mut original = original;
    for metric in original.metrics.iter_mut().chain(marked.metrics.iter_mut()) {
        metric.is_historical = None;
    }
    assert_eq!(marked, original);
}

#[test]
fn mark_historical_of_an_example_payload() {
    let marked = mark_historical(&encode_example(5, Some(1), &[("t", 20.0)])).unwrap();
    let payload = decode(&marked).unwrap();
    assert_eq!(payload.seq, Some(5));
    assert_eq!(payload.metrics.len(), 2);
    assert!(payload
        .metrics
        .iter()
        .all(|m| m.is_historical == Some(true)));
    assert_eq!(summarise(&marked).unwrap().bd_seq, Some(1));
}
