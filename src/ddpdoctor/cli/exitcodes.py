"""Exit codes of design.md: the contract scripts depend on."""

OK = 0
FAILURE_FOUND = 1
USAGE_OR_INPUT = 2
INTERNAL = 3
