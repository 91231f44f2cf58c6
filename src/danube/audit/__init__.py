"""Correctness audits of a run (issue 7): the logs clients keep of what they were told and what
they received, and the decoding of stored segments into rows, for the Spark jobs in `spark/`
(spec/audit.md)."""
