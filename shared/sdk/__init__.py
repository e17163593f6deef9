"""What a caller of memflow holds: `MemoryClient` (client.py), which publishes events and calls the
query worker; the table of those calls, a request and a reply model each, which the worker is built from too
(rpc.py); and export and import as the client does them (transfer.py)."""
