"""Helpers shared by the integration tests: real broker processes on loopback."""
