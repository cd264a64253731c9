//! Shared pieces of the benchmark programs: an allocation counter, CPU time, and a realistic
//! synthetic signal mix.

pub mod alloc;
pub mod stack;
pub mod workload;

/// The wall clock in µs since the epoch (a signal's `occurred_at`).
/// The wall clock in microseconds since the epoch (the one every part of vitals stamps with).
pub use vitals_contracts::clock::now_us;

/// CPU time (user + system) this process has used, in seconds.
pub fn cpu_seconds() -> f64 {
    cpu::of_stat(&std::fs::read_to_string("/proc/self/stat").unwrap_or_default())
}

/// A `kB` field of /proc/<pid>/status (`VmHWM:`, `VmRSS:`), 0 if absent.
pub fn status_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

/// CPU time of other processes, from /proc.
pub mod cpu {
    /// Seconds of user + system time in a /proc/<pid>/stat line.
    pub fn of_stat(stat: &str) -> f64 {
        // Fields after the command name (which may contain spaces) start after the last ')'.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        // utime and stime are fields 14 and 15 of stat; after ')' they are at 11 and 12 (0-based).
        (ticks(11) + ticks(12)) / clock_ticks_per_second()
    }

    /// CPU seconds of one process so far.
    pub fn of_pid(pid: u32) -> f64 {
        of_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default())
    }

    /// CPU seconds, summed, of every live process whose command name is `comm` (`postgres`:
    /// every backend and background process of the cluster; `java`: the Kafka broker).
    pub fn of_command(comm: &str) -> f64 {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return 0.0;
        };
        dir.flatten()
            .filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
            .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
            .filter(|stat| {
                stat.split_once('(')
                    .and_then(|(_, r)| r.rsplit_once(')'))
                    .is_some_and(|(name, _)| name == comm)
            })
            .map(|stat| of_stat(&stat))
            .sum()
    }

    fn clock_ticks_per_second() -> f64 {
        static TCK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
        // sysconf(_SC_CLK_TCK) is 100 on every Linux we run on; getconf tells if it ever is not.
        *TCK.get_or_init(|| {
            std::process::Command::new("getconf")
                .arg("CLK_TCK")
                .output()
                .ok()
                .and_then(|o| String::from_utf8(o.stdout).ok())
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(100.0)
        })
    }
}

/// The median of `v` (NaN when empty).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        l if l % 2 == 1 => s[l / 2],
        l => (s[l / 2 - 1] + s[l / 2]) / 2.0,
    }
}

/// "median (min – max) unit", whole numbers from 100 up.
pub fn spread(v: &[f64], unit: &str) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let prec = if median(v).abs() < 100.0 { 2 } else { 0 };
    format!("{:>10.prec$} ({:.prec$} – {:.prec$}) {unit}", median(v), min, max)
}
