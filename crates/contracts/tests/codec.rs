//! Codec tests: round trips, hostile bytes, schema evolution and interop with fastavro.

use apache_avro::{to_avro_datum, types::Value, Schema};
use proptest::prelude::*;
use vitals_contracts::codec::{fingerprint, peek_kind};
use vitals_contracts::*;

fn sample_call() -> CallOutcome {
    CallOutcome {
        event_id: "evt-1".into(),
        pool: "gpt-pool".into(),
        endpoint: "azure-eastus".into(),
        gateway: "gw-7".into(),
        occurred_at: 1_700_000_000_123_456,
        outcome: OutcomeClass::ServerError,
        http_status: Some(503),
        latency_us: 1_234_567,
        ttft_us: Some(250_000),
        tpot_us: None,
        attributes: [("route".to_string(), "/v1/chat".to_string())].into_iter().collect(),
        model: Some("gpt-6".into()),
        retry_after_ms: Some(5_000),
    }
}

fn sample_change() -> HealthChanged {
    HealthChanged {
        transition_id: "gpt-pool/azure-eastus/3".into(),
        pool: "gpt-pool".into(),
        endpoint: "azure-eastus".into(),
        seq: 3,
        from_state: HealthState::Degraded,
        to_state: HealthState::Unhealthy,
        weight: 0.0,
        ramp_ms: 0,
        retry_at: Some(1_700_000_030_000_000),
        reason_code: "ejected".into(),
        reason: "ejected: consecutive_failures>=5".into(),
        evidence: Evidence {
            window_ms: 30_000,
            server_error: 5,
            failure_rate: 1.0,
            score: 0.0,
            ttft_p50_ms: Some(250.0),
            consecutive_failures: 5,
            thresholds: vec!["consecutive_failures>=5".into()],
            late: 0,
            ..Evidence::default()
        },
        policy_version: 2,
        trigger_ids: vec!["a".into(), "b".into()],
        stream_time: 1_700_000_000_000_000,
        scope: None,
    }
}

#[test]
fn every_record_type_round_trips() {
    let call = sample_call();
    assert_eq!(decode::<CallOutcome>(&encode(&call).unwrap()).unwrap(), call);
    let change = sample_change();
    let bytes = encode(&change).unwrap();
    assert_eq!(&bytes[..2], &[0xC3, 0x01]);
    assert_eq!(decode::<HealthChanged>(&bytes).unwrap(), change);
    let state = EndpointState::from_change(&change);
    assert_eq!(decode::<EndpointState>(&encode(&state).unwrap()).unwrap(), state);
    let policy = Signal::Policy(PolicyChange {
        change_id: "pc".into(),
        pool: "p".into(),
        actor: "me".into(),
        issued_at: 1,
        policy: Policy::default(),
    });
    assert_eq!(decode_signal(&encode_signal(&policy).unwrap()).unwrap(), policy);
}

#[test]
fn hostile_bytes_give_typed_errors() {
    let good = encode(&sample_call()).unwrap();
    assert_eq!(decode_signal(&good[..5]).unwrap_err(), CodecError::TooShort(5));
    assert!(matches!(
        decode_signal(b"{\"json\": true}").unwrap_err(),
        CodecError::BadMagic(b'{', b'"')
    ));
    let mut unknown = good.clone();
    unknown[2..10].copy_from_slice(&0xdead_beef_u64.to_le_bytes());
    assert_eq!(
        decode_signal(&unknown).unwrap_err(),
        CodecError::UnknownFingerprint(0xdead_beef)
    );
    for cut in 10..good.len() {
        let e = decode_signal(&good[..cut]).unwrap_err();
        assert_eq!(e.code(), "invalid_body", "cut at {cut}: {e}");
    }
    let mut trailing = good.clone();
    trailing.push(0);
    assert_eq!(decode_signal(&trailing).unwrap_err().code(), "invalid_body");
    let change = encode(&sample_change()).unwrap();
    assert!(matches!(
        decode_signal(&change).unwrap_err(),
        CodecError::WrongSchema { .. }
    ));
    assert_eq!(peek_kind(&change).unwrap(), SchemaKind::HealthChanged);
}

