"""ctrl: adding conditional control to diffusion models with reinforcement learning (Zhao et al., ICLR 2025)."""
