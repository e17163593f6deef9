"""memflow behind the memory interfaces agent frameworks already define (docs/integrations.md): LangGraph's
long-term store (`langgraph_store.MemflowStore`) and Google ADK's memory service (`adk_memory.MemflowMemoryService`).

Each speaks to `memflow serve` over HTTP with a key (`http.MemflowHttp`), as an agent's process would: it loads
no store engine, no model and no Redis client, and needs only httpx and its framework (extras `langgraph`, `adk`).
"""
