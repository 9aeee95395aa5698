"""attention_pruning: pruning attention so the softmax attention matrix is kept (Liang et al., ICLR 2025)."""
