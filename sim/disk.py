"""A simulated local disk holding every topic's WAL segment files.

Each file has two layers: `cache`, what a process reads (the OS page cache), and `durable`,
what survives a power failure. A completed write extends the cache; an fsync copies the cache
to the durable layer. A process crash keeps both (the OS lives on); a power failure keeps the
durable bytes plus a random prefix of the unsynced ones (a torn tail). Creating, renaming,
truncating and deleting are durable at once (the real driver fsyncs the directory where it
matters).

The disk also tracks which offsets each frame holds and how far each is durable, so the
checker can ask, the moment a publish is acknowledged, whether its record is really on disk.
"""

from __future__ import annotations

import bisect
import errno
import random
import struct
from dataclasses import dataclass, field
from typing import Any

from danube.machines.wal import format

_FRAME = struct.Struct("<IIIHHQ")  # crc, length, magic, flags, count, base offset


@dataclass(slots=True)
class SimFile:
    cache: bytearray
    durable: bytearray


@dataclass(slots=True)
class TopicFiles:
    files: dict[int, SimFile] = field(default_factory=dict)
    frame_offsets: list[int] = field(default_factory=list)
    """First offset of every frame written since the last crash, in write order."""
    frame_ends: list[tuple[int, int, int]] = field(default_factory=list)
    """(segment base, end position, record count) of the same frames."""


class DiskFull(OSError):
    def __init__(self) -> None:
        super().__init__(errno.ENOSPC, "No space left on device (simulated)")


