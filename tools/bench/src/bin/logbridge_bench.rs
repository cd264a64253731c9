//! The log bridge's cost: HAProxy access-log lines (in vitals' format, syslog-framed) through
//! the real `vitals-logbridge` binary over UDP to the real broker, at an offered rate. Prints
//! lines read per second, the bridge's CPU per line (lines per CPU-second: per core), what the
//! kernel dropped, what was delivered to Kafka, and the bridge's memory (peak RSS). Then the
//! parse-and-map step alone on one thread of this process (no I/O), for both formats.
//!
//!   scripts/stack.sh up
//!   cargo build --release -p vitals-logbridge
//!   cargo run --release -p vitals-bench --bin logbridge-bench -- [--rate 200000] [--secs 10]

use clap::Parser;
use std::net::UdpSocket;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use vitals_bench::{cpu, status_kb};
use vitals_gateways::map::Map;
use vitals_gateways::{haproxy, nginx, syslog};
use vitals_testkit::{brokers, free_port, http_get, metric, unique, Service, Stamp, Topics};

#[derive(Parser)]
struct Args {
    /// Lines per second offered to the bridge.
    #[arg(long, default_value_t = 200_000)]
    rate: u64,
    #[arg(long, default_value_t = 10)]
    secs: u64,
    /// Distinct servers the lines are spread over (10 backends).
    #[arg(long, default_value_t = 100)]
    servers: usize,
}

fn haproxy_line(i: usize, servers: usize, now: u64) -> Vec<u8> {
    let s = i % servers;
    let (status, term) = if i.is_multiple_of(50) {
        (503, "SC--")
    } else {
        (200, "----")
    };
    format!(
        "<134>Dec  1 08:21:26 haproxy[4242]: vitals1 {now}.{:03} - be_{} srv_{s} {status} 0 0 1 {} {} {term} 0 {{}}",
        i % 1000,
        s % 10,
        20 + i % 300,
        25 + i % 400
    )
    .into_bytes()
}

fn nginx_line(i: usize, servers: usize, now: u64) -> Vec<u8> {
    let s = i % servers;
    format!(
        r#"<190>Dec  1 08:21:26 web-1 nginx: {{"v":1,"time":"{now}.{:03}","id":"{i:032x}","upstream":"up_{}","addr":"10.0.{}.{}:443","status":"200","connect":"0.001","header":"0.020","response":"0.120","retry_after":"","request_time":"0.121","client_status":"200"}}"#,
        i % 1000,
        s % 10,
        s / 256,
        s % 256
    )
    .into_bytes()
}

/// Parse, map and build the report for `lines`, on this thread: lines per second.
fn parse_only(lines: &[Vec<u8>]) -> f64 {
    let map = Map::default();
    let mut reports = 0usize;
    let start = Instant::now();
    for l in lines {
        let m = syslog::parse(l).expect("framed");
        let line = if m.body.first() == Some(&b'{') {
            nginx::parse(m.body)
        } else {
            haproxy::parse(m.body)
        }
        .expect("valid");
        for a in &line.attempts {
            reports += usize::from(map.outcome(a, "bench").is_some());
        }
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(reports, lines.len());
    lines.len() as f64 / secs
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let topics = Topics::create(&unique("logbridge_bench"), 8, Stamp::LogAppendTime).await;
    let udp = format!("127.0.0.1:{}", free_port());
    let port = free_port();
    let bridge = Service::start(
        "vitals-logbridge",
        "logbridge-bench",
        &[
            "--udp",
            &udp,
            "--brokers",
            &brokers(),
            "--signals-topic",
            &topics.signals,
            "--queue",
            "262144",
            "--http-addr",
            &format!("127.0.0.1:{port}"),
        ]
        .map(String::from),
    );
    for _ in 0..300 {
        if http_get(port, "/readyz").await.as_deref() == Some("ready") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = bridge.child.id();
    let lines: Vec<Vec<u8>> = (0..args.rate as usize)
        .map(|i| haproxy_line(i, args.servers, now))
        .collect();
    let input = format!("vitals_logbridge_lines_total{{input=\"udp:{udp}\"}}");
    let drops = format!("vitals_logbridge_kernel_drops{{input=\"udp:{udp}\"}}");
    let delivered = "vitals_reporter_reports_total{result=\"delivered\"}";
    let read0 = metric(port, &input).await.unwrap_or(0.0);
    let cpu0 = cpu::of_pid(pid);
    let rss0 = status_kb(pid, "VmRSS:");
    // Offer `rate` lines a second, in 1 ms slices, from a thread of its own.
    let (rate, secs, udp2) = (args.rate, args.secs, udp.clone());
    let sent = tokio::task::spawn_blocking(move || {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let start = Instant::now();
        let mut sent = 0u64;
        let total = rate * secs;
        while sent < total {
            let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
            if sent >= due.min(total) {
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            while sent < due.min(total) {
                let _ = sock.send_to(&lines[(sent as usize) % lines.len()], &udp2);
                sent += 1;
            }
        }
        (sent, start.elapsed().as_secs_f64())
    })
    .await
    .unwrap();
    // Let the bridge drain what the kernel holds, then read the figures.
    let mut last = -1.0;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let r = metric(port, &input).await.unwrap_or(0.0);
        if r == last {
            break;
        }
        last = r;
    }
    let cpu = cpu::of_pid(pid) - cpu0;
    let read = metric(port, &input).await.unwrap_or(0.0) - read0;
    let dropped = metric(port, &drops).await.unwrap_or(0.0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(port, delivered).await.unwrap_or(0.0) < read && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cpu_all = cpu::of_pid(pid) - cpu0;
    let got = metric(port, delivered).await.unwrap_or(0.0);
    println!(
        "vitals-logbridge, HAProxy format over UDP, {} lines offered at {}/s over {:.1} s:",
        sent.0, args.rate, sent.1
    );
    println!(
        "  read {read:.0} ({:.0}/s), kernel drops {dropped:.0}, delivered to Kafka {got:.0}",
        read / sent.1
    );
    println!(
        "  bridge CPU {cpu:.2} s while reading, {cpu_all:.2} s until delivered: {:.0} lines per CPU-second (per core), {:.2} µs per line",
        read / cpu_all,
        cpu_all / read * 1e6
    );
    println!(
        "  memory: RSS {} MB before, {} MB after, peak {} MB",
        rss0 / 1024,
        status_kb(pid, "VmRSS:") / 1024,
        status_kb(pid, "VmHWM:") / 1024
    );
    drop(bridge);
    let n = 1_000_000;
    let ha: Vec<Vec<u8>> = (0..n).map(|i| haproxy_line(i, args.servers, now)).collect();
    let ng: Vec<Vec<u8>> = (0..n).map(|i| nginx_line(i, args.servers, now)).collect();
    for (what, lines) in [("HAProxy", &ha), ("nginx JSON", &ng)] {
        let best = (0..3).map(|_| parse_only(lines)).fold(0.0, f64::max);
        println!("parse + map + report built, one thread, {what}: {best:.0} lines/s");
    }
}
