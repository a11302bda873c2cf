"""Inspecting a run, each a `main(argv) -> int` behind a `hybridrl` subcommand: `plot`
(curves from metrics.jsonl), `view` (browse sample dumps), `config --show` (the resolved
config) and `diagnose` (versions, devices, optional parts)."""
