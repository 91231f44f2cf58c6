"""The audit tests share the session-wide `spark` fixture of tests/conftest.py (the
real-process tests of tests/broker audit their runs with it too)."""
