//! Known transition sequences give exact figures: ranges that start mid-incident, an endpoint
//! first seen inside the range, maintenance, weight-0 degradation, pool panic, clipped buckets.

use vitals_contracts::view::StateName;
use vitals_contracts::{HealthState as S, Micros};
use vitals_uptime::{
    endpoint, pool, uptime, uptime_without_endpoint_buckets, worst_first, Change, History, PoolFlags, Range,
};

const T0: Micros = 1_767_225_600_000_000; // 2026-01-01T00:00:00Z
const MIN: Micros = 60_000_000;
const HOUR: Micros = 60 * MIN;

fn change(at: Micros, seq: i64, from: S, to: S, weight: f64, code: &str) -> Change {
    Change {
        at,
        seq,
        from,
        to,
        weight,
        code: code.into(),
        calls: 100,
    }
}

/// An endpoint known since an hour before the range, with `changes`.
fn seen_an_hour_before(endpoint: &str, changes: Vec<Change>) -> History {
    History {
        requests: Vec::new(),
        endpoint: endpoint.into(),
        seen: T0 - HOUR,
        changes,
    }
}

fn hour() -> Range {
    Range {
        from: T0,
        to: T0 + HOUR,
        bucket: None,
    }
}

/// Out since before the range: the incident is listed whole, with its true start and first sign.
fn mid_incident() -> History {
    History {
        requests: Vec::new(),
        endpoint: "a".into(),
        seen: T0 - HOUR,
        changes: vec![
            change(T0 - 30 * MIN, 1, S::Healthy, S::Suspect, 1.0, "suspect"),
            change(T0 - 20 * MIN, 2, S::Suspect, S::Unhealthy, 0.0, "ejected"),
            change(T0 + 10 * MIN, 3, S::Unhealthy, S::Recovering, 0.1, "readmitted"),
            change(T0 + 40 * MIN, 4, S::Recovering, S::Healthy, 1.0, "recovered"),
        ],
    }
}

#[test]
fn a_range_that_starts_mid_incident_counts_from_its_start_and_lists_the_incident_whole() {
    let h = mid_incident();
    let e = endpoint(&h, &hour());
    assert_eq!((e.observed_s, e.available_s, e.maintenance_s), (3600.0, 3000.0, 0.0));
    assert_eq!(e.availability, Some(3000.0 / 3600.0));
    assert_eq!(e.state_s["unhealthy"], 600.0);
    assert_eq!(e.state_s["recovering"], 1800.0);
    assert_eq!(e.state_s["healthy"], 1200.0);
    assert!(!e.state_s.contains_key("suspect"), "before the range");
    assert_eq!(e.incidents, 1);
    assert_eq!(e.calls, 200, "the evidence of the two transitions inside the range");
    let spans = h.incidents(&hour());
    let i = spans[0].view("p", "a", T0 + HOUR);
    assert_eq!(i.seq, 2);
    assert_eq!(i.started_at.timestamp_micros(), T0 - 20 * MIN);
    assert_eq!(i.first_sign_at.timestamp_micros(), T0 - 30 * MIN);
    assert_eq!(
        (i.time_to_out_s, i.time_to_back_s, i.duration_s),
        (600.0, Some(1800.0), 1800.0)
    );
    assert_eq!(i.reason_codes, ["ejected", "readmitted"]);
    assert_eq!((i.ongoing, i.ended_in), (false, Some(StateName::Recovering)));

    // A range after it ended holds no incident; one that ends while it lasts holds it ongoing.
    let later = Range {
        from: T0 + 20 * MIN,
        ..hour()
    };
    assert!(h.incidents(&later).is_empty());
    let during = Range {
        from: T0 - 25 * MIN,
        to: T0,
        bucket: None,
    };
    let spans = h.incidents(&during);
    let i = spans[0].view("p", "a", T0);
    assert_eq!((i.ongoing, i.duration_s, i.time_to_back_s), (true, 1200.0, None));
    let e = endpoint(&h, &during);
    assert_eq!(
        (e.observed_s, e.available_s),
        (1500.0, 300.0),
        "suspect 5 min in rotation, then out"
    );
}

#[test]
fn an_endpoint_first_seen_inside_the_range_counts_from_then() {
    let h = History {
        requests: Vec::new(),
        endpoint: "new".into(),
        seen: T0 + 30 * MIN,
        changes: vec![],
    };
    let e = endpoint(&h, &hour());
    assert_eq!(
        (e.observed_s, e.available_s, e.availability),
        (1800.0, 1800.0, Some(1.0))
    );
    let never = History {
        requests: Vec::new(),
        seen: T0 + 2 * HOUR,
        ..h
    };
    let e = endpoint(&never, &hour());
    assert_eq!((e.observed_s, e.availability), (0.0, None));
}

