"""Privacy-audited OpenFL workspace code (data, models, data loader, task runner, auditor)."""
