"""In-process instrumentation that runs inside the user's ranks.

Contract: stdlib only at import time, a no-op when disabled, never raises into the host program.
"""
