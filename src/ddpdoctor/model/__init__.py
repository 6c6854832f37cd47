"""Plain data types shared by every layer. Stdlib only; no behaviour beyond small helpers."""
