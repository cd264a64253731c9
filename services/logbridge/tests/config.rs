//! The binary's configuration errors: each named, nothing started. (No stack needed: it stops
//! before it connects to anything.)

fn run(args: &[&str]) -> (i32, String) {
    vitals_testkit::run_to_end("vitals-logbridge", args)
}

#[test]
fn without_an_input_it_says_which_flags_give_one() {
    let (code, text) = run(&["--http-addr", "127.0.0.1:0"]);
    assert_ne!(code, 0);
    assert!(text.contains("--udp, --unix or --file"), "{text}");
}

#[test]
fn a_bad_map_is_refused_with_the_backend_and_the_field() {
    let map = std::env::temp_dir().join(format!("logbridge-bad-map-{}.toml", std::process::id()));
    std::fs::write(&map, "[[backend]]\nname = \"be_chat\"\npool = \"\"\n").unwrap();
    let (code, text) = run(&[
        "--udp",
        "127.0.0.1:0",
        "--map",
        map.to_str().unwrap(),
        "--http-addr",
        "127.0.0.1:0",
    ]);
    std::fs::remove_file(&map).unwrap();
    assert_ne!(code, 0);
    assert!(text.contains("backend \"be_chat\"") && text.contains("pool"), "{text}");
}

#[test]
fn a_bad_socket_mode_is_refused() {
    let (code, text) = run(&["--unix", "/tmp/x.sock", "--unix-mode", "999"]);
    assert_ne!(code, 0);
    assert!(text.contains("not a file mode"), "{text}");
}
