"""Who owns a run's lease or a scratch folder, and whether that process is gone.

A writer killed by ``kill -9`` cannot release anything. On its own host the next writer can tell it is dead
without waiting for a lease to go stale: same host name, same pid namespace (a container on the same host
name sees other pids), and the pid no longer runs, or runs a process started at another time (a reused
pid). Anything else (another host, another namespace, no ``/proc``) is "maybe alive": the caller waits.
"""

from __future__ import annotations

import os
import socket
from typing import Any


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")  # e.g. "pid:[4026531836]"
    except OSError:
        return None


def _started(pid: int) -> str | None:
    """The process's start time since boot (``/proc/PID/stat`` field 22) with the boot id; None without /proc."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the command name, in brackets, may hold spaces
    return f"{_read('/proc/sys/kernel/random/boot_id') or '?'}:{fields[19]}" if len(fields) > 19 else None


def this_process() -> dict[str, Any]:
    """The identity of this process: host, pid, pid namespace, start time."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "pidns": _pid_namespace(),
            "started": _started(os.getpid())}


def process_gone(owner: dict[str, Any]) -> bool:
    """True only when ``owner`` (``this_process()`` of some process) ran on this host, in this pid namespace,
    and is no longer running."""
    me = this_process()
    if owner.get("host") != me["host"] or owner.get("pidns") != me["pidns"]:
        return False
    try:
        pid = int(owner["pid"])
    except (KeyError, TypeError, ValueError):
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        pass
    stat = _read(f"/proc/{pid}/stat")
    if stat is not None and stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]:  # killed, not yet reaped
        return True
    started = owner.get("started")
    return started is not None and _started(pid) not in (None, started)
