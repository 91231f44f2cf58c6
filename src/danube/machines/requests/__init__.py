"""The broker's request paths, written once as flows (`danube.effects.flow`): publish (one
message and a batch), ack and nack (one and many), and the schema gate with its binding
cache. They hold the order and the decisions of each request (fence, topic served here,
schema check, pacing, the core call, waiting for storage); what they need from the world
they yield (`danube.machines.requests.effects`, `danube.effects`), so the gRPC services
(`danube.runtime.request_driver`) and the simulator (`sim/requests.py`) run the same code and
the simulator checks what production decides. Pure: no trio, asyncio, grpclib, os or time."""
