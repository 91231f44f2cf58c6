"""The broker's pure state machines: each takes `now` and inputs and returns effects.

`wal` (one topic's write-ahead log), `dispatch` (subscriptions' delivery), `cluster`
(ownership, membership, the load manager), `node` (one broker's topics, routed by its core),
`tiering` (the object tier), `requests` (the request paths every runtime shares) and `schema`
(the registry and its compatibility rules). They import values and effects, never the runtime;
`tests/core/test_purity.py` follows their imports to prove it.
"""
