"""Where this process's memory limit is written (spec/memory.md, "The budget"), as a pure rule:
the runtime reads `/proc/self/cgroup` and `/proc/self/mountinfo` and hands the text here, then
reads the files this module names and hands their text back.

A process does not live at its cgroup mount's root: systemd puts a service in
`/system.slice/danube.service` (where `MemoryMax=` is written), a container runtime in a
nested group, and every ancestor's limit applies too. So the limit is the tightest one on the
way from the process's own group up to the mount's root, for cgroup v2 (`memory.max`) and v1
(`memory.limit_in_bytes` of the `memory` controller's hierarchy). Review finding: only the
mount root's files were read, whose limit is the host's ("max").
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass

CGROUP_ROOT = "/sys/fs/cgroup"
V2_LIMIT = "memory.max"
V1_LIMIT = "memory.limit_in_bytes"
V1_DEFAULT_MOUNT = "/sys/fs/cgroup/memory"


@dataclass(frozen=True, slots=True)
class Mount:
    """A cgroup hierarchy as mounted here: which group its root is (`root`, as written in
    /proc/self/cgroup) and where it is mounted (`point`)."""

    root: str
    point: str


def _mounts(mountinfo: str | None) -> tuple[Mount | None, Mount | None]:
    """The cgroup2 mount and the v1 mount holding the `memory` controller, if any."""
    v2: Mount | None = None
    v1: Mount | None = None
    for line in (mountinfo or "").splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        if not after:
            continue
        fstype, options = after[0], after[2] if len(after) > 2 else ""
        mount = Mount(_unescape(fields[3]), _unescape(fields[4]))
        if fstype == "cgroup2" and v2 is None:
            v2 = mount
        elif fstype == "cgroup" and "memory" in options.split(",") and v1 is None:
            v1 = mount
    return v2, v1


def _unescape(path: str) -> str:
    """mountinfo writes a space, a tab, a newline and a backslash as octal escapes."""
    for escaped, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        path = path.replace(escaped, char)
    return path


def _groups(proc_cgroup: str | None) -> tuple[str | None, str | None]:
    """The process's v2 group (`0::/path`) and its v1 `memory` group (`N:memory,...:/path`)."""
    v2: str | None = None
    v1: str | None = None
    for line in (proc_cgroup or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "" and parts[0] == "0":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _walk(mount: Mount, group: str, name: str) -> list[str]:
    """`name` in the process's group's directory and each parent's, up to the mount point.
    The group is relative to the mount's root (a container's mount shows only its part)."""
    group = posixpath.normpath(group)
    root = posixpath.normpath(mount.root)
    if root != "/" and (group == root or group.startswith(root + "/")):
        group = group[len(root) :] or "/"
    # Otherwise the group is taken as relative to the mount (a cgroup namespace writes it so).
    paths: list[str] = []
    current = group
    while True:
        paths.append(posixpath.join(mount.point, current.lstrip("/"), name))
        if current in ("/", ""):
            return paths
        current = posixpath.dirname(current)


def limit_files(proc_cgroup: str | None, mountinfo: str | None) -> list[str]:
    """Every file that may hold a memory limit of this process, the own group's first, v2's
    then v1's; the mount roots' alone when /proc/self/cgroup or mountinfo cannot be read."""
    v2_group, v1_group = _groups(proc_cgroup)
    v2_mount, v1_mount = _mounts(mountinfo)
    files: list[str] = []
    if v2_group is not None:
        files += _walk(v2_mount or Mount("/", CGROUP_ROOT), v2_group, V2_LIMIT)
    if v1_group is not None:
        files += _walk(v1_mount or Mount("/", V1_DEFAULT_MOUNT), v1_group, V1_LIMIT)
    if not files:
        files = [posixpath.join(CGROUP_ROOT, V2_LIMIT), posixpath.join(V1_DEFAULT_MOUNT, V1_LIMIT)]
    return list(dict.fromkeys(files))


def tightest_limit(read: Iterable[tuple[str, str | None]]) -> tuple[int, str] | None:
    """The smallest limit among the files read (path, text; None: unreadable) and its path.
    "max" (v2) is no limit; v1's "unlimited" is a huge number, which `MemTotal` beats."""
    best: tuple[int, str] | None = None
    for path, text in read:
        value = (text or "").strip()
        if not value.isdigit():
            continue
        limit = int(value)
        if limit > 0 and (best is None or limit < best[0]):
            best = (limit, path)
    return best
