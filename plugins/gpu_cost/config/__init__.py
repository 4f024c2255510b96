"""Config: the policy file, its schema (from the rules' and actions' declarations) and its loader."""
