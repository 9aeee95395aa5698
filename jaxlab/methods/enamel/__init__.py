"""enamel: the ENAMEL code-efficiency benchmark (Qiu et al., ICLR 2025)."""
