"""Cluster coordination as pure state machines: membership and leader election
(`membership`), and the leader's load manager (`load_manager`, scoring in `ranking`, key
layout in `keys`). See spec/cluster.md."""
