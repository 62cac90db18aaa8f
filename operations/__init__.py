"""Desired-state operations for GPU nodes."""
