"""Gaussian diffusion (DDPM / DDIM) building blocks shared by the diffusion-based methods.

* `schedules`: noise schedules (`Schedule`, linear and cosine), the forward process `q_sample`,
  and conversions between the three usual model outputs (noise `eps`, clean signal `x0`, and
  velocity `v`), so a method can train and sample with whichever parameterization it uses.
* `sampling`: ancestral DDPM and DDIM samplers as single `jax.lax.scan`s, differentiable with
  respect to the denoiser's parameters and the starting noise (optionally rematerialised), with
  a guidance hook; `ddim_sample_with_kl` also returns each step's KL to a reference denoiser.

Nothing here knows which method uses it: a denoiser is any function (xt [B, ...], t [B]) -> output.
"""
