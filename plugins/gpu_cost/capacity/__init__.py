"""Capacity: forecasts, off-hours power, reservations for peaks, right-sizing at submission."""