#[test]
fn maintenance_is_left_out_of_availability_and_is_no_incident() {
    let h = History {
        requests: Vec::new(),
        endpoint: "m".into(),
        seen: T0 - HOUR,
        changes: vec![
            change(T0 + 10 * MIN, 1, S::Healthy, S::Maintenance, 0.0, "maintenance_on"),
            change(T0 + 20 * MIN, 2, S::Maintenance, S::Recovering, 0.1, "override_cleared"),
            change(T0 + 50 * MIN, 3, S::Recovering, S::Healthy, 1.0, "recovered"),
        ],
    };
    let e = endpoint(&h, &hour());
    assert_eq!((e.observed_s, e.available_s, e.maintenance_s), (3600.0, 3000.0, 600.0));
    assert_eq!((e.availability, e.incidents), (Some(1.0), 0));
}

#[test]
fn degraded_at_weight_zero_is_out_and_at_a_quarter_is_in_rotation() {
    let h = History {
        requests: Vec::new(),
        endpoint: "d".into(),
        seen: T0 - HOUR,
        changes: vec![
            change(T0 + 10 * MIN, 1, S::Healthy, S::Degraded, 0.25, "degraded"),
            change(T0 + 20 * MIN, 2, S::Degraded, S::Degraded, 0.0, "degraded"),
            change(T0 + 30 * MIN, 3, S::Degraded, S::Healthy, 1.0, "recovered"),
        ],
    };
    let e = endpoint(&h, &hour());
    assert_eq!(e.available_s, 3000.0);
    let spans = h.incidents(&hour());
    assert_eq!(spans.len(), 1);
    let i = spans[0].view("p", "d", T0 + HOUR);
    assert_eq!(
        (i.time_to_out_s, i.time_to_back_s),
        (600.0, Some(600.0)),
        "first sign: the first degradation"
    );
}

#[test]
fn a_pool_counts_time_with_one_and_with_every_endpoint_in_rotation_and_its_panic() {
    let out = |name: &str, from: Micros, to: Micros| History {
        requests: Vec::new(),
        endpoint: name.into(),
        seen: T0 - HOUR,
        changes: vec![
            change(T0 + from * MIN, 1, S::Healthy, S::Unhealthy, 0.0, "ejected"),
            change(T0 + to * MIN, 2, S::Unhealthy, S::Recovering, 0.1, "readmitted"),
        ],
    };
    let hs = [out("a", 10, 20), out("b", 15, 25)];
    let flags = PoolFlags {
        initial: (false, false),
        changes: vec![(T0 + 15 * MIN, true, true), (T0 + 20 * MIN, false, false)],
    };
    let f = pool(&hs, &flags, &hour());
    assert_eq!(f.observed_s, 3600.0);
    assert_eq!(f.any_available_s, 3300.0, "both out from :15 to :20");
    assert_eq!(f.all_available_s, 2700.0, "one or both out from :10 to :25");
    assert_eq!((f.panic_s, f.correlated_outage_s), (300.0, 300.0));
    assert_eq!(f.incidents, 2);
    let w = f.traffic_weighted_availability.unwrap();
    assert!((w - 3000.0 / 3600.0).abs() < 1e-12, "both weigh the same: {w}");
    // Both in maintenance for a while: neither available nor out.
    let maint = |name: &str| History {
        requests: Vec::new(),
        endpoint: name.into(),
        seen: T0 - HOUR,
        changes: vec![change(
            T0 + 30 * MIN,
            1,
            S::Healthy,
            S::Maintenance,
            0.0,
            "maintenance_on",
        )],
    };
    let f = pool(&[maint("a"), maint("b")], &PoolFlags::default(), &hour());
    assert_eq!((f.maintenance_s, f.availability), (1800.0, Some(1.0)));
}

/// What a page of uptime is chosen from: the same figures as the whole answer, the endpoints'
/// without their buckets (which the API adds for the page's endpoints only).
#[test]
fn the_figures_a_page_is_chosen_from_are_the_whole_answers_less_the_endpoints_buckets() {
    let out = |name: &str, from: Micros, to: Micros| History {
        requests: Vec::new(),
        endpoint: name.into(),
        seen: T0 - HOUR,
        changes: vec![
            change(T0 + from * MIN, 1, S::Healthy, S::Unhealthy, 0.0, "ejected"),
            change(T0 + to * MIN, 2, S::Unhealthy, S::Recovering, 0.1, "readmitted"),
        ],
    };
    let hs = [out("a", 10, 20), out("b", 15, 45), out("c", 1, 2)];
    let flags = PoolFlags::default();
    let r = Range {
        bucket: Some(10 * MIN),
        ..hour()
    };
    let (whole, mut endpoints) = uptime(&hs, &flags, &r);
    let (paged, plain) = uptime_without_endpoint_buckets(&hs, &flags, &r);
    assert_eq!(paged, whole, "the pool's figures, buckets and all");
    assert_eq!(whole.buckets.len(), 6);
    assert!(plain.iter().all(|e| e.buckets.is_empty()));
    endpoints.iter_mut().for_each(|e| e.buckets.clear());
    assert_eq!(plain, endpoints, "the same endpoints in the same (worst-first) order");
    assert_eq!(plain[0].endpoint, "b");
    let b = hs.iter().find(|h| h.endpoint == "b").unwrap();
    assert_eq!(endpoint(b, &r).buckets.len(), 6, "a page endpoint's buckets");
}

