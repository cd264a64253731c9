//! A walk over an Avro binary datum that checks every length and count against the bytes that
//! remain, before any decoder allocates for them.
//!
//! apache-avro trusts an array's or map's block count: a 61-byte record that announces
//! 400,000,000 map entries makes it reserve tens of gigabytes and the process aborts. Every
//! datum therefore passes through [`check`] first. The walk allocates nothing: it only moves a
//! cursor. A block may not announce more items than bytes remain, and a whole record may not
//! hold more items than it has bytes, which also bounds zero-size items (`null`).

use apache_avro::Schema;
use std::collections::HashMap;

/// Nesting deeper than this is refused (our schemas nest three levels; recursion is a lie).
const MAX_DEPTH: usize = 32;

struct Walk<'a> {
    rest: &'a [u8],
    names: HashMap<String, &'a Schema>,
    /// Items (array elements, map entries) this datum may still announce.
    item_budget: usize,
}

/// Check that `body` is one well-formed datum of `schema` whose every count and length fits the
/// bytes it has. Returns the number of bytes the datum takes.
pub fn check(schema: &Schema, body: &[u8]) -> Result<usize, String> {
    let mut names = HashMap::new();
    collect_names(schema, &mut names);
    let mut w = Walk {
        rest: body,
        names,
        item_budget: body.len(),
    };
    w.value(schema, 0)?;
    Ok(body.len() - w.rest.len())
}

fn collect_names<'a>(schema: &'a Schema, names: &mut HashMap<String, &'a Schema>) {
    match schema {
        Schema::Record(r) => {
            names.insert(r.name.fullname(None), schema);
            for f in &r.fields {
                collect_names(&f.schema, names);
            }
        }
        Schema::Enum(e) => {
            names.insert(e.name.fullname(None), schema);
        }
        Schema::Fixed(f) => {
            names.insert(f.name.fullname(None), schema);
        }
        Schema::Array(a) => collect_names(&a.items, names),
        Schema::Map(m) => collect_names(&m.types, names),
        Schema::Union(u) => u.variants().iter().for_each(|v| collect_names(v, names)),
        Schema::Decimal(d) => collect_names(&d.inner, names),
        _ => {}
    }
}

