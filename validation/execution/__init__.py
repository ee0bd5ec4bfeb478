"""Running a runbook's steps: the runner, its acceptance criteria, and the evidence rules (what interference and
impossible figures mean for a verdict).
"""