#[test]
fn a_record_written_with_the_older_schema_still_decodes() {
    let v1 = Schema::parse_str(include_str!("../../../schemas/call_outcome.v1.avsc")).unwrap();
    let value = Value::Record(vec![
        ("event_id".into(), Value::String("old-1".into())),
        ("pool".into(), Value::String("p".into())),
        ("endpoint".into(), Value::String("e".into())),
        ("gateway".into(), Value::String("gw-old".into())),
        ("occurred_at".into(), Value::TimestampMicros(1_600_000_000_000_000)),
        ("outcome".into(), Value::Enum(1, "TIMEOUT".into())),
        ("http_status".into(), Value::Union(0, Box::new(Value::Null))),
        ("latency_us".into(), Value::Long(5_000_000)),
        ("ttft_us".into(), Value::Union(0, Box::new(Value::Null))),
        ("tpot_us".into(), Value::Union(0, Box::new(Value::Null))),
        ("attributes".into(), Value::Map(Default::default())),
    ]);
    let mut bytes = vec![0xC3, 0x01];
    bytes.extend_from_slice(&fingerprint(&v1).to_le_bytes());
    bytes.extend(to_avro_datum(&v1, value).unwrap());
    let (_, current_fp) = codec::current_schema(SchemaKind::CallOutcome);
    assert_ne!(fingerprint(&v1), current_fp, "v1 and v2 are different schemas");
    let Signal::Call(c) = decode_signal(&bytes).unwrap() else {
        panic!("not a call")
    };
    assert_eq!(
        (c.event_id.as_str(), c.outcome, c.model),
        ("old-1", OutcomeClass::Timeout, None)
    );
}

/// Interop with fastavro, an independent Avro implementation (python3 with fastavro, which
/// scripts/install-deps.sh installs): the `stack` feature, which `scripts/test.sh` turns on.
#[cfg(feature = "stack")]
mod fastavro {
    use super::*;
    use std::path::PathBuf;
    use std::process::Command;

