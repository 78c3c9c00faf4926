"""Enrichment sources (config, environment, host, Kubernetes, Docker) and their cache."""
