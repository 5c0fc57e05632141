//! A minimal read-only reader of SQLite 3 database files, enough to walk a table's rows: the
//! file header, table b-trees (interior and leaf pages), overflow chains and the record format,
//! as documented in <https://www.sqlite.org/fileformat2.html>. No indexes, no WAL, UTF-8 only.
//!
//! It exists so the KJV corpus (shipped as a SQLite file in a PyPI wheel) can be read without a
//! C library. Every offset is checked against the page it lives in; a malformed file is an
//! [`EvalError::Sqlite`], never a panic, and page walks are bounded by the page count.

use crate::error::{EvalError, Result};

const MAGIC: &[u8; 16] = b"SQLite format 3\0";
const LEAF_TABLE: u8 = 0x0d;
const INTERIOR_TABLE: u8 = 0x05;
const MAX_DEPTH: usize = 64;

fn bad(reason: impl Into<String>) -> EvalError {
    EvalError::Sqlite { reason: reason.into() }
}

/// One column value of a row.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl Value {
    /// The text, if this is a text value.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Value::Text(s) => Some(s),
            _ => None,
        }
    }
}

/// The state of one table walk: pages visited and payload bytes the file can still hold.
struct Walk {
    visited: usize,
    payload_left: usize,
}

/// A database file's bytes with its validated header.
pub struct Database<'a> {
    data: &'a [u8],
    page_size: usize,
    usable: usize,
    page_count: usize,
}

impl std::fmt::Debug for Database<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database").field("page_size", &self.page_size).field("page_count", &self.page_count).finish()
    }
}

/// Reads a SQLite varint at `pos`: (value, bytes used).
pub fn read_varint(buf: &[u8], pos: usize) -> Result<(u64, usize)> {
    let mut v: u64 = 0;
    for i in 0..9 {
        let b = *buf.get(pos + i).ok_or_else(|| bad("varint runs past its page"))?;
        if i == 8 {
            return Ok(((v << 8) | u64::from(b), 9));
        }
        v = (v << 7) | u64::from(b & 0x7f);
        if b < 0x80 {
            return Ok((v, i + 1));
        }
    }
    unreachable!("the loop returns by its ninth byte")
}

