"""Security decisions, pure (spec/security.md): who a bearer token or a client certificate
names (`tokens`) and whether that principal may do something (`rbac`). The broker's request
path (`danube.runtime.auth`) only reads headers and asks here."""
