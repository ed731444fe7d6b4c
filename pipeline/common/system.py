"""What the operating system says about this process and its files: the machine's memory (or
the container's), the cores the process may run on, its resident and mapped size and its
address-space limit, what kind of file a path is, glibc's allocator and the inherited SIGINT
disposition.

The ground floor: it imports no module of the package, so anything may use it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import stat
from pathlib import Path

GIB = 1024**3


def physical_memory() -> int:
    """This machine's memory, or the cgroup (container) limit when it is lower; 8 GiB when
    neither can be read."""
    total: int | None = None
    try:
        total = int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        total = None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < (total or 1 << 62):
            total = int(text)
    return total if total else 8 * GIB


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, which a container's cpuset
    narrows), else the machine's count; at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def process_rss() -> int:
    """This process's resident memory now (0 where /proc is not available)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * int(os.sysconf("SC_PAGE_SIZE"))


def address_space_limit() -> int | None:
    """This process's address-space limit in bytes (the soft ``RLIMIT_AS``: ``ulimit -v``), or
    None when there is none (or it cannot be read)."""
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError, AttributeError):
        return None
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    return int(soft)


def virtual_size() -> int:
    """This process's mapped address space now (``VmSize``; 0 where /proc is not available)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def not_regular(path: Path) -> str | None:
    """Why ``path`` (links followed) is not a regular file, or None when it is. A FIFO, socket
    or device could block a read forever or never end; replacing one would destroy it."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return f"cannot be opened ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a file"


#: glibc's mallopt parameter for the size from which blocks are mapped on their own.
_M_MMAP_THRESHOLD = -3


@functools.cache
def keep_malloc_threshold(threshold: int = 128 << 10) -> bool:
    """Fix glibc malloc's mmap threshold at ``threshold`` (its starting value), so that blocks of
    that size or more are mapped on their own and go back to the system when freed. Left
    alone, glibc raises the threshold to the largest block freed so far (up to 32 MiB); from
    then on blocks below it come from heaps that keep what is freed, and a replay in pods
    (each pod's engine thread allocating and freeing arrays of a few MiB) kept growing: peak
    RSS 1.19–1.24 GiB against 1.02 GiB with the threshold fixed, for 2·10⁶ requests on 200
    replicas in 20 pods (benchmarks/scale.py's workload, docs/scale.md). False where there is
    no glibc (nothing is changed). Done once a process (finding libc runs ``ldconfig``)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):
        return False


def keep_ignored_sigint() -> None:
    """Keep SIGINT ignored in a process that inherited it ignored (``rooftrace nightly … &`` from
    a script, ``nohup``): importing polars installs a SIGINT handler of its own over the inherited
    SIG_IGN, which turned a SIGINT arriving during a polars call (reading the day, cutting the
    prefix chains) into a KeyboardInterrupt and exit code 130, while the same signal elsewhere was
    ignored. Python records the disposition the process started with (``signal.getsignal``: its
    own handler is never installed over SIG_IGN); where that is SIG_IGN, it is set again, which
    removes polars' handler. A SIGINT that was not ignored (Ctrl-C in a terminal) still stops
    the run. Only the main thread may set handlers; elsewhere nothing is done. Every command
    calls it first (pipeline.cli.common.run); replay and nightly again."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        import polars  # noqa: F401  (its import installs the handler: have it done, then undo it)

        signal.signal(signal.SIGINT, signal.SIG_IGN)
