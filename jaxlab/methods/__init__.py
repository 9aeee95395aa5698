"""One package per paper: its algorithm as pure functions."""
