"""A bounded disk writer beside a bench: another process that writes and fsyncs files on the same filesystem
as the system's data (issue 42: a search stalled whenever anything else on the machine wrote to the disk).

`disk_load(directory)` starts it as a child process (niced, so that it loads the disk and not the 2 CPUs a bench
shares), waits until its first fsync is done, yields, then stops it and deletes its files. The child writes
`chunk_kb` chunks of random bytes into `files` rotating files of `file_mb` each (so it holds at most
files × file_mb on disk), fsyncing after every chunk, until told to stop or until it has written `max_mb` or run
`max_s` seconds, whichever comes first. What it did (MB, fsyncs, MB/s, fsync p50/max, what stopped it) is on
the yielded `DiskLoad.report` once the block ends, so a bench can print the load it applied.

The child is this file run as a script, standard library only: it imports nothing of memflow's and none of the
bench's threads or state (fork of a process with threads is not safe; spawn would re-import the bench).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NICE = 10


@dataclass(frozen=True)
class Bound:
    """What the writer writes, and its hard limits: bytes written and seconds run, whichever comes first."""

    file_mb: float = 64
    chunk_kb: int = 2048
    files: int = 2
    max_mb: float = 32_768
    max_s: float = 900
    # A rate cap, so that the load is one quantity on any disk and lasts the phase: uncapped, a fast disk took the
    # default byte bound (32 GB at 417 MB/s) in 79 s, before the phase under load had ended. 0: uncapped.
    mb_per_s: float = 100

    def args(self) -> list[str]:
        return [str(self.file_mb), str(self.chunk_kb), str(self.files), str(self.max_mb), str(self.max_s),
                str(self.mb_per_s)]


@dataclass
class DiskLoad:
    """The running writer; `report` is filled once it has stopped."""

    directory: Path
    bound: Bound
    report: dict[str, Any] = field(default_factory=dict)
    child: subprocess.Popen[str] | None = None

    def ended(self, timeout: float) -> bool:
        """Whether the writer has stopped by its own bound, waiting up to `timeout` seconds for it."""
        assert self.child is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.child.wait(timeout)
        return self.child.poll() is not None


@contextlib.contextmanager
def disk_load(directory: Path, bound: Bound | None = None) -> Iterator[DiskLoad]:
    """Writes and fsyncs under `directory` (created, then removed) for the length of the block."""
    load = DiskLoad(directory, bound or Bound())
    directory.mkdir(parents=True, exist_ok=False)  # its own folder: deleting it afterwards deletes nothing else
    child = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(directory), *load.bound.args()],
                             stdout=subprocess.PIPE, text=True)
    load.child = child
    try:
        assert child.stdout is not None
        started = child.stdout.readline()  # its first fsync is done: the disk is loaded from here on
        if not started:
            raise RuntimeError(f"the disk writer exited before writing (status {child.wait()})")
        yield load
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=60)
        load.report = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"error": child.returncode}
        shutil.rmtree(directory, ignore_errors=True)


# -- the child ---------------------------------------------------------------------------------------------


class _Stop:
    asked = False


def _ask_stop(signum: int, frame: object) -> None:
    _Stop.asked = True


def write(directory: Path, bound: Bound) -> dict[str, Any]:
    """Write and fsync until stopped or bounded; what was written. Removes its files before returning."""
    chunk = os.urandom(bound.chunk_kb * 1024)  # random: no filesystem compresses or dedups it away
    per_file = max(1, int(bound.file_mb * 1024 // bound.chunk_kb))
    written, fsyncs, waits = 0, 0, []
    stopped_by, started, index = "stop", time.monotonic(), 0
    while stopped_by == "stop" and not _Stop.asked:
        path = directory / f"load-{index % bound.files}.bin"
        with path.open("wb") as f:  # truncates: the folder never holds more than files × file_mb
            for _ in range(per_file):
                f.write(chunk)
                f.flush()
                at = time.monotonic()
                os.fsync(f.fileno())
                waits.append(time.monotonic() - at)
                written, fsyncs = written + len(chunk), fsyncs + 1
                if fsyncs == 1:
                    print("started", flush=True)
                stopped_by = _bounded(bound, written, time.monotonic() - started)
                if stopped_by != "stop" or _Stop.asked:
                    break
                _keep_rate(bound, written, started)
        index += 1
    for leftover in directory.glob("load-*.bin"):
        leftover.unlink()
    return _report(written, fsyncs, waits, time.monotonic() - started, stopped_by)


def _keep_rate(bound: Bound, written: int, started: float) -> None:
    """Sleep until what was written is no more than the cap allows by now."""
    if bound.mb_per_s > 0:
        due = started + written / (bound.mb_per_s * 1024 * 1024)
        time.sleep(max(0.0, due - time.monotonic()))


def _bounded(bound: Bound, written: int, elapsed: float) -> str:
    if written >= bound.max_mb * 1024 * 1024:
        return "bytes"
    return "time" if elapsed >= bound.max_s else "stop"


def _report(written: int, fsyncs: int, waits: list[float], seconds: float, stopped_by: str) -> dict[str, Any]:
    ordered = sorted(waits) or [0.0]
    mb = written / 1024 / 1024
    return {"mb": round(mb, 1), "fsyncs": fsyncs, "seconds": round(seconds, 2),
            "mb_per_s": round(mb / max(seconds, 1e-9), 1), "fsync_p50_ms": round(ordered[len(ordered) // 2] * 1000, 2),
            "fsync_max_ms": round(ordered[-1] * 1000, 2), "stopped_by": stopped_by}


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGTERM, _ask_stop)
    os.nice(NICE)  # the disk is what it loads, not the CPUs the bench measures on
    directory, file_mb, chunk_kb, files, max_mb, max_s, mb_per_s = argv
    bound = Bound(float(file_mb), int(chunk_kb), int(files), float(max_mb), float(max_s), float(mb_per_s))
    print(json.dumps(write(Path(directory), bound)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