    fn interop_script() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/interop/fastavro_interop.py")
    }

    fn schema_path(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../schemas")
            .join(name)
    }

    fn python(args: &[&std::ffi::OsStr]) -> String {
        let out = Command::new("python3")
            .arg(interop_script())
            .args(args)
            .output()
            .expect("python3 runs");
        assert!(
            out.status.success(),
            "fastavro peer failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn decodes_what_fastavro_writes() {
        let dir = std::env::temp_dir().join(format!("vitals-interop-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("probe.bin");
        let record = serde_json::json!({
            "probe_id": "pr-9", "pool": "p", "endpoint": "e", "prober": "py",
            "occurred_at": 1_700_000_000_000_001i64, "kind": "SYNTHETIC_COMPLETION", "outcome": "RATE_LIMITED",
            "latency_us": 42, "ttft_us": 7, "http_status": 429, "interval_ms": null,
            "dependencies": [{"name": "redis", "critical": false, "status": "DOWN"}], "detail": "from fastavro"
        });
        python(&[
            "write".as_ref(),
            schema_path("probe_result.avsc").as_os_str(),
            record.to_string().as_ref(),
            file.as_os_str(),
        ]);
        let Signal::Probe(p) = decode_signal(&std::fs::read(&file).unwrap()).unwrap() else {
            panic!("not a probe")
        };
        assert_eq!(p.probe_id, "pr-9");
        assert_eq!(
            (p.kind, p.outcome, p.http_status, p.ttft_us),
            (
                ProbeKind::SyntheticCompletion,
                OutcomeClass::RateLimited,
                Some(429),
                Some(7)
            )
        );
        assert_eq!(p.dependencies[0].status, DependencyStatus::Down);
        assert_eq!(p.detail, "from fastavro");
    }

    /// Both directions of the scope field: a consumer built before scopes (the version 1
    /// schema) reads every fleet transition, and one built after reads the scope.
    #[test]
    fn a_consumer_of_either_version_reads_fleet_transitions_and_only_a_new_one_scoped_ones() {
        let dir = std::env::temp_dir().join(format!("vitals-interop-s-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fleet = dir.join("fleet.bin");
        std::fs::write(&fleet, encode(&sample_change()).unwrap()).unwrap();
        let json = python(&[
            "read".as_ref(),
            schema_path("health_changed.v1.avsc").as_os_str(),
            fleet.as_os_str(),
        ]);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            v["transition_id"], "gpt-pool/azure-eastus/3",
            "an old consumer reads a fleet change"
        );
        assert!(v.get("scope").is_none());
        let scoped = dir.join("scoped.bin");
        let change = HealthChanged {
            scope: Some("gateway=g1".into()),
            ..sample_change()
        };
        std::fs::write(&scoped, encode(&change).unwrap()).unwrap();
        let json = python(&[
            "read".as_ref(),
            schema_path("health_changed.avsc").as_os_str(),
            scoped.as_os_str(),
        ]);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["scope"], "gateway=g1");
        // What fastavro writes in version 1 (an old processor) decodes with no scope.
        let old = dir.join("old.bin");
        let record = serde_json::json!({
            "transition_id": "p/e/1", "pool": "p", "endpoint": "e", "seq": 1,
            "from_state": "HEALTHY", "to_state": "UNHEALTHY", "weight": 0.0, "ramp_ms": 0,
            "retry_at": null, "reason_code": "ejected", "reason": "old", "evidence": {
                "window_ms": 30000, "success": 0, "timeout": 0, "connect_error": 5,
                "connection_dropped": 0, "rate_limited": 0, "server_error": 0, "client_error": 0,
                "invalid_response": 0, "cancelled": 0, "failure_rate": 1.0, "score": 10.0,
                "consecutive_failures": 5, "consecutive_successes": 0,
                "consecutive_hard_failures": 0, "isolations": 1, "thresholds": []},
            "policy_version": 0, "trigger_ids": [], "stream_time": 1
        });
        python(&[
            "write".as_ref(),
            schema_path("health_changed.v1.avsc").as_os_str(),
            record.to_string().as_ref(),
            old.as_os_str(),
        ]);
        let h: HealthChanged = decode(&std::fs::read(&old).unwrap()).unwrap();
        assert_eq!((h.reason.as_str(), h.scope), ("old", None));
    }

    /// Both directions of the summary's `reporters`: a consumer built before merged summaries
    /// (version 1) reads a gateway's summary, one built after reads a merged one's reporters,
    /// and a summary fastavro writes in version 1 decodes with none.
    #[test]
    fn a_consumer_of_either_version_reads_gateway_summaries_and_a_new_one_merged_reporters() {
        let dir = std::env::temp_dir().join(format!("vitals-interop-m-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = CallOutcome::new("c", "p", "e", "g1", 5, OutcomeClass::Success);
        let mut own = CallSummary::new("s-1".into(), "p", "e", "g1", 5);
        own.add_times(&ok, 3);
        let file = dir.join("own.bin");
        std::fs::write(&file, encode(&own).unwrap()).unwrap();
        let json = python(&[
            "read".as_ref(),
            schema_path("call_summary.v1.avsc").as_os_str(),
            file.as_os_str(),
        ]);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            (v["gateway"].as_str(), v["calls"]["success"].as_i64()),
            (Some("g1"), Some(3))
        );
        let merged = CallSummary {
            gateway: "merger".into(),
            reporters: Some(vec![ReporterCounts {
                scopes: vec!["gateway=g1".into(), "location=eu".into()],
                calls: 3,
                failures: 0,
                trailing_failures: 0,
            }]),
            ..own.clone()
        };
        let file = dir.join("merged.bin");
        std::fs::write(&file, encode(&merged).unwrap()).unwrap();
        let json = python(&[
            "read".as_ref(),
            schema_path("call_summary.avsc").as_os_str(),
            file.as_os_str(),
        ]);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            v["reporters"][0]["scopes"],
            serde_json::json!(["gateway=g1", "location=eu"])
        );
        assert_eq!(v["reporters"][0]["calls"], 3);
        let record = serde_json::to_value(&own).unwrap();
        let old = dir.join("old.bin");
        python(&[
            "write".as_ref(),
            schema_path("call_summary.v1.avsc").as_os_str(),
            record.to_string().as_ref(),
            old.as_os_str(),
        ]);
        assert_eq!(
            decode_signal(&std::fs::read(&old).unwrap()).unwrap(),
            Signal::Summary(own)
        );
    }

    #[test]
    fn fastavro_reads_what_we_write() {
        let dir = std::env::temp_dir().join(format!("vitals-interop-w-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("change.bin");
        std::fs::write(&file, encode(&sample_change()).unwrap()).unwrap();
        // A fleet transition is written in version 1 (see the test above).
        let json = python(&[
            "read".as_ref(),
            schema_path("health_changed.v1.avsc").as_os_str(),
            file.as_os_str(),
        ]);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["transition_id"], "gpt-pool/azure-eastus/3");
        assert_eq!(v["to_state"], "UNHEALTHY");
        assert_eq!(v["evidence"]["consecutive_failures"], 5);
        assert_eq!(v["trigger_ids"], serde_json::json!(["a", "b"]));

        let file = dir.join("call.bin");
        std::fs::write(&file, encode(&sample_call()).unwrap()).unwrap();
        let json = python(&[
            "read".as_ref(),
            schema_path("call_outcome.avsc").as_os_str(),
            file.as_os_str(),
        ]);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["outcome"], "SERVER_ERROR");
        assert_eq!(v["http_status"], 503);
        assert_eq!(v["ttft_us"], 250_000);
        assert_eq!(v["model"], "gpt-6");
        assert_eq!(v["attributes"]["route"], "/v1/chat");
    }
}

fn outcome() -> impl Strategy<Value = OutcomeClass> {
    (0..9usize).prop_map(|i| OutcomeClass::ALL[i])
}

proptest! {
    #[test]
    fn call_outcomes_round_trip(
        id in "[a-z0-9-]{1,20}", pool in "\\PC{1,12}", ep in "\\PC{1,12}",
        at in 0i64..i64::MAX / 2, oc in outcome(), status in proptest::option::of(100i32..600),
        lat in 0i64..3_600_000_000, ttft in proptest::option::of(0i64..1_000_000_000),
        attrs in proptest::collection::btree_map("[a-z]{1,5}", "\\PC{0,8}", 0..4),
    ) {
        let c = CallOutcome { event_id: id, pool, endpoint: ep, gateway: "g".into(), occurred_at: at, outcome: oc,
            http_status: status, latency_us: lat, ttft_us: ttft, tpot_us: None, attributes: attrs, model: None, retry_after_ms: None };
        prop_assert_eq!(decode_signal(&encode(&c).unwrap()).unwrap(), Signal::Call(c));
    }

    #[test]
    fn health_changes_round_trip(seq in 1i64..i64::MAX, w in 0.0f64..1.0, score in 0.0f64..100.0, reason in "\\PC{0,40}") {
        let mut h = sample_change();
        h.seq = seq;
        h.weight = w;
        h.evidence.score = score;
        h.reason = reason;
        prop_assert_eq!(decode::<HealthChanged>(&encode(&h).unwrap()).unwrap(), h);
    }

    #[test]
    fn the_fast_decoders_equal_the_generic_path(
        id in "\\PC{1,12}", at in 0i64..i64::MAX / 2, oc in outcome(), status in proptest::option::of(any::<i32>()),
        lat in any::<i64>(), ttft in proptest::option::of(any::<i64>()), tpot in proptest::option::of(any::<i64>()),
        attrs in proptest::collection::btree_map("\\PC{0,5}", "\\PC{0,8}", 0..5),
        model in proptest::option::of("\\PC{0,10}"), interval in proptest::option::of(any::<i64>()), retry in proptest::option::of(any::<i64>()),
        deps in proptest::collection::vec(("\\PC{1,6}", any::<bool>(), 0..3usize), 0..4), detail in "\\PC{0,20}",
    ) {
        let models: Vec<String> = attrs.keys().cloned().collect();
        let call = Signal::Call(CallOutcome { event_id: id.clone(), pool: "p".into(), endpoint: "e".into(), gateway: "g".into(),
            occurred_at: at, outcome: oc, http_status: status, latency_us: lat, ttft_us: ttft, tpot_us: tpot,
            attributes: attrs, model, retry_after_ms: retry });
        let statuses = [DependencyStatus::Up, DependencyStatus::Degraded, DependencyStatus::Down];
        let probe = Signal::Probe(ProbeResult { probe_id: id.clone(), pool: "p".into(), endpoint: "e".into(),
            prober: "pr".into(), occurred_at: at, kind: ProbeKind::SyntheticCompletion, outcome: oc, latency_us: lat,
            ttft_us: ttft, http_status: status, interval_ms: interval,
            dependencies: deps.into_iter().map(|(name, critical, s)| DependencyReport { name, critical, status: statuses[s] }).collect(),
            detail });
        let mut sum = CallSummary::new(id.clone(), "p", "e", "g", at);
        sum.calls.success = lat;
        sum.calls.cancelled = at;
        for (i, v) in [lat, at, 7, 1_000_000].into_iter().enumerate() {
            sum.latency.record(v.rem_euclid(1 << 40));
            sum.ttft.record_times(v.rem_euclid(1 << 30), i as i64 + 1);
        }
        sum.leading_failures = status.unwrap_or(-3);
        sum.trailing_rate_limited = 5;
        sum.max_retry_after_ms = retry;
        sum.models = models.clone();
        // A merged summary lists reporters (version 2); a gateway's does not (version 1).
        let merged = CallSummary {
            reporters: Some(models.iter().map(|m| ReporterCounts {
                scopes: vec![format!("gateway={m}"), "location=eu".into()],
                calls: lat,
                failures: at,
                trailing_failures: status.map_or(0, i64::from),
            }).collect()),
            ..sum.clone()
        };
        let tick = Signal::Tick(Tick { ticker: id, emitted_at: at });
        for s in [call, probe, tick, Signal::Summary(sum), Signal::Summary(merged)] {
            let bytes = encode_signal(&s).unwrap();
            // The hand-written encoders write what apache-avro writes, byte for byte.
            prop_assert_eq!(&bytes, &encode_signal_generic(&s));
            prop_assert_eq!(decode_signal(&bytes).unwrap(), s.clone());
            prop_assert_eq!(codec::decode_signal_generic(&bytes).unwrap(), s);
        }
    }

    #[test]
    fn the_fast_encoders_write_what_apache_avro_writes(
        seq in any::<i64>(), from in 0..6usize, to in 0..6usize, w in any::<f64>(), ramp in any::<i64>(),
        retry in proptest::option::of(any::<i64>()), text in "\\PC{0,30}", counts in proptest::collection::vec(any::<i64>(), 10),
        ratios in proptest::collection::vec(proptest::option::of(any::<f64>()), 4), ints in proptest::collection::vec(any::<i32>(), 6),
        names in proptest::collection::vec("\\PC{0,8}", 0..4), flags in any::<(bool, bool)>(),
    ) {
        let e = Evidence { window_ms: counts[0], success: counts[1], timeout: counts[2], connect_error: counts[3],
            connection_dropped: counts[4], rate_limited: counts[5], server_error: counts[6], client_error: counts[7],
            invalid_response: counts[8], cancelled: counts[9], failure_rate: w, score: -w,
            ttft_p50_ms: ratios[0], ttft_p99_ms: ratios[1], latency_ewma_ms: ratios[2], pool_latency_median_ms: ratios[3],
            consecutive_failures: ints[0], consecutive_successes: ints[1], consecutive_hard_failures: ints[2],
            isolations: ints[3], thresholds: names.clone(), late: 0 };
        let h = HealthChanged { transition_id: text.clone(), pool: "p".into(), endpoint: text.clone(), seq,
            from_state: HealthState::ALL[from], to_state: HealthState::ALL[to], weight: w, ramp_ms: ramp, retry_at: retry,
            reason_code: "rc".into(), reason: text.clone(), evidence: e, policy_version: ints[4], trigger_ids: names,
            stream_time: ramp,
                scope: None,
            };
        let s = EndpointState { pool: text.clone(), endpoint: "e".into(), seq, state: HealthState::ALL[to], weight: w,
            ramp_ms: ramp, score: -w, failure_rate: w, since: seq, reason: text.clone(), policy_version: ints[5] };
        let p = PoolHealthChanged { pool: text.clone(), seq, endpoints: ints[0], healthy: ints[1], ejected: ints[2],
            healthy_fraction: w, panic: flags.0, correlated_outage: flags.1, reason: text, policy_version: ints[3],
            stream_time: ramp,
                faulty_reporters: vec![],
            };
        prop_assert_eq!(encode(&h).unwrap(), codec::encode_generic(&h).unwrap());
        prop_assert_eq!(encode(&s).unwrap(), codec::encode_generic(&s).unwrap());
        prop_assert_eq!(encode(&p).unwrap(), codec::encode_generic(&p).unwrap());
        if !w.is_nan() && ratios.iter().flatten().all(|r| !r.is_nan()) {
            prop_assert_eq!(decode::<HealthChanged>(&encode(&h).unwrap()).unwrap(), h);
            prop_assert_eq!(decode::<EndpointState>(&encode(&s).unwrap()).unwrap(), s);
            prop_assert_eq!(decode::<PoolHealthChanged>(&encode(&p).unwrap()).unwrap(), p);
        }
    }

    #[test]
    fn the_fast_decoders_accept_nothing_the_generic_path_rejects(
        body in proptest::collection::vec(any::<u8>(), 0..120), which in 0..4usize,
    ) {
        let kind = [SchemaKind::CallOutcome, SchemaKind::ProbeResult, SchemaKind::Tick, SchemaKind::CallSummary][which];
        let (_, fp) = codec::current_schema(kind);
        let mut bytes = vec![0xC3, 0x01];
        bytes.extend_from_slice(&fp.to_le_bytes());
        bytes.extend(&body);
        if let Ok(fast) = decode_signal(&bytes) {
            prop_assert_eq!(codec::decode_signal_generic(&bytes).unwrap(), fast);
        }
    }

    #[test]
    fn random_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode_signal(&body);
        let mut framed = encode(&sample_call()).unwrap()[..10].to_vec();
        framed.extend(&body);
        let _ = decode_signal(&framed);
    }
}

/// Decode a record of any kind the way its consumer would.
/// A signal through apache-avro's serde path.
fn encode_signal_generic(s: &Signal) -> Vec<u8> {
    match s {
        Signal::Call(v) => codec::encode_generic(v),
        Signal::Summary(v) => codec::encode_generic(v),
        Signal::Probe(v) => codec::encode_generic(v),
        Signal::Tick(v) => codec::encode_generic(v),
        Signal::Override(v) => codec::encode_generic(v),
        Signal::Policy(v) => codec::encode_generic(v),
    }
    .unwrap()
}

fn decode_any(bytes: &[u8]) -> Result<(), CodecError> {
    match peek_kind(bytes)? {
        SchemaKind::HealthChanged => decode::<HealthChanged>(bytes).map(drop),
        SchemaKind::PoolHealthChanged => decode::<PoolHealthChanged>(bytes).map(drop),
        SchemaKind::EndpointState => decode::<EndpointState>(bytes).map(drop),
        _ => decode_signal(bytes).map(drop),
    }
}

fn varint(v: i64) -> Vec<u8> {
    let mut n = ((v << 1) ^ (v >> 63)) as u64;
    let mut out = Vec::new();
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out
}

/// The 61-byte record that aborted the processor on every restart: a CallOutcome written with
/// the older (v1) schema whose `attributes` map announces 400,000,000 entries.
#[test]
fn a_v1_record_announcing_400_million_attributes_is_an_error_not_an_abort() {
    let hex = "c301b121b3fe4544bfc810706f69736f6e2d3114706f69736f6e706f6f6c046531046777e8d991c3cfdcb00600029003d00f00008090bcfd02026b0276";
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    assert_eq!(bytes.len(), 61);
    let e = decode_signal(&bytes).unwrap_err();
    assert_eq!(e.code(), "invalid_body", "{e}");
    assert!(e.to_string().contains("400000000 items"), "{e}");
}

/// A HealthChanged whose `thresholds` array claims 500,000,000 items aborted the API's live
/// stream the same way.
#[test]
fn a_health_change_announcing_500_million_thresholds_is_an_error_not_an_abort() {
    let mut h = sample_change();
    h.evidence.thresholds = vec!["MARK".into()];
    let bytes = encode(&h).unwrap();
    let marker = [0x02u8, 0x08, b'M', b'A', b'R', b'K', 0x00];
    let at = bytes
        .windows(marker.len())
        .position(|w| w == marker)
        .expect("thresholds block");
    let mut forged = bytes[..at].to_vec();
    forged.extend(varint(500_000_000));
    forged.extend_from_slice(&bytes[at + 1..]);
    let e = decode::<HealthChanged>(&forged).unwrap_err();
    assert!(e.to_string().contains("500000000 items"), "{e}");
}

/// A piece of a forged body: random bytes, or a count or length far larger than the record.
fn segment() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..24),
        (1i64..i64::MAX).prop_map(varint),
        (-i64::MAX..0i64).prop_map(varint),
        Just(varint(400_000_000)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// The decoder fuzz target: every schema version we read, with bodies that are random or
    /// carry forged counts and lengths. Decoding must end in a value or an error — never a
    /// panic, an abort or a giant allocation (the process would not survive to report it).
    #[test]
    fn every_schema_version_survives_hostile_bodies(
        which in any::<proptest::sample::Index>(),
        segments in proptest::collection::vec(segment(), 0..12),
    ) {
        let known = codec::known_schemas();
        let (_, fp, _) = known[which.index(known.len())];
        let mut bytes = codec::MAGIC.to_vec();
        bytes.extend_from_slice(&fp.to_le_bytes());
        for s in segments {
            bytes.extend(s);
        }
        let _ = decode_any(&bytes);
    }
}

