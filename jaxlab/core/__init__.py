"""Shared machinery: mesh, train loop, checkpoints, metrics, configs, CLI, results. Paper-agnostic."""