fn be(buf: &[u8], pos: usize, len: usize) -> Result<u64> {
    let bytes = buf.get(pos..pos + len).ok_or_else(|| bad("field runs past its page"))?;
    Ok(bytes.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
}

impl<'a> Database<'a> {
    /// Validates the 100-byte header.
    pub fn new(data: &'a [u8]) -> Result<Self> {
        if data.len() < 100 || &data[..16] != MAGIC {
            return Err(bad("not a SQLite 3 database (bad magic)"));
        }
        let page_size = match be(data, 16, 2)? {
            1 => 65536,
            n => n as usize,
        };
        if !(512..=65536).contains(&page_size) || !page_size.is_power_of_two() {
            return Err(bad(format!("invalid page size {page_size}")));
        }
        let reserved = data[20] as usize;
        let usable = page_size - reserved;
        if usable < 480 {
            return Err(bad(format!("usable page size {usable} below 480")));
        }
        let encoding = be(data, 56, 4)?;
        if encoding != 1 {
            return Err(bad(format!("text encoding {encoding} is not UTF-8")));
        }
        if !data.len().is_multiple_of(page_size) {
            return Err(bad(format!("file size {} is not a multiple of the page size {page_size}", data.len())));
        }
        Ok(Self { data, page_size, usable, page_count: data.len() / page_size })
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    pub fn page_count(&self) -> usize {
        self.page_count
    }

    /// Page `n` (1-based).
    fn page(&self, n: u64) -> Result<&'a [u8]> {
        if n == 0 || n as usize > self.page_count {
            return Err(bad(format!("page {n} out of range 1..={}", self.page_count)));
        }
        let start = (n as usize - 1) * self.page_size;
        Ok(&self.data[start..start + self.page_size])
    }

    /// Walks the table b-tree rooted at `root` in rowid order, calling `row(rowid, values)`.
    ///
    /// Each byte of a table's payloads is stored once in the file, so the walk stops with an
    /// error once the cells' payloads add up to more than the file: cell pointers that share a
    /// cell, or overflow chains that share pages, cannot make a small file decode into rows many
    /// times its size.
    pub fn for_each_row(&self, root: u64, mut row: impl FnMut(i64, Vec<Value>) -> Result<()>) -> Result<()> {
        let mut walk = Walk { visited: 0, payload_left: self.data.len() };
        self.walk(root, 0, &mut walk, &mut row)
    }

    fn walk(
        &self,
        n: u64,
        depth: usize,
        walk: &mut Walk,
        row: &mut dyn FnMut(i64, Vec<Value>) -> Result<()>,
    ) -> Result<()> {
        walk.visited += 1;
        if depth > MAX_DEPTH || walk.visited > self.page_count {
            return Err(bad("b-tree deeper than the file or with a cycle"));
        }
        let page = self.page(n)?;
        let hdr = if n == 1 { 100 } else { 0 };
        let kind = *page.get(hdr).ok_or_else(|| bad("empty page"))?;
        let cells = be(page, hdr + 3, 2)? as usize;
        let (ptrs, interior) = match kind {
            LEAF_TABLE => (hdr + 8, false),
            INTERIOR_TABLE => (hdr + 12, true),
            other => return Err(bad(format!("page {n}: type {other:#04x} is not a table b-tree page"))),
        };
        if ptrs + 2 * cells > self.usable {
            return Err(bad(format!("page {n}: {cells} cells do not fit")));
        }
        for i in 0..cells {
            let off = be(page, ptrs + 2 * i, 2)? as usize;
            if off >= self.usable {
                return Err(bad(format!("page {n}: cell offset {off} past the usable size")));
            }
            if interior {
                let child = be(page, off, 4)?;
                self.walk(child, depth + 1, walk, row)?;
            } else {
                let (rowid, values) = self.leaf_cell(page, off, &mut walk.payload_left)?;
                row(rowid, values)?;
            }
        }
        if interior {
            let right = be(page, hdr + 8, 4)?;
            self.walk(right, depth + 1, walk, row)?;
        }
        Ok(())
    }

    /// A table leaf cell at `off`: its rowid and decoded record. `payload_left` is what the
    /// walk's payloads may still add up to.
    fn leaf_cell(&self, page: &[u8], off: usize, payload_left: &mut usize) -> Result<(i64, Vec<Value>)> {
        let page = &page[..self.usable];
        let (size, a) = read_varint(page, off)?;
        let (rowid, b) = read_varint(page, off + a)?;
        let start = off + a + b;
        let size = usize::try_from(size).map_err(|_| bad("payload size overflows"))?;
        if size > *payload_left {
            return Err(bad(format!(
                "payload of {size} bytes: the table's payloads add up to more than the {}-byte file (shared cells \
                 or overflow pages)",
                self.data.len()
            )));
        }
        *payload_left -= size;
        let u = self.usable;
        let x = u - 35;
        let local = if size <= x {
            size
        } else {
            let m = ((u - 12) * 32 / 255) - 23;
            let k = m + (size - m) % (u - 4);
            if k <= x { k } else { m }
        };
        let mut payload = Vec::with_capacity(size);
        payload.extend_from_slice(page.get(start..start + local).ok_or_else(|| bad("cell runs past its page"))?);
        if local < size {
            let mut next = be(page, start + local, 4)?;
            let mut hops = 0usize;
            while payload.len() < size {
                hops += 1;
                if next == 0 || hops > self.page_count {
                    return Err(bad("overflow chain ends early or loops"));
                }
                let over = &self.page(next)?[..u];
                next = be(over, 0, 4)?;
                let take = (size - payload.len()).min(u - 4);
                payload.extend_from_slice(&over[4..4 + take]);
            }
        }
        Ok((rowid as i64, decode_record(&payload)?))
    }

    /// Root page and `CREATE TABLE` text of table `name` (from `sqlite_schema` on page 1).
    pub fn table(&self, name: &str) -> Result<(u64, String)> {
        let mut found = None;
        self.for_each_row(1, |_, values| {
            if let [Value::Text(kind), Value::Text(n), _, Value::Integer(root), Value::Text(sql), ..] =
                values.as_slice()
                && kind == "table"
                && n == name
            {
                found = Some((*root as u64, sql.clone()));
            }
            Ok(())
        })?;
        found.ok_or_else(|| bad(format!("no table {name:?}")))
    }

    /// Column names of table `name`, in order.
    pub fn columns(&self, name: &str) -> Result<Vec<String>> {
        let (_, sql) = self.table(name)?;
        column_names(&sql)
    }

    /// Every row of table `name`, in rowid order: (rowid, values).
    pub fn rows(&self, name: &str) -> Result<Vec<(i64, Vec<Value>)>> {
        let (root, _) = self.table(name)?;
        let mut rows = Vec::new();
        self.for_each_row(root, |rowid, values| {
            rows.push((rowid, values));
            Ok(())
        })?;
        Ok(rows)
    }
}

/// Column names of a simple `CREATE TABLE name(col TYPE, ...)` statement (no table constraints).
pub fn column_names(sql: &str) -> Result<Vec<String>> {
    let (open, close) = match (sql.find('('), sql.rfind(')')) {
        (Some(o), Some(c)) if o < c => (o, c),
        _ => return Err(bad(format!("cannot read columns of {sql:?}"))),
    };
    sql[open + 1..close]
        .split(',')
        .map(|def| {
            def.split_whitespace()
                .next()
                .map(|n| n.trim_matches(|c| c == '"' || c == '`' || c == '[' || c == ']').to_string())
                .ok_or_else(|| bad(format!("empty column definition in {sql:?}")))
        })
        .collect()
}

/// Decodes a record: a header of serial types, then the values.
pub fn decode_record(payload: &[u8]) -> Result<Vec<Value>> {
    let (hsize, mut pos) = read_varint(payload, 0)?;
    let hsize = usize::try_from(hsize).map_err(|_| bad("record header size overflows"))?;
    if hsize > payload.len() || hsize < pos {
        return Err(bad(format!("record header of {hsize} bytes in a {}-byte payload", payload.len())));
    }
    let mut body = hsize;
    let mut values = Vec::new();
    while pos < hsize {
        let (t, used) = read_varint(&payload[..hsize], pos)?;
        pos += used;
        let int = |len: usize, body: usize| -> Result<i64> {
            let raw = be(payload, body, len).map_err(|_| bad("record value runs past its payload"))?;
            let shift = 64 - 8 * len as u32;
            Ok(((raw << shift) as i64) >> shift)
        };
        let (value, len) = match t {
            0 => (Value::Null, 0),
            1..=4 => (Value::Integer(int(t as usize, body)?), t as usize),
            5 => (Value::Integer(int(6, body)?), 6),
            6 => (Value::Integer(int(8, body)?), 8),
            7 => (Value::Real(f64::from_bits(int(8, body)? as u64)), 8),
            8 => (Value::Integer(0), 0),
            9 => (Value::Integer(1), 0),
            10 | 11 => return Err(bad(format!("reserved serial type {t}"))),
            _ => {
                let len = usize::try_from((t - 12) / 2).map_err(|_| bad("value length overflows"))?;
                let bytes = payload
                    .get(body..body.saturating_add(len))
                    .ok_or_else(|| bad("record value runs past its payload"))?;
                if t % 2 == 0 {
                    (Value::Blob(bytes.to_vec()), len)
                } else {
                    let text = std::str::from_utf8(bytes).map_err(|_| bad("text value is not UTF-8"))?;
                    (Value::Text(text.to_string()), len)
                }
            }
        };
        body += len;
        values.push(value);
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_by_hand() {
        assert_eq!(read_varint(&[0x00], 0).unwrap(), (0, 1));
        assert_eq!(read_varint(&[0x7f], 0).unwrap(), (127, 1));
        // 0x81 0x00 = 1 << 7.
        assert_eq!(read_varint(&[0x81, 0x00], 0).unwrap(), (128, 2));
        // 0x82 0xac 0x00 = (2 << 14) | (0x2c << 7) = 32768 + 5632.
        assert_eq!(read_varint(&[0xff, 0x82, 0xac, 0x00], 1).unwrap(), (38400, 3));
        // Nine bytes: eight 7-bit groups then a full byte = all ones.
        assert_eq!(read_varint(&[0xff; 9], 0).unwrap(), (u64::MAX, 9));
        assert!(read_varint(&[0x80, 0x80], 0).is_err());
    }

    #[test]
    fn record_by_hand() {
        // Header: size 6; types NULL, int8 (1), int24 (3), text of 2 bytes (17), blob of 1 (14).
        // Body: 0xfe = -2, 0x800000 as signed 24-bit = -8388608, "hi", [0xaa].
        let payload = [6, 0, 1, 3, 17, 14, 0xfe, 0x80, 0x00, 0x00, b'h', b'i', 0xaa];
        assert_eq!(
            decode_record(&payload).unwrap(),
            vec![
                Value::Null,
                Value::Integer(-2),
                Value::Integer(-8388608),
                Value::Text("hi".into()),
                Value::Blob(vec![0xaa])
            ]
        );
        // Constants 0 and 1, and a float 1.5 = 0x3ff8000000000000.
        let payload = [4, 8, 9, 7, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0];
        assert_eq!(decode_record(&payload).unwrap(), vec![Value::Integer(0), Value::Integer(1), Value::Real(1.5)]);
    }

    #[test]
    fn malformed_records_are_errors() {
        assert!(decode_record(&[9, 1]).is_err()); // header longer than the payload
        assert!(decode_record(&[2, 6, 1, 2]).is_err()); // int64 with 2 body bytes
        assert!(decode_record(&[2, 19, b'a']).is_err()); // 3-byte text, 1 byte there
        assert!(decode_record(&[2, 10]).is_err()); // reserved type
        assert!(decode_record(&[2, 15, 0xff]).is_err()); // invalid UTF-8
    }

    #[test]
    fn column_names_of_create_table() {
        let sql = "CREATE TABLE Bible(\n  TestamentID INT,\n  Index_ TEXT,\n  \"Passage1\" TEXT\n)";
        assert_eq!(column_names(sql).unwrap(), vec!["TestamentID", "Index_", "Passage1"]);
        assert_eq!(column_names("CREATE TABLE t(a, b INT)").unwrap(), vec!["a", "b"]);
        assert!(column_names("CREATE TABLE t").is_err());
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Every row of a 512-byte-page database written by Python's sqlite3 (interior pages,
    /// overflow chains, deleted rows, every integer width, reals, NULLs, blobs), against the rows
    /// Python read back (tests/data/make_fixtures.py).
    #[test]
    fn matches_pythons_sqlite3_on_a_fixture() {
        let db = Database::new(include_bytes!("../tests/data/mixed.db")).unwrap();
        assert_eq!(db.page_size(), 512);
        assert_eq!(db.columns("t").unwrap(), vec!["a", "b", "c", "d", "e"]);
        let rows = db.rows("t").unwrap();
        let want: Vec<serde_json::Value> = serde_json::from_str(include_str!("../tests/data/mixed.json")).unwrap();
        assert_eq!(rows.len(), want.len());
        assert!(rows.iter().any(|(_, v)| v[1].as_text().is_some_and(|t| t.len() > 1000)), "no overflow row");
        for ((rowid, values), want) in rows.iter().zip(&want) {
            let want = want.as_array().unwrap();
            assert_eq!(*rowid, want[0].as_i64().unwrap());
            let as_json = |v: &Value| match v {
                Value::Null => serde_json::Value::Null,
                Value::Integer(i) => serde_json::json!(i),
                Value::Real(f) => serde_json::json!(f),
                Value::Text(s) => serde_json::json!(s),
                Value::Blob(b) => serde_json::json!(hex(b)),
            };
            let got: Vec<_> = values.iter().map(as_json).collect();
            assert_eq!(got.as_slice(), &want[1..], "row {rowid}");
        }
        assert_eq!(db.rows("other").unwrap(), vec![(1, vec![Value::Text("not this one".into())])]);
        assert!(db.table("missing").unwrap_err().to_string().contains("no table \"missing\""));
    }

    #[test]
    fn truncated_or_corrupt_files_are_errors_not_panics() {
        let data = include_bytes!("../tests/data/mixed.db");
        let db = Database::new(data).unwrap();
        let (root, _) = db.table("t").unwrap();
        // Cut the file to fewer pages: a child or overflow page goes missing.
        let cut = &data[..512 * 40];
        let short = Database::new(cut).unwrap();
        assert!(short.rows("t").is_err());
        // Point the root page's right-most child at itself: a cycle.
        let mut looped = data.to_vec();
        let at = (root as usize - 1) * 512;
        assert_eq!(looped[at], INTERIOR_TABLE);
        looped[at + 8..at + 12].copy_from_slice(&(root as u32).to_be_bytes());
        assert!(Database::new(&looped).unwrap().rows("t").is_err());
        // Flip bytes all over one page at a time: never a panic.
        for page in 1..db.page_count() {
            let mut broken = data.to_vec();
            for b in &mut broken[page * 512..page * 512 + 512].iter_mut().step_by(3) {
                *b ^= 0x5a;
            }
            let _ = Database::new(&broken).and_then(|d| d.rows("t"));
        }
    }

    /// Cell pointers sharing one cell and its overflow chain (tests/data/make_shared_cells.py):
    /// 8 KiB that decoded into about 1 GB of values before the walk's payloads were bounded by
    /// the file size (found by fuzzing).
    #[test]
    fn shared_cells_cannot_multiply_the_payload() {
        let data = include_bytes!("../tests/data/shared-cells.db");
        let db = Database::new(data).unwrap();
        assert_eq!(db.columns("t").unwrap(), vec!["a"]);
        let err = db.rows("t").unwrap_err().to_string();
        assert!(err.contains("add up to more than the 8192-byte file"), "{err}");
        let mut rows = 0;
        let _ = db.for_each_row(2, |_, values| {
            rows += 1;
            assert_eq!(values.len(), 6583);
            Ok(())
        });
        assert_eq!(rows, 1, "the first cell is read, the second one sharing its bytes is refused");
    }

    #[test]
    fn bad_headers_are_errors() {
        assert!(Database::new(b"not a database").is_err());
        let mut data = vec![0u8; 1024];
        data[..16].copy_from_slice(MAGIC);
        data[16..18].copy_from_slice(&1000u16.to_be_bytes());
        assert!(Database::new(&data).unwrap_err().to_string().contains("page size 1000"));
        data[16..18].copy_from_slice(&512u16.to_be_bytes());
        data[56..60].copy_from_slice(&2u32.to_be_bytes());
        assert!(Database::new(&data).unwrap_err().to_string().contains("not UTF-8"));
        data[56..60].copy_from_slice(&1u32.to_be_bytes());
        let db = Database::new(&data).unwrap();
        assert_eq!((db.page_size(), db.page_count()), (512, 2));
        // Page 1 is all zeros after the header: type 0 is not a table page.
        assert!(db.table("t").is_err());
        data.truncate(1000);
        assert!(Database::new(&data).is_err());
    }
}
