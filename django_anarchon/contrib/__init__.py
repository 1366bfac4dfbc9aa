"""Integrations that need an optional extra; each imports its dependency only in its module."""
