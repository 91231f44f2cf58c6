"""PySpark correctness audits (issue 7, spec/audit.md): `python -m spark.audit --help`."""