#[test]
fn a_fleet_record_is_written_in_the_previous_version_and_a_scoped_one_in_the_current() {
    let fp = |bytes: &[u8]| u64::from_le_bytes(bytes[2..10].try_into().unwrap());
    let current = |k| codec::current_schema(k).1;
    let fleet = encode(&sample_change()).unwrap();
    assert_ne!(
        fp(&fleet),
        current(SchemaKind::HealthChanged),
        "version 1: old consumers read it"
    );
    let scoped = HealthChanged {
        scope: Some("location=eu".into()),
        ..sample_change()
    };
    let bytes = encode(&scoped).unwrap();
    assert_eq!(fp(&bytes), current(SchemaKind::HealthChanged));
    assert_eq!(decode::<HealthChanged>(&bytes).unwrap(), scoped);
    assert_eq!(decode::<HealthChanged>(&fleet).unwrap(), sample_change());
    let pool = PoolHealthChanged {
        pool: "p".into(),
        seq: 1,
        endpoints: 3,
        healthy: 3,
        ejected: 0,
        healthy_fraction: 1.0,
        panic: false,
        correlated_outage: false,
        reason: "r".into(),
        policy_version: 0,
        stream_time: 1,
        faulty_reporters: vec![],
    };
    let plain = encode(&pool).unwrap();
    assert_ne!(fp(&plain), current(SchemaKind::PoolHealthChanged));
    let faulty = PoolHealthChanged {
        faulty_reporters: vec!["gateway=g1".into()],
        ..pool.clone()
    };
    let bytes = encode(&faulty).unwrap();
    assert_eq!(fp(&bytes), current(SchemaKind::PoolHealthChanged));
    assert_eq!(decode::<PoolHealthChanged>(&bytes).unwrap(), faulty);
    assert_eq!(decode::<PoolHealthChanged>(&plain).unwrap(), pool);
}

