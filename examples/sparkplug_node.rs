//! A Sparkplug B edge node (Sparkplug 3.0) publishing to ferry: NBIRTH
//! with its bdSeq, `--count` NDATA with a temperature metric, then NDEATH
//! before a clean disconnect; its will is the same NDEATH, for a node that
//! drops. Each PUBACK comes after ferry's commit: "stored" below means on
//! the gateway's disk. Payloads are real Sparkplug B protobuf (ferry's
//! codec: prost and Eclipse Tahu's `sparkplug_b.proto`).
//!
//! cargo run --release --example sparkplug_node -- [--host H] [--port P]
//!     [--group G] [--node N] [--count C] [--bd-seq B]
//!
//! The gateway needs `[south.sparkplug] enabled = true`; the node's client
//! id is its edge node id (with logins, also its username).

use std::time::Duration;

use ferry::protocol::sparkplug::{encode_death_example, encode_example};
use rumqttc::{AsyncClient, Event, EventLoop, LastWill, MqttOptions, Outgoing, Packet, QoS};

struct Args {
    host: String,
    port: u16,
    group: String,
    node: String,
    count: u64,
    bd_seq: u64,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        host: "127.0.0.1".into(),
        port: 1883,
        group: "plant1".into(),
        node: "line3-edge".into(),
        count: 3,
        bd_seq: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--host" => a.host = value()?,
            "--port" => a.port = value()?.parse().map_err(|_| "--port: a number")?,
            "--group" => a.group = value()?,
            "--node" => a.node = value()?,
            "--count" => a.count = value()?.parse().map_err(|_| "--count: a number")?,
            "--bd-seq" => a.bd_seq = value()?.parse().map_err(|_| "--bd-seq: a number")?,
            "--help" | "-h" => {
                println!(
                    "sparkplug_node [--host H] [--port P] [--group G] [--node N] [--count C] \
                     [--bd-seq B]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

/// Publishes at QoS 1 and waits for its PUBACK (ferry's commit).
async fn publish(
    client: &AsyncClient,
    events: &mut EventLoop,
    topic: &str,
    payload: Vec<u8>,
) -> Result<(), rumqttc::ConnectionError> {
    client
        .publish(topic, QoS::AtLeastOnce, false, payload)
        .await
        .expect("the event loop is running");
    let mut pkid = None;
    loop {
        match events.poll().await? {
            Event::Outgoing(Outgoing::Publish(id)) => pkid = Some(id),
            Event::Incoming(Packet::PubAck(ack)) if Some(ack.pkid) == pkid => return Ok(()),
            _ => {}
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sparkplug_node: {e}");
            std::process::exit(64);
        }
    };
    let topic = |kind: &str| format!("spBv1.0/{}/{kind}/{}", a.group, a.node);
    let mut opts = MqttOptions::new(&a.node, &a.host, a.port);
    opts.set_keep_alive(Duration::from_secs(30));
    opts.set_last_will(LastWill::new(
        topic("NDEATH"),
        encode_death_example(a.bd_seq),
        QoS::AtLeastOnce,
        false,
    ));
    let (client, mut events) = AsyncClient::new(opts, 16);
    let run = async {
        publish(
            &client,
            &mut events,
            &topic("NBIRTH"),
            encode_example(0, Some(a.bd_seq), &[("temp", 20.0)]),
        )
        .await?;
        println!("NBIRTH seq 0 bdSeq {}: stored", a.bd_seq);
        for seq in 1..=a.count {
            let temp = 20.0 + seq as f64 / 2.0;
            publish(
                &client,
                &mut events,
                &topic("NDATA"),
                encode_example(seq % 256, None, &[("temp", temp)]),
            )
            .await?;
            println!("NDATA seq {} temp {temp}: stored", seq % 256);
        }
        // A clean end says NDEATH itself, then DISCONNECT (the will is
        // for a node that drops).
        publish(
            &client,
            &mut events,
            &topic("NDEATH"),
            encode_death_example(a.bd_seq),
        )
        .await?;
        println!("NDEATH bdSeq {}: stored", a.bd_seq);
        let _ = client.disconnect().await;
        while !matches!(
            events.poll().await,
            Ok(Event::Outgoing(Outgoing::Disconnect)) | Err(_)
        ) {}
        Ok::<(), rumqttc::ConnectionError>(())
    };
    match tokio::time::timeout(Duration::from_secs(30), run).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            eprintln!(
                "sparkplug_node: cannot publish to {}:{}: {e}",
                a.host, a.port
            );
            std::process::exit(1);
        }
        Err(_) => {
            eprintln!("sparkplug_node: no PUBACK within 30 s");
            std::process::exit(1);
        }
    }
}
