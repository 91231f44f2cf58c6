"""Hot loops over whole buffers: CRC32C and the WAL frame scan (spec/wal-format.md).

Each kernel has a plain-Python twin in `danube.kernels.twins`, the oracle its tests compare
against."""

from danube.kernels.twins import (
    FrameScan,
    crc32c_py,
    find_frame_py,
    scan_frames_py,
)

crc32c = crc32c_py
scan_frames = scan_frames_py
find_frame = find_frame_py

__all__ = [
    "FrameScan",
    "crc32c",
    "crc32c_py",
    "find_frame",
    "find_frame_py",
    "scan_frames",
    "scan_frames_py",
]
