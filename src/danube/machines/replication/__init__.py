"""Replication of a reliable topic's WAL tail to its followers before acknowledgement
(spec/replication.md), as two pure machines: `OwnerReplication` on the topic's owner and
`FollowerLog` on each follower. Both take inputs and return effects, like the WAL machine,
so the broker's runtime and the simulator drive the very same decisions."""
