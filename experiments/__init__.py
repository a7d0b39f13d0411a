"""Paper reproductions and measurements, one package per experiment: see README.md and harness.py."""
