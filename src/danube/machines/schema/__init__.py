"""The schema registry: schema types, fingerprints, compatibility rules and the registry's
state machine (issue 8, spec/schema-registry.md)."""
