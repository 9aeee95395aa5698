"""ise: Instructional Segment Embedding (Wu et al., ICLR 2025) on a from-scratch decoder."""
