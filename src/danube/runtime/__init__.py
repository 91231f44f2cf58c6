"""The trio runtime: sockets, files and time. It executes the core's effects and decides
nothing itself.

A broker may run on etcd, whose generated code (etcd3) needs protobuf's pure-Python
implementation, and protobuf picks its implementation once per process, when it is first
imported. The schema registry imports protobuf as soon as the broker's modules load, long
before the configuration says whether etcd is used, so the choice is made here, first."""

import os

os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
