//! Hand-written decoders for the current versions of the four records that make up nearly all
//! of the signals topic: CallOutcome, CallSummary, ProbeResult and Tick. apache-avro decodes through a generic
//! `Value` tree (about 1.7 µs a CallOutcome); reading the binary encoding field by field takes a
//! tenth of that. The field order below is the schema's; a property test holds these decoders
//! equal to the generic path for every record, and older schema versions keep using the generic
//! path with schema resolution.

use super::{CodecError, SchemaKind};
use crate::types::*;
use std::collections::BTreeMap;

/// An Avro long from its zig-zag encoding.
fn zigzag(n: u64) -> i64 {
    (n >> 1) as i64 ^ -((n & 1) as i64)
}

struct Reader<'a> {
    rest: &'a [u8],
    kind: SchemaKind,
}

impl<'a> Reader<'a> {
    fn err(&self, message: impl Into<String>) -> CodecError {
        CodecError::Body {
            kind: self.kind,
            message: message.into(),
        }
    }

    fn byte(&mut self) -> Result<u8, CodecError> {
        let (&b, rest) = self.rest.split_first().ok_or_else(|| self.err("record is truncated"))?;
        self.rest = rest;
        Ok(b)
    }

    /// Avro `long`: zig-zag, variable length, at most 10 bytes. Most are one byte (counts, a
    /// union's branch) or two (a histogram's bucket indexes): read inline, the rest out of line.
    #[inline(always)]
    fn long(&mut self) -> Result<i64, CodecError> {
        match *self.rest {
            [b0, ref rest @ ..] if b0 < 0x80 => {
                self.rest = rest;
                Ok(zigzag(u64::from(b0)))
            }
            [b0, b1, ref rest @ ..] if b1 < 0x80 => {
                self.rest = rest;
                Ok(zigzag(u64::from(b0 & 0x7f) | u64::from(b1) << 7))
            }
            _ => self.long_multibyte(),
        }
    }

    #[inline(never)]
    fn long_multibyte(&mut self) -> Result<i64, CodecError> {
        let mut n: u64 = 0;
        for (i, &b) in self.rest.iter().take(10).enumerate() {
            n |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                self.rest = &self.rest[i + 1..];
                return Ok(zigzag(n));
            }
        }
        Err(if self.rest.len() < 10 {
            self.err("record is truncated")
        } else {
            self.err("variable-length integer longer than 10 bytes")
        })
    }

    #[inline(always)]
    fn int(&mut self) -> Result<i32, CodecError> {
        let v = self.long()?;
        i32::try_from(v).map_err(|_| self.err(format!("{v} does not fit an int")))
    }

    fn boolean(&mut self) -> Result<bool, CodecError> {
        match self.byte()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.err(format!("{b} is not a boolean"))),
        }
    }

    fn string(&mut self) -> Result<String, CodecError> {
        let len = self.long()?;
        let len = usize::try_from(len).map_err(|_| self.err(format!("negative string length {len}")))?;
        if len > self.rest.len() {
            return Err(self.err("record is truncated"));
        }
        let (s, rest) = self.rest.split_at(len);
        self.rest = rest;
        String::from_utf8(s.to_vec()).map_err(|_| self.err("string is not UTF-8"))
    }

    /// An index below `n`: an enum symbol or a union branch.
    fn index(&mut self, n: usize, what: &str) -> Result<usize, CodecError> {
        let i = self.long()?;
        usize::try_from(i)
            .ok()
            .filter(|i| *i < n)
            .ok_or_else(|| self.err(format!("{what} index {i} out of range")))
    }

    /// `["null", T]`.
    fn optional<T>(&mut self, read: impl FnOnce(&mut Self) -> Result<T, CodecError>) -> Result<Option<T>, CodecError> {
        match self.index(2, "union")? {
            0 => Ok(None),
            _ => read(self).map(Some),
        }
    }

    /// The item count of the next block of an array or map; 0 ends it.
    fn block(&mut self) -> Result<usize, CodecError> {
        let mut n = self.long()?;
        if n < 0 {
            n = n.checked_neg().ok_or_else(|| self.err("bad block count"))?;
            self.long()?; // the block's size in bytes, which we do not need
        }
        // Every item takes at least one byte: a larger count is a lie, not an allocation.
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= self.rest.len())
            .ok_or_else(|| self.err(format!("block of {n} items")))
    }

    /// An array or a map: `each` reads one item, for every item of every block.
    fn items(&mut self, mut each: impl FnMut(&mut Self) -> Result<(), CodecError>) -> Result<(), CodecError> {
        loop {
            let n = self.block()?;
            if n == 0 {
                return Ok(());
            }
            for _ in 0..n {
                each(self)?;
            }
        }
    }

    fn outcome(&mut self) -> Result<OutcomeClass, CodecError> {
        Ok(OutcomeClass::ALL[self.index(OutcomeClass::ALL.len(), "OutcomeClass")?])
    }

    fn end(self) -> Result<(), CodecError> {
        match self.rest.len() {
            0 => Ok(()),
            n => Err(self.err(format!("{n} trailing bytes after the record"))),
        }
    }
}

