"""Metadata store tests: state machine semantics, every backend, durability and recovery."""