/// A gateway's own summary is written in version 1, which every consumer built before merged
/// summaries reads (the Java peer, an older processor); a merged one, in version 2. Both decode
/// on the fast path as they do on the generic one.
#[test]
fn a_gateways_summary_is_written_in_version_1_and_a_merged_one_in_version_2() {
    let fp = |bytes: &[u8]| u64::from_le_bytes(bytes[2..10].try_into().unwrap());
    let current = codec::current_schema(SchemaKind::CallSummary).1;
    let ok = CallOutcome::new("c", "p", "e", "g1", 5, OutcomeClass::Success);
    let mut own = CallSummary::new("s-1".into(), "p", "e", "g1", 5);
    own.add_times(&ok, 3);
    let bytes = encode(&own).unwrap();
    assert_ne!(fp(&bytes), current, "version 1");
    let v1 = Schema::parse_str(include_str!("../../../schemas/call_summary.v1.avsc")).unwrap();
    assert_eq!(fp(&bytes), fingerprint(&v1));
    assert_eq!(decode_signal(&bytes).unwrap(), Signal::Summary(own.clone()));
    assert_eq!(
        codec::decode_signal_generic(&bytes).unwrap(),
        Signal::Summary(own.clone())
    );
    let merged = CallSummary {
        gateway: "merger".into(),
        reporters: Some(vec![ReporterCounts {
            scopes: vec!["gateway=g1".into()],
            calls: 2,
            failures: 1,
            trailing_failures: 0,
        }]),
        ..own.clone()
    };
    let bytes = encode(&merged).unwrap();
    assert_eq!(fp(&bytes), current);
    assert_eq!(decode_signal(&bytes).unwrap(), Signal::Summary(merged.clone()));
    assert_eq!(codec::decode_signal_generic(&bytes).unwrap(), Signal::Summary(merged));
    // An empty list is still a merged summary: everyone's calls, no reporter known.
    let anonymous = CallSummary {
        reporters: Some(vec![]),
        ..own
    };
    let bytes = encode(&anonymous).unwrap();
    assert_eq!(fp(&bytes), current);
    assert_eq!(decode_signal(&bytes).unwrap(), Signal::Summary(anonymous));
}