impl<'a> Walk<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<(), String> {
        if n > self.rest.len() {
            return Err(format!(
                "{what} of {n} bytes but only {} bytes remain (truncated or forged)",
                self.rest.len()
            ));
        }
        self.rest = &self.rest[n..];
        Ok(())
    }

    fn long(&mut self) -> Result<i64, String> {
        let mut n: u64 = 0;
        for shift in (0..70).step_by(7) {
            let (&b, rest) = self.rest.split_first().ok_or("record is truncated")?;
            self.rest = rest;
            n |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok((n >> 1) as i64 ^ -((n & 1) as i64));
            }
        }
        Err("variable-length integer longer than 10 bytes".into())
    }

    fn int(&mut self) -> Result<(), String> {
        let v = self.long()?;
        i32::try_from(v)
            .map(|_| ())
            .map_err(|_| format!("{v} does not fit an int"))
    }

    fn length(&mut self, what: &str) -> Result<usize, String> {
        let n = self.long()?;
        usize::try_from(n).map_err(|_| format!("negative {what} length {n}"))
    }

    /// The item count of the next block of an array or map (0 ends it), bounded by the bytes left
    /// and by the record's item budget.
    fn block(&mut self, what: &str) -> Result<usize, String> {
        let mut n = self.long()?;
        if n < 0 {
            n = n.checked_neg().ok_or("bad block count")?;
            let size = self.long()?;
            if usize::try_from(size).map_or(true, |s| s > self.rest.len()) {
                return Err(format!(
                    "{what} block of {size} bytes but only {} remain",
                    self.rest.len()
                ));
            }
        }
        let n = usize::try_from(n).map_err(|_| "bad block count".to_string())?;
        if n > self.rest.len() || n > self.item_budget {
            return Err(format!(
                "{what} block announces {n} items but only {} bytes remain",
                self.rest.len()
            ));
        }
        self.item_budget -= n;
        Ok(n)
    }

    fn index(&mut self, n: usize, what: &str) -> Result<usize, String> {
        let i = self.long()?;
        usize::try_from(i)
            .ok()
            .filter(|i| *i < n)
            .ok_or_else(|| format!("{what} index {i} out of range"))
    }

    fn value(&mut self, schema: &Schema, depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("schema nests too deeply".into());
        }
        match schema {
            Schema::Null => Ok(()),
            Schema::Boolean => match self.rest.first() {
                Some(0 | 1) => self.take(1, "boolean"),
                Some(b) => Err(format!("{b} is not a boolean")),
                None => Err("record is truncated".into()),
            },
            Schema::Int | Schema::Date | Schema::TimeMillis => self.int(),
            Schema::Long
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => self.long().map(|_| ()),
            Schema::Float => self.take(4, "float"),
            Schema::Double => self.take(8, "double"),
            Schema::Bytes | Schema::String | Schema::BigDecimal | Schema::Uuid => {
                let n = self.length("string")?;
                self.take(n, "string")
            }
            Schema::Fixed(f) => self.take(f.size, "fixed"),
            Schema::Duration => self.take(12, "duration"),
            Schema::Decimal(d) => self.value(&d.inner, depth + 1),
            Schema::Enum(e) => self.index(e.symbols.len(), "enum").map(|_| ()),
            Schema::Union(u) => {
                let i = self.index(u.variants().len(), "union")?;
                self.value(&u.variants()[i], depth + 1)
            }
            Schema::Record(r) => {
                for f in &r.fields {
                    self.value(&f.schema, depth + 1)?;
                }
                Ok(())
            }
            Schema::Array(a) => loop {
                let n = self.block("array")?;
                if n == 0 {
                    return Ok(());
                }
                for _ in 0..n {
                    self.value(&a.items, depth + 1)?;
                }
            },
            Schema::Map(m) => loop {
                let n = self.block("map")?;
                if n == 0 {
                    return Ok(());
                }
                for _ in 0..n {
                    let k = self.length("map key")?;
                    self.take(k, "map key")?;
                    self.value(&m.types, depth + 1)?;
                }
            },
            Schema::Ref { name } => {
                let target = *self
                    .names
                    .get(&name.fullname(None))
                    .ok_or_else(|| format!("unknown named type {}", name.fullname(None)))?;
                self.value(target, depth + 1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(text: &str) -> Schema {
        Schema::parse_str(text).unwrap()
    }

    #[test]
    fn a_map_that_announces_more_entries_than_bytes_is_refused_before_any_allocation() {
        let s = schema(r#"{"type":"map","values":"string"}"#);
        // 400,000,000 entries, zig-zag varint, then two bytes.
        let mut body = Vec::new();
        let mut n: u64 = 800_000_000;
        while n >= 0x80 {
            body.push((n as u8 & 0x7f) | 0x80);
            n >>= 7;
        }
        body.push(n as u8);
        body.extend_from_slice(b"\x02k");
        let e = check(&s, &body).unwrap_err();
        assert!(e.contains("400000000 items"), "{e}");
    }

    #[test]
    fn zero_size_items_are_bounded_by_the_record_length() {
        let s = schema(r#"{"type":"array","items":"null"}"#);
        // Ten blocks of 8 nulls each in 11 bytes: more items than bytes.
        let mut body = vec![0x10; 10];
        body.push(0);
        assert!(check(&s, &body).is_err());
        assert_eq!(check(&s, &[0x02, 0x00]), Ok(2));
    }

    #[test]
    fn strings_longer_than_the_record_are_refused() {
        let s = schema(r#""string""#);
        assert!(check(&s, &[0xfe, 0xff, 0xff, 0xff, 0x0f, b'a']).is_err());
        assert_eq!(check(&s, &[0x02, b'a']), Ok(2));
    }
}
