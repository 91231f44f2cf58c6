"""Cluster benchmarks with real processes (`danube.localcluster`: etcd, moto's S3 server,
broker processes in cluster mode) and our client in this process.

- `failover`: a reliable topic (`object` level) with one sequential producer (each send waits
  for its acknowledgement, then 10 ms: at most 100 msg/s, fewer at `object`); its owner is
  SIGKILLed; measures SIGKILL → the new owner loaded the topic (its log) and SIGKILL → the
  consumer's first message from the new owner. A fresh broker replaces the dead one before the
  next round, so every round starts with the same number of brokers.
- `failover-many`: issue 23 point 4. `--topics` reliable topics (`fsync`) spread over three
  brokers by the load manager, one producer each (our client, with the official clients'
  backoff schedule, or with `--fast-retry` a short one so the client's own waits hide less
  of the broker's, at the price of more lookups on the survivors); the
  broker owning the most apart from the leader (as in issue 23's 24 s) is SIGKILLed and every
  one of its topics gets one send. Measures SIGKILL → each of its topics loaded by a new owner
  (`event=topic_loaded` in the survivors' logs) and → that send acknowledged, split by the
  leader's log: `FailOver` commits (the first one follows the lease's expiry), `Assign`
  commits (the etcd writes), the new owners' loads. `--profile DIR` records py-spy raw flame
  data of the survivors for `--profile-s` seconds from the kill.
- `assign`: topics created one at a time by a producer: first CreateProducer → producer ready
  (the first attempt answers UNAVAILABLE while the leader assigns the new topic).
- `throughput`: `--topics` reliable topics (`fsync`), one producer each with `--window` sends
  in flight, 1 KiB payloads for `--seconds`; aggregate acknowledged msg/s, for each broker
  count in `--brokers` (with two brokers or more each topic replicates to a follower).
- `latency`: one sequential producer (`fsync`, 100 B): publish → acknowledgement p50 and p99,
  replicated with two brokers or more.
- `e2e`: issue 27 point 6. An open-loop producer at `--rate` msg/s (`--size` B, sends start on
  schedule whether or not earlier ones were acknowledged) on a reliable topic (`fsync`,
  replicated to a follower with two brokers or more), and a consumer on the same topic
  acknowledging every message: publish → acknowledgement and publish → delivered p50/p99,
  the achieved publish and delivery rates, each message checked delivered exactly once, and
  the topic's replication at the end (followers, in-sync), for each broker count.

    .venv/bin/python -m bench.cluster_e2e failover --rounds 3
    .venv/bin/python -m bench.cluster_e2e failover-many --topics 700 --lease-ttl-ms 10000
    .venv/bin/python -m bench.cluster_e2e assign --topics 50
    .venv/bin/python -m bench.cluster_e2e throughput --brokers 1 3 --topics 12 --seconds 20
    .venv/bin/python -m bench.cluster_e2e latency --brokers 1 3 --sends 300
    .venv/bin/python -m bench.cluster_e2e e2e --brokers 1 3 --rate 1000 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable
from pathlib import Path

from grpclib.client import Channel

from bench import stage_breakdown
from bench.e2e_reliable import _HEAD, _payload
from danube.client import DanubeClient, DispatchStrategy, RetryPolicy, SubType
from danube.localcluster.broker_process import BrokerProcess
from danube.localcluster.cluster import ClusterSettings, LocalCluster
from danube.proto import danube_ext as ext_pb

PAYLOAD = b"x" * 1024


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def _failover_round(cluster: LocalCluster, topic: str) -> tuple[float, float]:
    urls = ",".join(cluster.service_urls)
    async with DanubeClient(urls) as client:
        producer = await client.producer(topic, "p", dispatch=DispatchStrategy.RELIABLE).create()
        consumer = await client.consumer(topic, "c", "s", sub_type=SubType.EXCLUSIVE).subscribe()
        sent_at: dict[int, float] = {}
        received: list[tuple[float, int]] = []
        stop = asyncio.Event()

        async def produce() -> None:
            sequence = 0
            while not stop.is_set():
                sent_at[sequence] = time.monotonic()
                await producer.send(str(sequence).encode().ljust(len(PAYLOAD)))
                sequence += 1
                await asyncio.sleep(0.01)

        async def consume() -> None:
            async for message in consumer:
                received.append((time.monotonic(), int(message.payload.strip())))
                await consumer.ack(message)

        def served_after(moment: float) -> list[float]:
            """Receipts of messages sent after `moment` (earlier ones may have waited in
            the client's buffers)."""
            return [at for at, seq in received if sent_at[seq] > moment]

        tasks = [asyncio.create_task(produce()), asyncio.create_task(consume())]
        while len(received) < 50:
            await asyncio.sleep(0.05)
        victim = cluster.owner(topic)
        survivors = [b for b in cluster.brokers if b is not victim]
        victim.kill()
        killed = time.monotonic()
        while not any(topic in b.loaded_topics() for b in survivors):
            await asyncio.sleep(0.02)
        loaded = time.monotonic() - killed
        while not served_after(killed):
            await asyncio.sleep(0.01)
        first = min(served_after(killed)) - killed
        stop.set()
        for task in tasks:
            task.cancel()
        return loaded, first


def failover(args: argparse.Namespace, root: Path) -> None:
    settings = ClusterSettings(
        brokers=3, lease_ttl_ms=args.lease_ttl_ms, durability="object", object_batch_ms=20
    )
    loaded, served = [], []
    with LocalCluster(root, settings) as cluster:
        for round_ in range(args.rounds):
            took = asyncio.run(_failover_round(cluster, f"/default/failover-{round_}"))
            loaded.append(took[0])
            served.append(took[1])
            print(f"round {round_}: loaded by the new owner {took[0]:.2f} s, "
                  f"first message served {took[1]:.2f} s after SIGKILL", flush=True)  # fmt: skip
            cluster.add_broker()
    print(f"lease TTL {args.lease_ttl_ms} ms; over {args.rounds} rounds: loaded median "
          f"{statistics.median(loaded):.2f} s (max {max(loaded):.2f}), first message served "
          f"median {statistics.median(served):.2f} s (max {max(served):.2f})")  # fmt: skip


_FAST_RETRY = RetryPolicy(base_backoff_s=0.1, max_backoff_s=1.0, min_elapsed_s=120.0)
"""The official clients' schedule (0.2 s more each attempt, up to 5 s) would add up to 5 s of
the client's own waiting to a failover; a floor of 50 ms kept 234 producers at about 1,600
lookups a second against the survivors (issue 23's first run), load of the bench's making."""
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*?event=(\S+)(.*)$")


def _events(broker: BrokerProcess, event: str) -> list[tuple[float, str]]:
    """(Unix time, rest of the line) of each `event=...` line in the broker's log (its
    asctime is local time, as `datetime.timestamp` reads a naive one)."""
    found = []
    for line in list(broker.log_lines):
        match = _STAMP.match(line)
        if match and match.group(2) == event:
            at = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            found.append((at, match.group(3)))
    return found


async def _create_many(client: DanubeClient, topics: list[str]) -> dict[str, object]:
    """One reliable producer per topic, created 16 at a time, each with one message sent."""
    producers: dict[str, object] = {}
    limit = asyncio.Semaphore(16)

    async def one(topic: str) -> None:
        async with limit:
            producer = await client.producer(
                topic, "p", dispatch=DispatchStrategy.RELIABLE
            ).create()
            await _send_until_acked(producer)
            producers[topic] = producer

    await asyncio.gather(*(one(t) for t in topics))
    return producers


async def _send_until_acked(producer: object) -> float:
    """Unix time the first send acknowledged (sends that fail are made again at once)."""
    while True:
        try:
            await producer.send(PAYLOAD[:100])  # type: ignore[attr-defined]
            return time.time()
        except Exception:  # any failure here means "not served yet"
            await asyncio.sleep(0.05)


async def _failover_many(cluster: LocalCluster, args: argparse.Namespace) -> None:
    # asyncio warns once per write to the dead broker's connections; hundreds of lines
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    topics = [f"/default/fo-{i}" for i in range(args.topics)]
    retry = _FAST_RETRY if args.fast_retry else RetryPolicy(min_elapsed_s=120.0)
    async with DanubeClient(",".join(cluster.service_urls), retry=retry) as client:
        started = time.monotonic()
        producers = await _create_many(client, topics)
        print(f"{len(topics)} topics created with a producer and a message each in "
              f"{time.monotonic() - started:.1f} s", flush=True)  # fmt: skip
        await asyncio.sleep(args.settle_s)  # followers in sync, load reports in
        owned = {b: {t for t in b.loaded_topics()} for b in cluster.brokers}
        leader = max(
            cluster.brokers,
            key=lambda b: max((at for at, _ in _events(b, "leader_elected")), default=0.0),
        )
        victim = max((b for b in cluster.brokers if b is not leader), key=lambda b: len(owned[b]))
        mine = sorted(owned[victim])
        survivors = [b for b in cluster.brokers if b is not victim]
        before = {b: len(_events(b, "topic_loaded")) for b in survivors}
        marks = {b: len(b.log_lines) for b in survivors}
        print(f"topics per broker {[len(owned[b]) for b in cluster.brokers]}; killing broker "
              f"pid {victim.pid} with {len(mine)}; leader pid {leader.pid}; load average "
              f"{os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
        spies = []
        if args.profile:
            Path(args.profile).mkdir(parents=True, exist_ok=True)
            spy = Path(sys.executable).with_name("py-spy")
            for b in survivors:
                role = "leader" if b is leader else "owner"
                out = Path(args.profile) / f"{role}-{b.pid}.txt"
                spies.append(subprocess.Popen(
                    [str(spy), "record", "-p", str(b.pid), "-r", "200", "--format", "raw",
                     "-o", str(out), "-d", str(args.profile_s)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                ))  # fmt: skip
            await asyncio.sleep(1.0)  # py-spy attached
        cpu_at_kill = {b: _cpu_s(b.pid) for b in survivors}
        os.kill(victim.pid, signal.SIGKILL)
        killed = time.time()
        sends = {t: asyncio.ensure_future(_send_until_acked(producers[t])) for t in mine}
        deadline = time.monotonic() + args.timeout_s
        while time.monotonic() < deadline:
            loaded = {
                line.split()[0].removeprefix("topic=")
                for b in survivors
                for _, line in _events(b, "topic_loaded")[before[b]:]
            }  # fmt: skip
            if loaded >= set(mine) and all(s.done() for s in sends.values()):
                break
            await asyncio.sleep(0.1)
        else:
            waiting = sum(not s.done() for s in sends.values())
            print(f"TIMEOUT: {len(set(mine) - loaded)} topics not loaded, "
                  f"{waiting} sends not acknowledged")  # fmt: skip
        cpu = {b.pid: _cpu_s(b.pid) - cpu_at_kill[b] for b in survivors}
        victim.kill()
        for spy_process in spies:
            spy_process.wait(args.profile_s + 30)
    acked = [s.result() - killed for s in sends.values() if s.done()]
    load_at = {}
    for b in survivors:
        for at, line in _events(b, "topic_loaded")[before[b] :]:
            topic = line.split()[0].removeprefix("topic=")
            if topic in owned[victim]:
                load_at[topic] = at - killed

    def of_victim(event: str) -> list[float]:
        return [
            at - killed
            for at, rest in _events(leader, event)
            if at > killed and rest.split()[0].removeprefix("topic=") in owned[victim]
        ]

    fails, assigns = of_victim("topic_failover"), of_victim("topic_assign")
    if args.logs:
        Path(args.logs).mkdir(parents=True, exist_ok=True)
        for b in survivors:
            role = "leader" if b is leader else "owner"
            lines = b.log_lines[marks[b] :]
            (Path(args.logs) / f"{role}-{b.pid}.log").write_text("".join(f"{x}\n" for x in lines))
    problems = {
        b.pid: sum(1 for line in b.log_lines[marks[b] :] if "level=WARNING" in line)
        for b in survivors
    }
    warned = Counter(
        match.group(1)
        for b in survivors
        for line in b.log_lines[marks[b] :]
        if "level=WARNING" in line and (match := re.search(r"event=(\S+)", line))
    )

    def span(values: list[float]) -> str:
        return f"{min(values):.2f}–{max(values):.2f} s" if values else "none"

    loads = sorted(load_at.values())
    # Each topic's first acknowledgement after its own load: the client's side of the wait.
    after_load = sorted(
        s.result() - killed - load_at[t] for t, s in sends.items() if s.done() and t in load_at
    )
    if after_load:
        print(f"first publish acknowledged after its topic's load: p50 "
              f"{_percentile(after_load, 0.5):.2f} s, p90 {_percentile(after_load, 0.9):.2f} s, "
              f"max {max(after_load):.2f} s", flush=True)  # fmt: skip
    print(f"lease TTL {args.lease_ttl_ms} ms; {len(mine)} topics of the killed broker; "
          f"after SIGKILL: FailOver commits {span(fails)} ({len(fails)}), Assign commits "
          f"{span(assigns)} ({len(assigns)}), loaded by new owners {span(loads)} "
          f"({len(loads)}; p50 {_percentile(loads, 0.5) if loads else 0:.2f} s), first "
          f"publish acknowledged {span(acked)} ({len(acked)}; p50 "
          f"{_percentile(acked, 0.5) if acked else 0:.2f} s); warnings in survivors' logs "
          f"{problems} {dict(warned)}; load average {os.getloadavg()[0]:.2f}",
          flush=True)  # fmt: skip
    owners = Counter(
        b.pid for b in survivors for _, line in _events(b, "topic_loaded")[before[b]:]
        if line.split()[0].removeprefix("topic=") in owned[victim]
    )  # fmt: skip
    print(f"the killed broker's topics loaded by survivor pid: {dict(owners)}; survivors' CPU "
          f"from the SIGKILL to the end: "
          f"{ {pid: round(s, 1) for pid, s in cpu.items()} } s", flush=True)  # fmt: skip
    if len(acked) < len(mine):
        print(f"NOT all served: {len(mine) - len(acked)} of {len(mine)} topics took no publish "
              f"within {args.timeout_s:.0f} s", flush=True)  # fmt: skip
    elif acked:
        print(f"served again {max(acked):.2f} s after SIGKILL = lease TTL "
              f"{args.lease_ttl_ms / 1000:.1f} s + {max(acked) - args.lease_ttl_ms / 1000:.2f} s "
              f"(target: + 2 s)", flush=True)  # fmt: skip


def _cpu_s(pid: int) -> float:
    """The process's user + system CPU seconds so far (Linux `/proc/<pid>/stat`): the work
    a failover costs, steadier than wall time on a loaded machine."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def failover_many(args: argparse.Namespace, root: Path) -> None:
    settings = ClusterSettings(
        brokers=3, lease_ttl_ms=args.lease_ttl_ms, lookup_hold_ms=args.lookup_hold_ms
    )
    with LocalCluster(root, settings) as cluster:
        time.sleep(3)  # every broker registered: topics spread over all three
        asyncio.run(_failover_many(cluster, args))


async def _assign(urls: str, topics: int) -> list[float]:
    took = []
    async with DanubeClient(urls) as client:
        for i in range(topics):
            started = time.monotonic()
            await client.producer(f"/default/assign-{i}", "p").create()
            took.append(time.monotonic() - started)
    return took


def assign(args: argparse.Namespace, root: Path) -> None:
    with LocalCluster(root, ClusterSettings(brokers=3)) as cluster:
        took = asyncio.run(_assign(",".join(cluster.service_urls), args.topics))
        brokers = [len(b.loaded_topics()) for b in cluster.brokers]
    ms = [t * 1000 for t in took]
    print(f"{args.topics} topics created one at a time: create → producer ready p50 "
          f"{_percentile(ms, 0.5):.0f} ms, p99 {_percentile(ms, 0.99):.0f} ms, max "
          f"{max(ms):.0f} ms; topics per broker {brokers}")  # fmt: skip


async def _throughput(urls: str, topics: int, window: int, seconds: float) -> int:
    acked = 0
    async with DanubeClient(urls) as client:
        producers = [
            await client.producer(
                f"/default/load-{i}", "p", dispatch=DispatchStrategy.RELIABLE
            ).create()
            for i in range(topics)
        ]
        deadline = time.monotonic() + seconds

        async def send_loop(producer: object) -> None:
            nonlocal acked
            while time.monotonic() < deadline:
                await producer.send(PAYLOAD)  # type: ignore[attr-defined]
                acked += 1

        await asyncio.gather(*(send_loop(p) for p in producers for _ in range(window)))
    return acked


def throughput(args: argparse.Namespace, root: Path) -> None:
    for brokers in args.brokers:
        with LocalCluster(root / f"b{brokers}", ClusterSettings(brokers=brokers)) as cluster:
            acked = asyncio.run(
                _throughput(",".join(cluster.service_urls), args.topics, args.window, args.seconds)
            )
        print(f"{brokers} broker(s), {args.topics} topics × {args.window} in flight, "
              f"{args.seconds:.0f} s: {acked / args.seconds:.0f} msg/s acknowledged "
              f"({acked} messages)", flush=True)  # fmt: skip


async def _latency(url: str, sends: int) -> list[float]:
    """Milliseconds from each send to its acknowledgement, one at a time, after a warm-up."""
    async with DanubeClient(url) as client:
        producer = await client.producer(  # type: ignore[attr-defined]
            "/default/latency", "p", dispatch=DispatchStrategy.RELIABLE
        ).create()
        for _ in range(20):
            await producer.send(PAYLOAD[:100])
        await asyncio.sleep(2)  # the followers catch up and join the in-sync set
        took = []
        for _ in range(sends):
            started = time.perf_counter()
            await producer.send(PAYLOAD[:100])
            took.append((time.perf_counter() - started) * 1000)
    return took


def latency(args: argparse.Namespace, root: Path) -> None:
    """Sequential reliable publishes (`fsync`): replicated to a follower with two brokers or
    more (issue 27), alone with one."""
    for brokers in args.brokers:
        with LocalCluster(root / f"l{brokers}", ClusterSettings(brokers=brokers)) as cluster:
            time.sleep(3)
            took = asyncio.run(_latency(cluster.brokers[0].url, args.sends))
        print(f"{brokers} broker(s), {args.sends} sequential reliable sends of 100 B: "
              f"publish→ack p50 {_percentile(took, 0.5):.2f} ms, p99 "
              f"{_percentile(took, 0.99):.2f} ms", flush=True)  # fmt: skip


async def _replication(broker: BrokerProcess, topic: str) -> ext_pb.TopicReplicationResponse:
    """The topic's replication as `danube-admin topics describe` shows it (any broker
    answers: it asks the owner)."""
    host, port = broker.admin_addr.rsplit(":", 1)
    channel = Channel(host, int(port))
    try:
        stub = ext_pb.ReplicationAdminStub(channel, timeout=10)
        return await stub.topic_replication(ext_pb.TopicReplicationRequest(name=topic))
    finally:
        channel.close()


async def _e2e(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, object]:
    """One open-loop run at `args.rate` for `args.seconds` on a fresh reliable topic, after a
    warm-up that lets the followers join the in-sync set (the measured publishes then wait
    for them). The consumer subscribes after the warm-up, at the latest message, so it
    receives exactly the measured ones. Sends use `enqueue` and acks the consumer's batched
    acks, as `bench.danube_workloads` does: no task per message on the client's side, which
    shares the two CPUs with the brokers. Payloads carry their send time and sequence
    (`bench.e2e_reliable._HEAD`)."""
    topic = f"/default/e2e-{time.monotonic_ns()}"
    padding = b"x" * max(args.size - _HEAD.size, 0)
    reliable = DispatchStrategy.RELIABLE
    messages = int(args.rate * args.seconds)
    ack_ms: list[float] = []
    e2e_ms: list[float] = []
    seen: set[int] = set()
    duplicates = 0
    async with DanubeClient(",".join(cluster.service_urls)) as client:
        producer = await client.producer(topic, "p", dispatch=reliable).create()
        for n in range(20):
            await producer.send(_payload(1, n, padding))
        await asyncio.sleep(2)
        consumer = await client.consumer(
            topic, "c", "s", sub_type=SubType.EXCLUSIVE, start="latest"
        ).subscribe()

        async def consume() -> float:
            nonlocal duplicates
            acks = []
            while len(seen) + duplicates < messages:
                message = await consumer.receive()
                sent, _, sequence = _HEAD.unpack_from(message.payload)
                e2e_ms.append((time.monotonic_ns() - sent) / 1e6)
                duplicates += sequence in seen
                seen.add(sequence)
                acks.append(asyncio.ensure_future(consumer.ack(message)))
            finished = time.monotonic()
            await asyncio.gather(*acks)
            return finished

        async def answer(before: int, stored: Awaitable[object]) -> None:
            await stored
            ack_ms.append((time.monotonic_ns() - before) / 1e6)

        scraped = {b.pid: stage_breakdown.scrape(b.metrics_url) for b in cluster.brokers}
        cpu_before = {b.pid: _cpu_s(b.pid) for b in cluster.brokers}
        client_cpu = time.process_time()
        receiving = asyncio.ensure_future(consume())
        interval = 1.0 / args.rate
        started = time.monotonic()
        late = 0.0
        answers = []
        for n in range(messages):
            delay = started + n * interval - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                late = max(late, -delay)
            before = time.monotonic_ns()
            stored = producer.enqueue(_payload(0, n, padding))
            answers.append(asyncio.ensure_future(answer(before, stored)))
        limit = args.seconds + 60
        await asyncio.wait_for(asyncio.gather(*answers), limit)
        elapsed = time.monotonic() - started
        try:
            delivered_at = await asyncio.wait_for(receiving, limit)
        except TimeoutError:
            raise SystemExit(f"consumer stalled: {len(seen)} of {messages} received") from None
        client_cpu = time.process_time() - client_cpu
        brokers = {}
        for b in cluster.brokers:
            after = stage_breakdown.scrape(b.metrics_url)
            brokers[b.pid] = {
                "cpu_ms_per_message": (_cpu_s(b.pid) - cpu_before[b.pid]) * 1000 / messages,
                "stages": stage_breakdown.table(stage_breakdown.difference(after, scraped[b.pid])),
            }
        await consumer.close()
    replication = await _replication(cluster.brokers[0], topic)
    return {
        "messages": messages,
        "offered_msgs_per_s": args.rate,
        "most_late_send_ms": late * 1000,
        "achieved_msgs_per_s": messages / elapsed,
        "delivery_msgs_per_s": messages / (delivered_at - started),
        "publish_ack_p50_ms": statistics.median(ack_ms),
        "publish_ack_p99_ms": _percentile(ack_ms, 0.99),
        "end_to_end_p50_ms": statistics.median(e2e_ms),
        "end_to_end_p99_ms": _percentile(e2e_ms, 0.99),
        "followers": [f.broker_id for f in replication.followers],
        "in_sync": list(replication.in_sync),
        "check": {"missing": messages - len(seen), "duplicates": duplicates},
        "client_cpu_ms_per_message": client_cpu * 1000 / messages,
        "brokers": brokers,
    }


def e2e(args: argparse.Namespace, root: Path) -> None:
    """Issue 27 point 6: replicated durable publish, publish → delivered, at a fixed rate."""
    for brokers in args.brokers:
        with LocalCluster(root / f"e{brokers}", ClusterSettings(brokers=brokers)) as cluster:
            time.sleep(3)  # every broker registered: the topic gets its follower at creation
            found = asyncio.run(_e2e(cluster, args))
        replicated = bool(found["in_sync"])
        if brokers >= 2 and not replicated:
            print(f"WARNING: {brokers} brokers but no in-sync follower at the end: "
                  "these numbers are not of replicated publishes", flush=True)  # fmt: skip
        print(f"{brokers} broker(s), {args.rate} msg/s offered for {args.seconds:g} s, "
              f"{args.size} B, reliable (fsync), followers {found['followers']} in sync "
              f"{found['in_sync']}: achieved {found['achieved_msgs_per_s']:.0f} msg/s "
              f"(delivered {found['delivery_msgs_per_s']:.0f} msg/s); publish→ack p50 "
              f"{found['publish_ack_p50_ms']:.2f} ms p99 {found['publish_ack_p99_ms']:.2f} ms; "
              f"publish→delivered p50 {found['end_to_end_p50_ms']:.2f} ms p99 "
              f"{found['end_to_end_p99_ms']:.2f} ms; most late send "
              f"{found['most_late_send_ms']:.1f} ms; {found['check']}", flush=True)  # fmt: skip
        print(f"client CPU {found['client_cpu_ms_per_message']:.3f} ms a message", flush=True)
        if args.stages:
            for pid, seen in found["brokers"].items():  # type: ignore[attr-defined]
                print(f"broker pid {pid}: CPU {seen['cpu_ms_per_message']:.3f} ms a message")
                rows = [row for row in seen["stages"] if row["count"]]
                if rows:
                    print(stage_breakdown.render(rows), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="bench.cluster_e2e", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("failover")
    one.add_argument("--rounds", type=int, default=3)
    one.add_argument("--lease-ttl-ms", type=int, default=3_000)
    many = sub.add_parser("failover-many")
    many.add_argument("--topics", type=int, default=700)
    many.add_argument("--lease-ttl-ms", type=int, default=10_000)
    many.add_argument("--settle-s", type=float, default=5.0)
    many.add_argument("--timeout-s", type=float, default=120.0)
    many.add_argument("--profile", default="", help="directory for py-spy raw flame data")
    many.add_argument("--profile-s", type=int, default=25)
    many.add_argument(
        "--logs", default="", help="directory for each survivor's log lines from the kill on"
    )
    many.add_argument(
        "--fast-retry", action="store_true",
        help="client backoff 0.1-1 s instead of the official clients' 0.2 s steps up to 5 s",
    )  # fmt: skip
    many.add_argument(
        "--lookup-hold-ms", type=int, default=None,
        help="the brokers' cluster.lookup_hold_ms (default: theirs)",
    )  # fmt: skip
    two = sub.add_parser("assign")
    two.add_argument("--topics", type=int, default=50)
    three = sub.add_parser("throughput")
    three.add_argument("--brokers", type=int, nargs="+", default=[1, 3])
    three.add_argument("--topics", type=int, default=12)
    three.add_argument("--window", type=int, default=4)
    three.add_argument("--seconds", type=float, default=20.0)
    four = sub.add_parser("latency")
    four.add_argument("--brokers", type=int, nargs="+", default=[1, 3])
    four.add_argument("--sends", type=int, default=300)
    five = sub.add_parser("e2e")
    five.add_argument("--brokers", type=int, nargs="+", default=[1, 3])
    five.add_argument("--rate", type=int, default=1000, help="msg/s offered (open loop)")
    five.add_argument("--seconds", type=float, default=20.0)
    five.add_argument("--size", type=int, default=1024, help="payload bytes (>= 16)")
    five.add_argument(
        "--stages",
        action="store_true",
        help="each broker's stage table (danube_stage_latency_ms) and CPU for the measured run",
    )
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="danube-bench-") as tmp:
        commands = {
            "failover": failover, "failover-many": failover_many, "assign": assign,
            "throughput": throughput, "latency": latency, "e2e": e2e,
        }  # fmt: skip
        commands[args.command](args, Path(tmp))


if __name__ == "__main__":
    main()
