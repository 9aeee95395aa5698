"""TFDS builders (array_record, no TensorFlow) and the grain pipeline."""
