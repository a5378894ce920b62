"""Integrations with frameworks (each imports its framework: install the matching extra)."""
