"""The loop's ways in: one sweep (perceive, analyse, decide, record, then act), the manual reclaim, the agent's own health."""
