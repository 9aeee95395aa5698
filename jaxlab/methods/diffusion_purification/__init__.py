"""diffusion_purification: stochasticity in diffusion-based purification, ADDT and RBGM (Liu et
al., ICLR 2025). Work in progress: the purifier, the attacks' building blocks and RBGM exist;
training, ADDT fine-tuning and the reproduction do not yet (see README.md)."""
