//! `vitals report`: availability and incidents over a range, from the API's uptime and incident
//! routes (the definitions are `vitals-uptime`'s, in docs/uptime.md): worst pools
//! and endpoints first; a table, the JSON, or one HTML file a person can send.

use crate::api::{table, Api};
use crate::backtest::escape;
use serde::Serialize;
use vitals_contracts::view::{self, Incident, IncidentPage, PoolUptime};

/// Everything the report shows, as `--json` prints it.
#[derive(Serialize)]
pub struct Report {
    pub from: String,
    pub to: String,
    pub pools: Vec<PoolReport>,
}

#[derive(Serialize)]
pub struct PoolReport {
    pub uptime: PoolUptime,
    /// Newest first.
    pub incidents: Vec<Incident>,
}

/// Every pool with its counts (no endpoint rows), a page at a time.
pub async fn all_pools(api: &Api) -> anyhow::Result<Vec<view::PoolHealth>> {
    let mut pools = Vec::new();
    let mut after = String::new();
    loop {
        let page: view::PoolPage = api
            .get_as(
                "/v1/pools",
                &[("endpoints", "0".into()), ("limit", "1000".into()), ("after", after)],
            )
            .await?;
        pools.extend(page.pools);
        match page.next_after {
            Some(a) => after = a,
            None => return Ok(pools),
        }
    }
}

/// Hourly bars up to three days, daily beyond.
fn bucket(from: &str, to: &str) -> &'static str {
    let span = chrono::DateTime::parse_from_rfc3339(to)
        .ok()
        .zip(chrono::DateTime::parse_from_rfc3339(from).ok())
        .map(|(t, f)| (t - f).num_hours());
    if span.is_some_and(|h| h <= 72) {
        "hour"
    } else {
        "day"
    }
}

/// Read the report from the API: each pool's uptime and all its incidents in the range. Progress
/// goes to stderr when there are several pools.
pub async fn read(api: &Api, from: &str, to: &str, pool: Option<String>) -> anyhow::Result<Report> {
    let names = match pool {
        Some(p) => vec![p],
        None => all_pools(api).await?.into_iter().map(|p| p.pool).collect(),
    };
    let range = [("from", from.to_owned()), ("to", to.to_owned())];
    let mut pools = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        if names.len() > 1 {
            eprintln!("reading pool {}/{}: {name}", i + 1, names.len());
        }
        let mut q = range.to_vec();
        q.push(("bucket", bucket(from, to).to_owned()));
        // Every endpoint, a page at a time (a page is bounded by its buckets).
        let path = format!("/v1/pools/{}/uptime", crate::api::seg(name));
        let mut uptime: PoolUptime = api.get_as(&path, &q).await?;
        while let Some(c) = uptime.next_cursor.take() {
            let mut q = q.clone();
            q.push(("cursor", c));
            let page: PoolUptime = api.get_as(&path, &q).await?;
            uptime.endpoints.extend(page.endpoints);
            uptime.next_cursor = page.next_cursor;
        }
        let mut incidents = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut q = range.to_vec();
            q.extend([("pool", name.clone()), ("limit", "500".to_owned())]);
            if let Some(c) = cursor.take() {
                q.push(("cursor", c));
            }
            let page: IncidentPage = api.get_as("/v1/incidents", &q).await?;
            incidents.extend(page.items);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        pools.push(PoolReport { uptime, incidents });
    }
    // Worst pool first.
    pools.sort_by(|a, b| {
        let key = |p: &PoolReport| p.uptime.figures.availability.unwrap_or(f64::INFINITY);
        key(a).total_cmp(&key(b)).then(a.uptime.pool.cmp(&b.uptime.pool))
    });
    Ok(Report {
        from: pools.first().map_or(from.to_owned(), |p| p.uptime.from.to_rfc3339()),
        to: pools.first().map_or(to.to_owned(), |p| p.uptime.to.to_rfc3339()),
        pools,
    })
}

/// A share as a percentage with enough digits to tell 99.99 % from 100 %.
pub fn pct(v: Option<f64>) -> String {
    v.map_or("–".to_owned(), |v| format!("{:.3} %", v * 100.0))
}

fn secs(s: f64) -> String {
    if s >= 3600.0 {
        format!("{:.1} h", s / 3600.0)
    } else if s >= 60.0 {
        format!("{:.1} min", s / 60.0)
    } else {
        format!("{s:.1} s")
    }
}

