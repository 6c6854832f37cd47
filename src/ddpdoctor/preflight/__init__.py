"""Preflight (`ddpdoctor check`): environment facts, checks over them, consistency across ranks,
a short collective test under torchrun, and transport bisection when it fails. torch is only
imported lazily, inside the functions that need it."""
