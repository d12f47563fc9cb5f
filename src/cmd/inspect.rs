//! `pipeline data inspect FILE`: schema, row count and the first rows of any JSONL or Parquet
//! file the project reads or writes (long strings and lists are shortened for the screen).
//!
//! Reads only; knows nothing of what the columns mean.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use anyhow::{Context, Result};
use parquet::file::reader::{FileReader, SerializedFileReader};
use serde_json::Value;

use crate::bytes::format_bytes;
use crate::data::records::{read_records, FileKind};

const MAX_CHARS: usize = 160;
const MAX_ITEMS: usize = 12;

pub fn run(path: &Path, rows: usize) -> Result<()> {
    let bytes = crate::bytes::regular_file(path)?;
    let kind = FileKind::of(path)?;
    crate::outln!(
        "file: {} ({:?}, {})",
        path.display(),
        kind,
        format_bytes(bytes)
    );
    match kind {
        FileKind::Parquet => parquet_summary(path)?,
        FileKind::Jsonl => jsonl_summary(path)?,
    }
    crate::outln!("first {rows} rows:");
    for rec in read_records(path)?.take(rows) {
        let rec = rec.map_err(anyhow::Error::from)?;
        let shown = shorten(&Value::Object(rec.fields));
        crate::outln!("  [{}] {}", rec.row, shown);
    }
    Ok(())
}

fn parquet_summary(path: &Path) -> Result<()> {
    let reader = SerializedFileReader::new(File::open(path)?)
        .with_context(|| format!("{} is not a readable Parquet file", path.display()))?;
    let meta = reader.metadata();
    let fm = meta.file_metadata();
    crate::outln!(
        "rows: {}  row groups: {}  written by: {}",
        fm.num_rows(),
        meta.num_row_groups(),
        fm.created_by().unwrap_or("unknown")
    );
    if let Some(rg) = meta.row_groups().first() {
        if let Some(c) = rg.columns().first() {
            crate::outln!("compression: {:?}", c.compression());
        }
    }
    let schema =
        parquet::arrow::parquet_to_arrow_schema(fm.schema_descr(), fm.key_value_metadata())?;
    crate::outln!("schema:");
    for f in schema.fields() {
        crate::outln!(
            "  {}: {}{}",
            f.name(),
            f.data_type(),
            if f.is_nullable() { "" } else { " not null" }
        );
    }
    Ok(())
}

fn jsonl_summary(path: &Path) -> Result<()> {
    let n = read_records(path)?.count();
    crate::outln!("rows: {n}");
    let f = File::open(path)?;
    match arrow_json::reader::infer_json_schema(BufReader::new(f), Some(1000)) {
        Ok((schema, _)) => {
            crate::outln!("schema (inferred from the first 1000 rows):");
            for f in schema.fields() {
                crate::outln!("  {}: {}", f.name(), f.data_type());
            }
        }
        Err(e) => crate::outln!("schema: cannot infer ({e})"),
    }
    Ok(())
}

/// The value with long strings cut and long arrays elided, as one line of JSON.
fn shorten(v: &Value) -> Value {
    match v {
        Value::String(s) if s.chars().count() > MAX_CHARS => {
            let head: String = s.chars().take(MAX_CHARS).collect();
            Value::String(format!("{head}… ({} chars)", s.chars().count()))
        }
        Value::Array(a) if a.len() > MAX_ITEMS => {
            let mut out: Vec<Value> = a.iter().take(MAX_ITEMS).map(shorten).collect();
            out.push(Value::String(format!("… ({} items)", a.len())));
            Value::Array(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(shorten).collect()),
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), shorten(v))).collect()),
        other => other.clone(),
    }
}
