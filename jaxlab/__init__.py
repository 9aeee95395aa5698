"""jaxlab: ICLR 2025 methods as pure, jitted JAX functions over one shared Flax module zoo.

Importing jaxlab never touches a JAX backend (so `jax.distributed.initialize()` can run first).
"""
__version__ = "0.1.0"
