"""validation: the nsa-validate orchestrator (runbooks, launchers, metrics, acceptance, reports)."""
