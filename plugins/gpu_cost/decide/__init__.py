"""Decide: the engine (guard, ladder, caps), protections, the cost of being wrong, snoozes, answers."""
