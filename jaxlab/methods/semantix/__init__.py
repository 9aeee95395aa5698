"""semantix: Semantix (He et al., ICLR 2025), energy-guided sampling for semantic style\ntransfer, reconstructed (no code was released)."""