#[test]
fn the_fuzz_target_covers_every_schema_version() {
    let known = codec::known_schemas();
    assert_eq!(known.len(), 16, "{known:?}");
    assert_eq!(
        known.iter().filter(|k| !k.2).count(),
        7,
        "seven older versions (CallOutcome v1 and v2, CallSummary v1, PolicyChange v1 and v2, HealthChanged v1, PoolHealthChanged v1)"
    );
}

/// A version-2 call (no Retry-After) and a version-1 policy change (no readmission, cooldown or
/// peer-failure fields) still decode, with the defaults.
#[test]
fn records_of_the_previous_versions_decode_with_the_new_fields_defaulted() {
    let v2 = Schema::parse_str(include_str!("../../../schemas/call_outcome.v2.avsc")).unwrap();
    let mut c = sample_call();
    c.retry_after_ms = None;
    let mut fields = match apache_avro::to_value(&c).unwrap() {
        Value::Record(f) => f,
        v => panic!("not a record: {v:?}"),
    };
    fields.retain(|(name, _)| name != "retry_after_ms");
    let value = Value::Record(fields).resolve(&v2).unwrap();
    let mut bytes = vec![0xC3, 0x01];
    bytes.extend_from_slice(&fingerprint(&v2).to_le_bytes());
    bytes.extend(to_avro_datum(&v2, value).unwrap());
    assert_eq!(decode_signal(&bytes).unwrap(), Signal::Call(c));

    let v1 = Schema::parse_str(include_str!("../../../schemas/policy_change.v1.avsc")).unwrap();
    let policy = Policy {
        version: 4,
        min_volume: 20,
        ..Policy::default()
    };
    let change = PolicyChange {
        change_id: "pc-1".into(),
        pool: "p".into(),
        actor: "ops".into(),
        issued_at: 1_600_000_000_000_000,
        policy: policy.clone(),
    };
    let bytes = policy_change_as(
        &v1,
        &change,
        &[
            "readmit_min_ms",
            "cooldown_ms",
            "rate_limited_share",
            "peer_failure_z",
            "peer_failure_margin",
        ],
    );
    assert_eq!(decode_signal(&bytes).unwrap(), Signal::Policy(change));
}

