//! Secrets never reach a log line: database passwords and Kafka credentials are replaced.

/// The URL with its password replaced.
pub fn url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            let user = creds.split(':').next().unwrap_or("");
            format!("{}://{}:***@{}", &url[..s], user, &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// A `key=value` client option with the value hidden when the key names a secret.
pub fn option(o: &str) -> String {
    match o.split_once('=') {
        Some((k, _)) if k.contains("password") || k.contains("secret") || k.contains("key") => format!("{k}=***"),
        _ => o.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_are_replaced() {
        assert_eq!(
            super::url("postgres://u:hunter2@db:5432/x"),
            "postgres://u:***@db:5432/x"
        );
        assert_eq!(super::url("postgres://db/x"), "postgres://db/x");
        assert_eq!(super::option("sasl.password=hunter2"), "sasl.password=***");
        assert_eq!(super::option("acks=all"), "acks=all");
    }
}
