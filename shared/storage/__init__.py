"""The memory store: one interface (store.py: `Store`, its filters, queries and catalog of indexes) and
the two engines behind it, Qdrant Edge in this process (edge_store.py, split into shards by subject in
edge_shards.py, each shard's index built in a process of its own by edge_build.py) and a Qdrant server through
qdrant-client (server_store.py), with the BM25 vectors both make alike (sparse.py). Nothing here touches Redis
or the stages: what writes to the store, and when, is shared/writer's."""
