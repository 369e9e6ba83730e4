"""Rollout collection: datasets in, bounded-concurrency rollouts, run files, metrics, progress, compare."""
