"""Campaigns, their realisations and every attempt at each realisation."""
