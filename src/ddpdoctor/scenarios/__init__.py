"""Real fault reproductions: tiny torchrun/gloo programs that each inject one failure, the table
that describes them (catalog), the runner that executes one and captures what it printed, and the
logs captured from real runs (package data). torch is only needed to run them, never to import."""
