"""Who comes through the front doors (the HTTP API and /mcp), and how much: the API keys and the
subjects each may reach (apikeys.py), the rule of each key's fair share (fairness.py: pure) and that share's
record in Redis, one budget per key across every server process (shares.py)."""