/// A version-2 policy change (no endpoint cap) decodes with the default cap of 1,000.
#[test]
fn a_version_2_policy_change_decodes_with_the_default_endpoint_cap() {
    let v2 = Schema::parse_str(include_str!("../../../schemas/policy_change.v2.avsc")).unwrap();
    let policy = Policy {
        version: 7,
        ..Policy::default()
    };
    let change = PolicyChange {
        change_id: "pc-2".into(),
        pool: "p".into(),
        actor: "ops".into(),
        issued_at: 1_600_000_000_000_000,
        policy: policy.clone(),
    };
    let bytes = policy_change_as(&v2, &change, &["max_endpoints"]);
    let Signal::Policy(decoded) = decode_signal(&bytes).unwrap() else {
        panic!("not a policy change")
    };
    assert_eq!(decoded.policy.max_endpoints, 1_000);
    assert_eq!(decoded, change);
}

/// A policy change as a writer of an older schema sends it: the policy fields that schema lacks
/// left out, in its single-object encoding.
fn policy_change_as(schema: &Schema, change: &PolicyChange, left_out: &[&str]) -> Vec<u8> {
    let mut fields = match apache_avro::to_value(change).unwrap() {
        Value::Record(f) => f,
        v => panic!("not a record: {v:?}"),
    };
    for (name, v) in fields.iter_mut() {
        if let (true, Value::Record(p)) = (name == "policy", v) {
            p.retain(|(n, _)| !left_out.contains(&n.as_str()));
        }
    }
    let value = Value::Record(fields).resolve(schema).unwrap();
    let mut bytes = vec![0xC3, 0x01];
    bytes.extend_from_slice(&fingerprint(schema).to_le_bytes());
    bytes.extend(to_avro_datum(schema, value).unwrap());
    bytes
}