#[test]
fn buckets_align_to_hours_and_clip_to_the_range() {
    let h = History {
        requests: Vec::new(),
        endpoint: "b".into(),
        seen: T0 - HOUR,
        changes: vec![
            change(T0 + 50 * MIN, 1, S::Healthy, S::Unhealthy, 0.0, "ejected"),
            change(T0 + 70 * MIN, 2, S::Unhealthy, S::Recovering, 0.1, "readmitted"),
        ],
    };
    let r = Range {
        from: T0 + 30 * MIN,
        to: T0 + 2 * HOUR + 15 * MIN,
        bucket: Some(HOUR),
    };
    let e = endpoint(&h, &r);
    let b: Vec<(f64, f64)> = e.buckets.iter().map(|b| (b.observed_s, b.available_s)).collect();
    assert_eq!(b, [(1800.0, 1200.0), (3600.0, 3000.0), (900.0, 900.0)]);
    assert_eq!(e.buckets[0].start.timestamp_micros(), T0 + 30 * MIN);
    assert_eq!(e.buckets[1].start.timestamp_micros(), T0 + HOUR);
    // A 10-second ejection inside a day is still 10 seconds of its hour.
    let blip = History {
        requests: Vec::new(),
        endpoint: "blip".into(),
        seen: T0 - HOUR,
        changes: vec![
            change(T0 + 5 * HOUR, 1, S::Healthy, S::Unhealthy, 0.0, "ejected"),
            change(
                T0 + 5 * HOUR + 10_000_000,
                2,
                S::Unhealthy,
                S::Recovering,
                0.1,
                "readmitted",
            ),
        ],
    };
    let day = Range {
        from: T0,
        to: T0 + 24 * HOUR,
        bucket: Some(HOUR),
    };
    let e = endpoint(&blip, &day);
    assert_eq!(e.buckets.len(), 24);
    assert_eq!(e.buckets[5].available_s, 3590.0);
    assert_eq!(e.incidents, 1);
}

#[test]
fn recovering_endpoints_that_fail_again_start_a_new_incident_with_no_time_to_out() {
    let h = History {
        requests: Vec::new(),
        endpoint: "f".into(),
        seen: T0 - HOUR,
        changes: vec![
            change(T0 + 5 * MIN, 1, S::Healthy, S::Unhealthy, 0.0, "ejected"),
            change(T0 + 10 * MIN, 2, S::Unhealthy, S::Recovering, 0.1, "readmitted"),
            change(
                T0 + 12 * MIN,
                3,
                S::Recovering,
                S::Unhealthy,
                0.0,
                "failed_while_recovering",
            ),
        ],
    };
    let spans = h.incidents(&hour());
    assert_eq!(spans.len(), 2);
    let second = spans[1].view("p", "f", T0 + HOUR);
    assert_eq!(
        (second.time_to_out_s, second.ongoing, second.duration_s),
        (0.0, true, 48.0 * 60.0)
    );
    let mut es = vec![endpoint(&h, &hour()), endpoint(&mid_incident(), &hour())];
    worst_first(&mut es);
    assert_eq!(es[0].endpoint, "f");
}

/// Found in testing: maintenance on, off into slow start, out 0.3 s later read "time to out 30.3 s" (the
/// maintenance taken for the first sign). A first sign is a departure from healthy to suspect
/// or degraded that did not return to healthy.
#[test]
fn maintenance_is_no_first_sign_but_a_degradation_before_it_is() {
    let after_maintenance = |before: Vec<Change>| {
        let n = before.len() as i64;
        let mut changes = before;
        changes.extend([
            change(T0 + 10 * MIN, n + 1, S::Healthy, S::Maintenance, 0.0, "maintenance"),
            change(
                T0 + 10 * MIN + 30_000_000,
                n + 2,
                S::Maintenance,
                S::Recovering,
                0.1,
                "maintenance_over",
            ),
            change(
                T0 + 10 * MIN + 30_300_000,
                n + 3,
                S::Recovering,
                S::Unhealthy,
                0.0,
                "failed_while_recovering",
            ),
        ]);
        let spans = seen_an_hour_before("m", changes).incidents(&hour());
        assert_eq!(spans.len(), 1, "{spans:?}");
        spans[0].view("p", "m", T0 + HOUR).time_to_out_s
    };
    assert_eq!(after_maintenance(vec![]), 0.0);
    // Degraded, back to healthy: over, no sign either.
    assert_eq!(
        after_maintenance(vec![
            change(T0 + MIN, 1, S::Healthy, S::Degraded, 0.25, "degraded"),
            change(T0 + 2 * MIN, 2, S::Degraded, S::Healthy, 1.0, "recovered"),
        ]),
        0.0
    );
    // Suspect from 5 minutes before the outage, never healthy since: its first sign.
    let h = seen_an_hour_before(
        "s",
        vec![
            change(T0 + 5 * MIN, 1, S::Healthy, S::Suspect, 1.0, "suspect"),
            change(T0 + 10 * MIN, 2, S::Suspect, S::Unhealthy, 0.0, "ejected"),
        ],
    );
    assert_eq!(h.incidents(&hour())[0].view("p", "s", T0 + HOUR).time_to_out_s, 300.0);
}
