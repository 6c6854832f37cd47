"""Ingestion: turn the user's paths into byte streams and log lines into Records.
Lenient by design: bad input is counted and reported, never raised."""
