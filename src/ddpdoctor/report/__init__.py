"""Rendering of reports (JSON, terminal, HTML). Never imports rules or analysis."""