fn when(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

/// The report as tables on stdout.
pub fn print(r: &Report) {
    println!("availability {} → {} (worst first)", r.from, r.to);
    for p in &r.pools {
        let f = &p.uptime.figures;
        println!(
            "\npool {}: availability {} (every endpoint in rotation {}), incidents {}, panic {}, correlated outage {}",
            p.uptime.pool,
            pct(f.availability),
            pct(f.all_availability),
            f.incidents,
            secs(f.panic_s),
            secs(f.correlated_outage_s)
        );
        println!("requests: {}", requests(&f.requests, f.request_availability));
        let rows: Vec<Vec<String>> = p
            .uptime
            .endpoints
            .iter()
            .map(|e| {
                vec![
                    e.endpoint.clone(),
                    pct(e.availability),
                    pct(e.request_availability),
                    e.requests.counted().to_string(),
                    secs(e.observed_s - e.available_s - e.maintenance_s),
                    secs(e.maintenance_s),
                    e.incidents.to_string(),
                ]
            })
            .collect();
        table(
            &[
                "endpoint",
                "availability",
                "requests ok",
                "calls",
                "out",
                "maintenance",
                "incidents",
            ],
            &rows,
        );
        if !p.incidents.is_empty() {
            let rows: Vec<Vec<String>> = p.incidents.iter().map(incident_row).collect();
            println!();
            table(&["endpoint", "out at", "lasted", "to out", "to back", "reasons"], &rows);
        }
    }
}

/// Request availability in words: "70.588 % of 340 calls succeeded", or "no calls".
fn requests(r: &vitals_contracts::Requests, share: Option<f64>) -> String {
    match r.counted() {
        0 => "no calls".to_owned(),
        n => format!("{} of {n} calls succeeded", pct(share)),
    }
}

fn incident_row(i: &Incident) -> Vec<String> {
    vec![
        i.endpoint.clone(),
        when(&i.started_at),
        format!("{}{}", secs(i.duration_s), if i.ongoing { " (ongoing)" } else { "" }),
        secs(i.time_to_out_s),
        i.time_to_back_s.map_or("–".to_owned(), secs),
        i.reason_codes.join(", "),
    ]
}

fn colour(a: Option<f64>) -> &'static str {
    match a {
        None => "#bbb",
        Some(a) if a >= 0.9999 => "#3a9d5d",
        Some(a) if a >= 0.999 => "#8cbf4f",
        Some(a) if a >= 0.99 => "#e0c341",
        Some(a) if a >= 0.95 => "#e08a3c",
        Some(_) => "#c8423b",
    }
}

fn bars(buckets: &[view::UptimeBucket]) -> String {
    let w = (720.0 / buckets.len().max(1) as f64).min(24.0);
    let mut svg = format!(
        "<svg width=\"{:.0}\" height=\"22\" role=\"img\" aria-label=\"availability per bucket\">",
        w * buckets.len() as f64
    );
    for (i, b) in buckets.iter().enumerate() {
        svg.push_str(&format!(
            "<rect x=\"{:.1}\" y=\"0\" width=\"{:.1}\" height=\"22\" fill=\"{}\"><title>{}: {} in rotation, {}</title></rect>",
            i as f64 * w,
            (w - 1.0).max(0.5),
            colour(b.availability),
            when(&b.start),
            pct(b.availability),
            requests(&b.requests, b.request_availability)
        ));
    }
    svg.push_str("</svg>");
    svg
}

/// One self-contained page: per pool its figures, uptime bars per endpoint (figures as text as
/// well as colour), and its incidents.
pub fn html(r: &Report) -> String {
    let mut body = String::new();
    for p in &r.pools {
        let f = &p.uptime.figures;
        body.push_str(&format!(
            "<section><h2>{}</h2><p>availability <b>{}</b> (every endpoint in rotation {}) · requests <b>{}</b> · incidents {} · panic {} · correlated outage {}</p>{}\n<table><thead><tr><th>endpoint</th><th>availability</th><th>requests ok</th><th>calls</th><th>out</th><th>maintenance</th><th>incidents</th><th>per {}</th></tr></thead><tbody>",
            escape(&p.uptime.pool),
            pct(f.availability),
            pct(f.all_availability),
            requests(&f.requests, f.request_availability),
            f.incidents,
            secs(f.panic_s),
            secs(f.correlated_outage_s),
            bars(&f.buckets),
            p.uptime.bucket.as_deref().unwrap_or("range"),
        ));
        for e in &p.uptime.endpoints {
            body.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&e.endpoint),
                pct(e.availability),
                pct(e.request_availability),
                e.requests.counted(),
                secs(e.observed_s - e.available_s - e.maintenance_s),
                secs(e.maintenance_s),
                e.incidents,
                bars(&e.buckets)
            ));
        }
        body.push_str("</tbody></table>");
        if !p.incidents.is_empty() {
            body.push_str("<h3>Incidents</h3><table><thead><tr><th>endpoint</th><th>out at (UTC)</th><th>lasted</th><th>to out</th><th>to back</th><th>reasons</th><th>first reason</th></tr></thead><tbody>");
            for i in &p.incidents {
                let cells = incident_row(i);
                body.push_str("<tr>");
                for c in cells {
                    body.push_str(&format!("<td>{}</td>", escape(&c)));
                }
                body.push_str(&format!("<td>{}</td></tr>", escape(&i.reason)));
            }
            body.push_str("</tbody></table>");
        }
        body.push_str("</section>\n");
    }
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>vitals availability {from} – {to}</title>\
<style>body{{font:14px system-ui,sans-serif;margin:2em;color:#222}}table{{border-collapse:collapse;margin:.5em 0}}td,th{{padding:2px 8px;text-align:left;border-bottom:1px solid #eee}}h2{{margin-top:1.5em}}</style>\
</head><body><h1>Availability {from} – {to}</h1><p>In rotation: healthy, suspect, recovering and degraded with weight &gt; 0; maintenance is left out. \
Requests ok: the share of the calls the gateways reported that succeeded (4xx and cancelled calls left out). \
Bars: green ≥ 99.99 %, light green ≥ 99.9 %, yellow ≥ 99 %, orange ≥ 95 %, red below; hover for the figure.</p>\n{body}</body></html>\n",
        from = escape(&r.from),
        to = escape(&r.to),
    )
}
