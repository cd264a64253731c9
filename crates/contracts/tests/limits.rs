//! The limit parsers against any text: a delay within a day or None, and what upstreams write
//! reads back.

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// Rate-limit reset headers (`x-ratelimit-reset-*`) come from the upstream: any text is a
    /// delay within a day or None, and a duration written as OpenAI writes it reads back.
    #[test]
    fn ratelimit_resets_are_a_delay_within_a_day_or_none(raw in "\\PC{0,30}") {
        if let Some(ms) = vitals_contracts::limits::ratelimit_reset_ms(&raw) {
            prop_assert!((0..=86_400_000).contains(&ms), "{raw:?}: {ms}");
        }
    }

    /// `retry-after-ms` likewise: any text is a delay within a day or None, and a number of
    /// milliseconds within a day reads back.
    #[test]
    fn retry_after_ms_headers_are_a_delay_within_a_day_or_none(raw in "\\PC{0,30}", ms in 0u32..86_400_000) {
        if let Some(got) = vitals_contracts::limits::retry_after_exact_ms(&raw) {
            prop_assert!((0..=86_400_000).contains(&got), "{raw:?}: {got}");
        }
        prop_assert_eq!(vitals_contracts::limits::retry_after_exact_ms(&ms.to_string()), Some(i64::from(ms)));
    }

    #[test]
    fn an_openai_duration_reads_back(h in 0u32..24, m in 0u32..60, s in 0u32..60, ms in 0u32..1000) {
        let text = match (h, m, ms) {
            (0, 0, 0) => format!("{s}s"),
            (0, 0, _) if s == 0 => format!("{ms}ms"),
            (0, _, 0) => format!("{m}m{s}s"),
            (0, _, _) => format!("{m}m{s}.{ms:03}s"),
            _ => format!("{h}h{m}m{s}.{ms:03}s"),
        };
        let want = i64::from(((h * 60 + m) * 60 + s) * 1000 + ms);
        prop_assert_eq!(vitals_contracts::limits::ratelimit_reset_ms(&text), Some(want), "{}", text);
    }
}
