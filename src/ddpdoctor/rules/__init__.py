"""The knowledge base: one module per rule family, one registry table (registry.py)."""
