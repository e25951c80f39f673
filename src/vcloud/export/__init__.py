"""Outputs for people: the offline viewer and the run report's figures and tables."""
