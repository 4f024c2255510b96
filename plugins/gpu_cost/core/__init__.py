"""Core: the records that flow through the loop, errors, time, redaction, paths. Imports nothing of the package."""
