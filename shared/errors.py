"""memflow's error tree.

    MemflowError
    ├── InvalidInput        the caller sent something we refuse (names the field); also ValueError
    ├── ModelMismatch       the store's vectors were made by another model than the embedder's
    ├── Permanent           a message that can never succeed: straight to its DLQ
    │   ├── DecodeError     bad JSON, wrong schema version, failed validation
    │   └── EmbedderRejected    the embedding endpoint refuses this input (400, 413, 422)
    ├── Retryable           a passing fault: leave the message pending and try again
    │   ├── StoreUnavailable    Qdrant (server or shard) did not answer
    │   │   └── IndexRetired    `memflow reindex` moved the store to another model
    │   ├── EmbedderUnavailable the embedding endpoint is down, slow, failing or answers garbage
    │   └── StaleVersion    a patch was built on an old revision
    ├── NotFound            no such memory (for this subject)
    └── RpcError            a search/pack/forget call did not complete; `kind` names why
"""

from __future__ import annotations

import re


class MemflowError(Exception):
    """Base of every error memflow raises on purpose."""


class InvalidInput(MemflowError, ValueError):
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class ModelMismatch(MemflowError):
    """Opening a store with an embedder other than the one that made its vectors: mixing two models'
    vectors in one index would make every cosine meaningless, so the process stops and says what to do."""


class Permanent(MemflowError):
    """Retrying cannot help: the message goes to the dead-letter stream at once."""


class DecodeError(Permanent):
    pass


class Retryable(MemflowError):
    """A passing fault: the message stays pending and is delivered again."""


class StoreUnavailable(Retryable):
    pass


class IndexRetired(StoreUnavailable):
    """This process's index was fenced or dropped by `memflow reindex`: its writes wait (Retryable, never
    dead-lettered) until the process is restarted with the model the store now records."""


class StaleVersion(Retryable):
    pass


class EmbedderUnavailable(Retryable):
    """No vectors from the embedding endpoint: a write waits for it, a search says `failed`."""


class EmbedderRejected(Permanent):
    """The embedding endpoint refuses the input itself (too long, empty): asking again cannot help."""


class NotFound(MemflowError):
    """The memory asked for does not exist, or not for the subject named."""


class RpcError(MemflowError):
    """A call of the query worker that did not complete. `kind`: "timeout" when no worker answered in
    time, else the name of the error the worker raised ("NotFound", "StoreUnavailable", …), so that a
    front door can answer 404, 503 or 504 without reading messages."""

    def __init__(self, message: str, kind: str = "failed", worker_traceback: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        # Where the worker raised it, for a log at DEBUG: never in the message a caller reads.
        self.worker_traceback = worker_traceback


# The line a traceback ends with: "memflow.shared.errors.NotFound: no memory …", "ValueError: …".
_RAISED = re.compile(r"^[A-Za-z_][\w.]*: ")


def raised_said(traceback_text: str) -> str:
    """What the error a traceback ends with says, in one line, without its class's module path (a message may
    span lines: it starts at the last line that names an error)."""
    lines = traceback_text.strip().splitlines()
    starts = [i for i, line in enumerate(lines) if _RAISED.match(line)]
    said = "\n".join(lines[starts[-1]:]) if starts else lines[-1] if lines else traceback_text
    return " ".join(_RAISED.sub("", said, count=1).split()) or "the worker failed without a message"
