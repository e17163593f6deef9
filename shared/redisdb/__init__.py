"""The Redis (or Valkey) database memflow keeps its state in: the connections, configured once and
refused on a server too old (connections.py); every key and stream name (keys.py); what an acknowledged write
survives there (durability.py); per-day counters with a bound (counters.py); the upgrade of an older key layout
(migrate.py); and the server (server.py) or local cluster (cluster.py) memflow starts for itself and its tests."""
