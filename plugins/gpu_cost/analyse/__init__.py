"""Analyse: the rules (one module each), the evidence beyond utilisation, class baselines, replica sets, whose processes are ours."""
