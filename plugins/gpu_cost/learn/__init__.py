"""Learn: what happened after each decision (outcomes) and the verifier learnt from it."""
