"""The per-topic write-ahead log: its on-disk format (spec/wal-format.md) and, as a pure state
machine, how appends become writes, fsyncs and acknowledgements."""
