"""Generated wire types (betterproto). Regenerate with `nox -s protos`; never edit."""
