"""memflow's domain: models and pure decision logic. No I/O, no clock, no engines."""
