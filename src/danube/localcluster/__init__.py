"""Real processes on loopback for a local cluster, the tests and the benchmarks: etcd, an
S3-compatible server (moto's), and brokers."""