proptest! {
    /// A summary of random calls survives the codec, and the summarizer's records pass
    /// validation (what the processor checks before the engine).
    #[test]
    fn summaries_of_random_calls_round_trip_and_validate(
        calls in proptest::collection::vec((0usize..9, 0i64..5_000_000, proptest::option::of(0i64..3_000_000)), 1..200),
    ) {
        let cfg = SummaryConfig { failure_cap: 3, ..SummaryConfig::default() };
        let mut s = Summarizer::new(cfg, "prop");
        let mut out = Vec::new();
        let t0 = 1_700_000_000_000_000i64;
        for (i, (class, latency, ttft)) in calls.into_iter().enumerate() {
            let t = t0 + i as i64 * 7_000;
            let c = CallOutcome {
                latency_us: latency,
                ttft_us: ttft,
                model: Some(format!("m{}", i % 20)),
                retry_after_ms: (class == 4).then_some(1_000),
                ..CallOutcome::new(format!("c{i}"), "p", "e", "gw", t, OutcomeClass::ALL[class])
            };
            s.add(c, t + latency, &mut out);
        }
        s.flush_all(&mut out);
        for sig in &out {
            prop_assert_eq!(validate_signal(sig, Some(t0)), Ok(()));
            prop_assert_eq!(&decode_signal(&encode_signal(sig).unwrap()).unwrap(), sig);
            prop_assert_eq!(encode_signal(sig).unwrap(), encode_signal_generic(sig));
        }
    }
}

proptest! {
    /// Merging histograms in one pass over their buckets counts what recording every value of
    /// both would, bucket for bucket, and keeps the buckets ascending.
    #[test]
    fn merged_histograms_count_every_value_of_both(
        a in proptest::collection::vec((0i64..10_000_000, 1i64..5), 0..40),
        b in proptest::collection::vec((0i64..10_000_000, 1i64..5), 0..40),
    ) {
        let of = |values: &[(i64, i64)]| {
            let mut h = Histogram::default();
            values.iter().for_each(|(v, n)| h.record_times(*v, *n));
            h
        };
        let mut merged = of(&a);
        merged.merge(&of(&b));
        let both: Vec<(i64, i64)> = a.iter().chain(&b).copied().collect();
        prop_assert_eq!(merged, of(&both));
    }
}