/// Decode the body of a current-version signal record of `kind` (or, `current` false, a
/// summary of version 1), or `None` for kinds this module does not handle.
pub(crate) fn decode(kind: SchemaKind, body: &[u8], current: bool) -> Option<Result<Signal, CodecError>> {
    let mut r = Reader { rest: body, kind };
    let result = match kind {
        SchemaKind::CallOutcome => call(&mut r).map(Signal::Call),
        SchemaKind::ProbeResult => probe(&mut r).map(Signal::Probe),
        SchemaKind::Tick => tick(&mut r).map(Signal::Tick),
        SchemaKind::CallSummary => summary(&mut r, current).map(Signal::Summary),
        _ => return None,
    };
    Some(result.and_then(|s| r.end().map(|()| s)))
}

fn call(r: &mut Reader<'_>) -> Result<CallOutcome, CodecError> {
    Ok(CallOutcome {
        event_id: r.string()?,
        pool: r.string()?,
        endpoint: r.string()?,
        gateway: r.string()?,
        occurred_at: r.long()?,
        outcome: r.outcome()?,
        http_status: r.optional(Reader::int)?,
        latency_us: r.long()?,
        ttft_us: r.optional(Reader::long)?,
        tpot_us: r.optional(Reader::long)?,
        attributes: {
            let mut m = BTreeMap::new();
            r.items(|r| {
                let k = r.string()?;
                m.insert(k, r.string()?);
                Ok(())
            })?;
            m
        },
        model: r.optional(Reader::string)?,
        retry_after_ms: r.optional(Reader::long)?,
    })
}

fn probe(r: &mut Reader<'_>) -> Result<ProbeResult, CodecError> {
    const KINDS: [ProbeKind; 4] = [
        ProbeKind::Http,
        ProbeKind::Tcp,
        ProbeKind::SyntheticCompletion,
        ProbeKind::Heartbeat,
    ];
    const STATUS: [DependencyStatus; 3] = [DependencyStatus::Up, DependencyStatus::Degraded, DependencyStatus::Down];
    Ok(ProbeResult {
        probe_id: r.string()?,
        pool: r.string()?,
        endpoint: r.string()?,
        prober: r.string()?,
        occurred_at: r.long()?,
        kind: KINDS[r.index(KINDS.len(), "ProbeKind")?],
        outcome: r.outcome()?,
        latency_us: r.long()?,
        ttft_us: r.optional(Reader::long)?,
        http_status: r.optional(Reader::int)?,
        interval_ms: r.optional(Reader::long)?,
        dependencies: {
            let mut v = Vec::new();
            r.items(|r| {
                v.push(DependencyReport {
                    name: r.string()?,
                    critical: r.boolean()?,
                    status: STATUS[r.index(STATUS.len(), "DependencyStatus")?],
                });
                Ok(())
            })?;
            v
        },
        detail: r.string()?,
    })
}

fn tick(r: &mut Reader<'_>) -> Result<Tick, CodecError> {
    Ok(Tick {
        ticker: r.string()?,
        emitted_at: r.long()?,
    })
}

fn histogram(r: &mut Reader<'_>) -> Result<Histogram, CodecError> {
    let sum_us = r.long()?;
    let mut buckets = Vec::new();
    loop {
        let n = r.block()?;
        if n == 0 {
            return Ok(Histogram { sum_us, buckets });
        }
        // A block's count is bounded by the bytes left (`block`).
        buckets.reserve(n);
        for _ in 0..n {
            buckets.push(HistogramBucket {
                index: r.int()?,
                count: r.long()?,
            });
        }
    }
}

fn summary(r: &mut Reader<'_>, with_reporters: bool) -> Result<CallSummary, CodecError> {
    Ok(CallSummary {
        summary_id: r.string()?,
        pool: r.string()?,
        endpoint: r.string()?,
        gateway: r.string()?,
        started_at: r.long()?,
        ended_at: r.long()?,
        calls: OutcomeCounts {
            success: r.long()?,
            timeout: r.long()?,
            connect_error: r.long()?,
            connection_dropped: r.long()?,
            rate_limited: r.long()?,
            server_error: r.long()?,
            client_error: r.long()?,
            invalid_response: r.long()?,
            cancelled: r.long()?,
        },
        latency: histogram(r)?,
        ttft: histogram(r)?,
        leading_failures: r.int()?,
        longest_failure_run: r.int()?,
        trailing_failures: r.int()?,
        trailing_successes: r.int()?,
        longest_hard_run: r.int()?,
        trailing_hard: r.int()?,
        trailing_rate_limited: r.int()?,
        max_retry_after_ms: r.optional(Reader::long)?,
        models: {
            let mut v = Vec::new();
            r.items(|r| {
                v.push(r.string()?);
                Ok(())
            })?;
            v
        },
        reporters: if with_reporters {
            r.optional(|r| {
                let mut v = Vec::new();
                r.items(|r| {
                    v.push(reporter(r)?);
                    Ok(())
                })?;
                Ok(v)
            })?
        } else {
            None
        },
    })
}

fn reporter(r: &mut Reader<'_>) -> Result<ReporterCounts, CodecError> {
    let mut scopes = Vec::new();
    r.items(|r| {
        scopes.push(r.string()?);
        Ok(())
    })?;
    Ok(ReporterCounts {
        scopes,
        calls: r.long()?,
        failures: r.long()?,
        trailing_failures: r.long()?,
    })
}
