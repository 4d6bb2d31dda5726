"""Sweeps, reports and their committed results (``experiments/results/``); run from the repository root."""
