//! The demo driver's command line: its help, and a clear error for a timeline it cannot use
//! (before it touches any service).

use std::process::Command;

fn demo(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vitals-demo"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn help_and_a_bad_timeline() {
    let (code, out) = demo(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("--timeline") && out.contains("--check"), "{out}");
    let bad = std::env::temp_dir().join(format!("demo-timeline-{}.toml", std::process::id()));
    std::fs::write(
        &bad,
        "[[fault]]\nname = \"x\"\npool = \"chat\"\nendpoints = [\"a\"]\nbehaviour = { drops = 3.0 }\n",
    )
    .unwrap();
    let routes = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/demo/routes.toml");
    let (code, out) = demo(&["--timeline", bad.to_str().unwrap(), "--routes", routes]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("behaviour.drops"), "{out}");
    let (code, out) = demo(&["--timeline", "/nonexistent.toml", "--routes", routes]);
    assert_eq!(code, 2);
    assert!(out.contains("reading /nonexistent.toml"), "{out}");
}
