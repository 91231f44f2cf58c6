"""Cluster coordination as pure state machines: membership and leader election
(`membership`), topic ownership (`ownership`), and the leader's load manager (`load_manager`,
its effects in `load_manager_effects`, scoring in `ranking`); the values under `/cluster/` are
in `records`, the keys in `danube.keys`. See spec/cluster.md."""
