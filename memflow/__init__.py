"""memflow: long-term memory for LLM agents.

The SDK is what this module exports (`from memflow import MemoryClient`). The rest of the
product lives in sub-packages of this one namespace — `memflow.pipeline` (pure logic),
`memflow.shared` (adapters), `memflow.workers`, `memflow.scheduler`, `memflow.bench` — so
that installing memflow puts nothing but `memflow` at the top level of an environment.
In the repository they are the top-level folders; `memflow/` links to them.

Exports load on first use: `import memflow.pipeline.models` stays as light as the pure
pipeline is.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memflow.pipeline.models import ChatEvent, PackedPrompt, SearchResult
    from memflow.shared.errors import InvalidInput, RpcError
    from memflow.shared.sdk.client import MemoryClient
    from memflow.shared.settings import Settings, get_settings

_EXPORTS = {
    "MemoryClient": "memflow.shared.sdk.client",
    "ChatEvent": "memflow.pipeline.models",
    "SearchResult": "memflow.pipeline.models",
    "PackedPrompt": "memflow.pipeline.models",
    "InvalidInput": "memflow.shared.errors",
    "RpcError": "memflow.shared.errors",
    "Settings": "memflow.shared.settings",
    "get_settings": "memflow.shared.settings",
}

__all__ = ["ChatEvent", "InvalidInput", "MemoryClient", "PackedPrompt", "RpcError", "SearchResult", "Settings",
           "get_settings"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'memflow' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
