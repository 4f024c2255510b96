"""Actions: turn decisions into effects. Every executor is dry-run aware and audited."""
