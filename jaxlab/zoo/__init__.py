"""The shared Flax NNX module zoo. Generic layers only; nothing here knows any paper."""
