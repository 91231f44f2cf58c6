"""The broker-node core: topics, producers, subscriptions and consumers of one broker as a pure
state machine. The trio runtime and the simulator drive the same class."""
