"""Runbooks: the model every kind reads a step through (model, schema, expressions), and the loader that reads a
runbook file with its includes and overrides and checks it against the kinds (loader, includes, overrides, plan).
"""
