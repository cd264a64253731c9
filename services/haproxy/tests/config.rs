//! The binary's configuration errors: each named, nothing started. (No stack needed: it stops
//! before it connects to anything.)

fn run(args: &[&str]) -> (i32, String) {
    vitals_testkit::run_to_end("vitals-haproxy", args)
}

#[test]
fn an_unknown_out_state_is_refused_naming_the_choices() {
    let (code, text) = run(&["--runtime-api", "/tmp/none.sock", "--out-state", "off"]);
    assert_ne!(code, 0);
    assert!(text.contains("expected maint or drain"), "{text}");
}

#[test]
fn a_map_with_an_unknown_field_is_refused_naming_it() {
    let map = std::env::temp_dir().join(format!("vitals-haproxy-bad-map-{}.toml", std::process::id()));
    std::fs::write(&map, "[[backend]]\nname = \"be\"\nweight = 3\n").unwrap();
    let (code, text) = run(&["--runtime-api", "/tmp/none.sock", "--map", map.to_str().unwrap()]);
    std::fs::remove_file(&map).unwrap();
    assert_ne!(code, 0);
    assert!(text.contains("weight"), "{text}");
}

#[test]
fn a_zero_interval_is_refused() {
    let (code, text) = run(&["--runtime-api", "/tmp/none.sock", "--interval-ms", "0"]);
    assert_ne!(code, 0);
    assert!(text.contains("--interval-ms must be above 0"), "{text}");
}
