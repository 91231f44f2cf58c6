"""The broker's memory budget (spec/memory.md): accounting, pools, the cache ledger."""
