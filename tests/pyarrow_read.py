"""Reads Parquet files written by `pipeline` with pyarrow and prints one JSON line per file:
its row count, column names and types, and the first row. Used by tests/pyarrow.rs."""
import json
import sys

import pyarrow.parquet as pq

for path in sys.argv[1:]:
    table = pq.read_table(path)
    first = table.slice(0, 1).to_pylist()
    print(json.dumps({
        "path": path,
        "rows": table.num_rows,
        "columns": {f.name: str(f.type) for f in table.schema},
        "compression": pq.ParquetFile(path).metadata.row_group(0).column(0).compression
        if table.num_rows else None,
        "first": first[0] if first else None,
    }, default=str))