class SimDisk:
    def __init__(self) -> None:
        self.topics: dict[str, TopicFiles] = {}
        self.checkpoints: dict[str, int] = {}
        """Each topic's WAL checkpoint (`danube.machines.wal.checkpoint`): the durable end it marks.
        A mark is durable once its write completes (the driver's pwrite + fdatasync)."""
        self.full = False
        """Writes fail with ENOSPC while set (fsyncs of written data still succeed)."""
        self.epochs: dict[str, Any] = {}
        """Each topic's replication epochs file (`danube.effects.WriteEpochs`): replaced by
        a rename, durable once its write completes."""
        self.damaged: set[str] = set()
        """Topics whose files a fault damaged at rest (`flip_bit`, `damage_newest`): the only
        ones recovery may find corrupt (the checker's invariant 15)."""

    def _topic(self, topic: str) -> TopicFiles:
        files = self.topics.get(topic)
        if files is None:
            files = self.topics[topic] = TopicFiles()
        return files

    # -- the WAL driver's operations --------------------------------------------------------------

    def create(self, topic: str, base: int, header: bytes) -> None:
        self._topic(topic).files[base] = SimFile(bytearray(header), bytearray(header))

    def write(self, topic: str, base: int, position: int, data: bytes) -> None:
        if self.full:
            raise DiskFull()
        entry = self._topic(topic)
        file = entry.files.get(base)
        if file is None:
            raise FileNotFoundError(errno.ENOENT, f"segment {base} of {topic} does not exist")
        assert position == len(file.cache), "WAL writes are sequential"
        file.cache += data
        cursor = 0
        while cursor < len(data):
            _, length, _, _, count, first = _FRAME.unpack_from(data, cursor)
            cursor += length
            entry.frame_offsets.append(first)
            entry.frame_ends.append((base, position + cursor, count))

    def fsync(self, topic: str, base: int) -> None:
        file = self._topic(topic).files.get(base)
        if file is None:
            raise FileNotFoundError(errno.ENOENT, f"segment {base} of {topic} does not exist")
        file.durable = bytearray(file.cache)

    def delete(self, topic: str, base: int) -> None:
        self._topic(topic).files.pop(base, None)

    def truncate(self, topic: str, base: int, size: int) -> None:
        entry = self._topic(topic)
        file = entry.files[base]
        del file.cache[size:]
        del file.durable[size:]
        # The cut frames were the newest: their offsets will be assigned again.
        while (
            entry.frame_ends
            and entry.frame_ends[-1][0] == base
            and (entry.frame_ends[-1][1] > size)
        ):
            entry.frame_ends.pop()
            entry.frame_offsets.pop()

    def remove_topic(self, topic: str) -> None:
        self.topics.pop(topic, None)
        self.checkpoints.pop(topic, None)
        self.epochs.pop(topic, None)

    def mark(self, topic: str, durable_end: int) -> None:
        """A checkpoint write completed: it never lowers the mark."""
        self.checkpoints[topic] = max(self.checkpoints.get(topic, 0), durable_end)

    def read(self, topic: str, base: int, start: int, end: int) -> bytes:
        file = self._topic(topic).files.get(base)
        if file is None:
            raise FileNotFoundError(errno.ENOENT, f"segment {base} of {topic} does not exist")
        return bytes(file.cache[start:end])

    def scans(self, topic: str) -> list[tuple[int, bytes]]:
        """(base, contents) of each segment file, as recovery reads them."""
        return [(b, bytes(f.cache)) for b, f in sorted(self._topic(topic).files.items())]

    # -- what the checker asks ------------------------------------------------------------------

    def is_durable(self, topic: str, offset: int) -> bool:
        """Whether the frame holding `offset` (written since the last crash) is covered by
        the durable layer of its file."""
        entry = self._topic(topic)
        index = bisect.bisect_right(entry.frame_offsets, offset) - 1
        if index < 0:
            return False
        base, end, count = entry.frame_ends[index]
        if offset >= entry.frame_offsets[index] + count:
            return False
        file = entry.files.get(base)
        return file is not None and len(file.durable) >= end

    # -- faults -----------------------------------------------------------------------------------

    def crash(self, *, power: bool, rng: random.Random) -> None:
        """The broker process dies; with `power`, the machine too."""
        for entry in self.topics.values():
            if power:
                for file in entry.files.values():
                    extra = len(file.cache) - len(file.durable)
                    keep = len(file.durable) + (rng.randint(0, extra) if extra > 0 else 0)
                    file.durable = file.cache[:keep]
                    file.cache = bytearray(file.durable)
            entry.frame_offsets.clear()
            entry.frame_ends.clear()

    def flip_bit(self, rng: random.Random) -> tuple[str, int, int] | None:
        """Flips one bit inside the frames of a segment that is not the newest of its topic
        (durable data going bad at rest). Returns (topic, segment, position) or None."""
        candidates = [
            (topic, base)
            for topic, entry in sorted(self.topics.items())
            for base in sorted(entry.files)[:-1]
            if len(entry.files[base].durable) > 64
        ]
        if not candidates:
            return None
        topic, base = rng.choice(candidates)
        file = self.topics[topic].files[base]
        header = format.decode_segment_header(bytes(file.durable)).length
        position = rng.randrange(header, len(file.durable))
        bit = 1 << rng.randrange(8)
        file.durable[position] ^= bit
        if len(file.cache) > position:
            file.cache[position] ^= bit
        self.damaged.add(topic)
        return topic, base, position

    def damage_newest(self, rng: random.Random) -> str | None:
        """Damages the newest segment of a topic where the checkpoint marks it durable (the
        damage recovery must tell from a torn tail; a frame beyond the mark is in the window
        spec/wal-format.md names, where it cannot): a bit flipped inside the last frame the
        mark covers, half the time; else the frames zeroed or the file deleted. Both layers
        change (the process is down; the OS reads the same bytes). Returns what it did, or
        None when no newest segment holds a checkpointed frame."""
        candidates = []
        for topic, entry in sorted(self.topics.items()):
            if not entry.files:
                continue
            base = max(entry.files)
            mark = self.checkpoints.get(topic, 0)
            durable = bytes(entry.files[base].durable)
            try:
                scan = format.scan_segment(durable)
            except format.WalFormatError:
                continue
            covered = [
                (position, offset)
                for position, offset in zip(scan.positions, scan.base_offsets, strict=True)
                if offset < mark
            ]
            if covered:
                candidates.append((topic, base, covered[-1][0], scan.header.length))
        if not candidates:
            return None
        topic, base, frame_start, header = rng.choice(candidates)
        file = self.topics[topic].files[base]
        self.damaged.add(topic)
        roll = rng.random()
        if roll < 0.5:
            (length,) = struct.unpack_from("<I", file.durable, frame_start + 4)
            position = rng.randrange(frame_start, min(frame_start + length, len(file.durable)))
            bit = 1 << rng.randrange(8)
            file.durable[position] ^= bit
            if len(file.cache) > position:
                file.cache[position] ^= bit
            return f"flip {topic} segment={base} position={position}"
        if roll < 0.75:
            file.durable[header:] = bytes(len(file.durable) - header)
            file.cache[header:] = bytes(len(file.cache) - header)
            return f"zero {topic} segment={base}"
        del self.topics[topic].files[base]
        return f"delete {topic} segment={base}"
