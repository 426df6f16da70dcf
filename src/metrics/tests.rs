use super::*;

fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

#[test]
fn counters_move_and_render_with_their_labels() {
    let before = render();
    let had = |s: &str| {
        before
            .lines()
            .find_map(|l| l.strip_prefix(s)?.strip_prefix(' ')?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let up = had("ferry_messages_received_total{direction=\"up\"}");
    let rate = had("ferry_messages_rejected_total{direction=\"up\",reason=\"rate\"}");
    received(Direction::Up);
    received(Direction::Up);
    rejected(Direction::Up, RejectCode::Rate);
    let after = render();
    // At least: other tests in this process may count too.
    assert!(value(&after, "ferry_messages_received_total{direction=\"up\"}") >= up + 2.0);
    assert!(
        value(
            &after,
            "ferry_messages_rejected_total{direction=\"up\",reason=\"rate\"}"
        ) >= rate + 1.0
    );
    assert!(
        after.contains("# TYPE ferry_devices_refused counter"),
        "{after}"
    );
    assert!(after.ends_with("# EOF\n"));
}

#[test]
fn histograms_count_what_they_observe() {
    let series = "ferry_delivery_seconds_count{direction=\"down\"}";
    let before = render()
        .lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(0.0);
    let bucket = |text: &str, le: &str| {
        value(
            text,
            &format!("ferry_delivery_seconds_bucket{{le=\"{le}\",direction=\"down\"}}"),
        )
    };
    let before_text = render();
    let under_5 = bucket(&before_text, "5.0");
    delivery_took(Direction::Down, 1_500);
    let after = render();
    // At least: other tests in this process may observe too.
    assert!(value(&after, series) >= before + 1.0);
    // 1.5 s falls in the (cumulative) 5 s bucket.
    assert!(bucket(&after, "5.0") >= under_5 + 1.0);
}

/// `render`'s lines without their values: descriptors (`# HELP`, `# TYPE`)
/// in order, then every series sorted (a family's series come in no fixed
/// order).
fn shape(text: &str) -> (Vec<String>, Vec<String>) {
    let (mut descriptors, mut series) = (Vec::new(), Vec::new());
    for line in text.lines().filter(|l| *l != "# EOF") {
        if line.starts_with('#') {
            descriptors.push(line.to_string());
        } else {
            let key = line.rsplit_once(' ').map_or(line, |(key, _)| key);
            series.push(key.to_string());
        }
    }
    series.sort();
    (descriptors, series)
}

/// Every metric's name, HELP text, type and series as dashboards and
/// alerts know them (exposition.txt, taken from the exposition before the
/// counters moved into the registry): none renamed, none lost, none added
/// without this file saying so.
#[test]
fn the_exposition_keeps_every_name_help_type_and_label() {
    assert_eq!(shape(&render()), shape(include_str!("exposition.txt")));
}
