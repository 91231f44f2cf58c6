"""Danube for Python: a Danube-compatible message broker."""
