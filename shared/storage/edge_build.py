"""An Edge shard's index build, run in a process of its own and handed over to the shard that serves.

Why a process. `EdgeShard.optimize()` of qdrant-edge-py (0.9.0) holds the interpreter lock for the whole build:
measured on this 2-core machine with 20k 768-dim points, a 5 ms ticker thread stalled for all of the 22 s the
build took, and a search thread got nothing done meanwhile (`memflow bench jobs`: bench/RESULTS.md, "Jobs beside
searches"). The binding offers no build that lets go of the lock, its optimizer settings only change how the
points are cut into segments (one `optimize()` still builds them all in one call), and a second `EdgeShard.load`
of a directory in use fails on its WAL lock. What the engine does allow: a shard is a directory, any process can
load a copy of it, and the same `UpdateOperation` can be applied to two shards. So:

1. copy: with writes held (the copy is of one instant: no write halfway through), the shard's directory is
   copied beside it (`<shard>.build`), and from then on every write to the shard is also kept in a journal;
2. build: a child process (`python -m memflow.shared.storage.edge_build <dir>`, niced, so searches come first for the
   CPU) loads the copy, optimizes it, ends on an empty write (see `main`), flushes and closes it. This process
   only waits;
3. hand over: the build's files are read into the page cache (`warm`, without the lock); with writes held
   again, the shard's directory is renamed `<shard>.old`, the build takes its name and
   is loaded, the journal replayed on it, and `<shard>.old` renamed `<shard>.retired` (the commit point) before
   the serving shard is swapped for the new one and the retired one deleted. Searches read the old shard until
   the swap (a renamed directory stays readable: its files are open).

A crash at any point leaves a shard that holds every acknowledged write (`recover`, when the shard is opened):
before the commit point the old directory is put back and the build dropped; after it the build is the shard.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from memflow.shared.errors import StoreUnavailable

log = logging.getLogger(__name__)

BUILD, OLD, RETIRED = ".build", ".old", ".retired"
# The build gives way to searches for the CPU; it takes what they leave (measured in bench/RESULTS.md).
NICENESS = 19
# Waiting for the child in short steps: a job's timeout (raised in this thread by the watchdog) is seen at once.
POLL_S = 0.5


def beside(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def recover(path: Path) -> None:
    """Finish or undo a handover a crash interrupted, and drop what a build left behind."""
    old = beside(path, OLD)
    if old.exists():  # before the commit point: the old shard holds every acknowledged write
        if path.exists():
            shutil.rmtree(path)
        os.rename(old, path)
        _sync_dir(path.parent)
        log.warning("an index build was interrupted during its handover: the shard before it is back")
    for leftover in (beside(path, BUILD), beside(path, RETIRED)):
        shutil.rmtree(leftover, ignore_errors=True)


def copy(path: Path, attempts: int = 3) -> Path:
    """The shard's directory copied to `<shard>.build` (the caller holds every write meanwhile). Seen once in
    the tests: a copy failed on a file listed and gone by the time it was read (the engine's WAL prepares its
    next segment file on a thread of its own, writes or none); the copy is then made again."""
    build = beside(path, BUILD)
    for _ in range(attempts - 1):
        shutil.rmtree(build, ignore_errors=True)
        try:
            shutil.copytree(path, build)
            return build
        except shutil.Error as exc:
            log.info("shard copy: a file changed under it (%s); copying again", exc)
    shutil.rmtree(build, ignore_errors=True)
    shutil.copytree(path, build)
    return build


def build(directory: Path, timeout_s: float | None = None) -> bool:
    """Optimize the shard in `directory` in a child process; True if it built anything. Waits without the
    interpreter lock; a timeout or an exception raised while waiting (a job's timeout) kills the child."""
    child = subprocess.Popen([sys.executable, "-m", "memflow.shared.storage.edge_build", str(directory)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while True:
            try:
                out, err = child.communicate(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() > deadline:
                    raise StoreUnavailable(f"edge shard: index build still running after {timeout_s:g} s") from None
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if child.returncode != 0:
        raise StoreUnavailable(f"edge shard: index build failed ({child.returncode}): "
                               f"{err.decode(errors='replace').strip()[-500:]}")
    said = out.decode().split()
    return bool(said) and said[0] == "built"


def swap_in(path: Path, build_dir: Path) -> None:
    """Step 3's renames: the shard's directory out of the way (`.old`), the build in its place."""
    os.rename(path, beside(path, OLD))
    os.rename(build_dir, path)
    _sync_dir(path.parent)


def commit(path: Path) -> Path:
    """The commit point: the new shard (loaded, journal replayed) is the shard; the old one is retired."""
    retired = beside(path, RETIRED)
    os.rename(beside(path, OLD), retired)
    _sync_dir(path.parent)
    return retired


def warm(directory: Path, chunk: int = 1 << 20) -> int:
    """Read every file of a built shard into the page cache; the bytes read. The engine's load faults the files'
    pages in holding the interpreter lock, and the child's close leaves them out of the cache: a 12k-point shard
    loaded in 0.075 s cold, 0.035 s warm (measured, 0.9.0). Reading here lets go of the lock at each read, so
    searches run meanwhile, and the load under the lock finds the pages in memory."""
    buffer = bytearray(chunk)
    read = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                with open(os.path.join(root, name), "rb", buffering=0) as file:
                    while got := file.readinto(buffer):
                        read += got
            except OSError:
                continue  # best effort: the load reads what this did not
    return read


def write_back(directory: Path) -> None:
    """fsync every file of a shard about to be closed. Closing flushes the shard (its mapped pages to disk), holding
    the interpreter lock: 0.25 s at 20k points never flushed, measured. os.fsync lets go of it, so the pages are
    written here while searches run, and the close finds little left to write."""
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
            except OSError:
                pass  # best effort: the close writes what this did not
            finally:
                os.close(fd)


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # the renames survive a power loss
    finally:
        os.close(fd)


def main(directory: str) -> None:
    """The child: optimize the shard copy in `directory`, durably, and say whether anything was built."""
    import qdrant_edge as qe

    os.nice(NICENESS)
    shard = qe.EdgeShard.load(directory)
    started = time.perf_counter()
    built = shard.optimize()
    if built:
        # Every load replays the WAL's last entry again (the engine's flush acknowledges all but the last
        # operation: measured with 0.9.0, `ack_index` stays one behind). Left as it is, that entry is the last
        # write before the copy, e.g. a put of 2,000 points, replayed by the serving process under the interpreter
        # lock: 0.17 s of a 12k-point shard's load against 0.075 s with this empty delete as the last entry.
        shard.update(qe.UpdateOperation.delete_points([]))
    shard.flush()
    shard.close()
    print(f"{'built' if built else 'unchanged'} in {time.perf_counter() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
