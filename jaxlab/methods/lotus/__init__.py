"""lotus: diffusion-based dense prediction with single-step x0 prediction (He et al., ICLR 2025)."""
