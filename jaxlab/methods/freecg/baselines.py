"""Baselines for FreeCG with its model's interface: SchNet and a NequIP-like model.

Both map (positions [B, N, 3], numbers [B, N], atom_mask [B, N]) to raw per-atom energies
[B, N] (zero on padded atoms), on the dense pair masks of `jaxlab.zoo.equivariant` without self
pairs, so every shape is static and forces are -d(sum of energies)/d(positions).
"""
from __future__ import annotations

import math

import e3nn_jax as e3nn
from flax import nnx
import jax
import jax.numpy as jnp

from jaxlab.methods.freecg.settings import ModelSettings
from jaxlab.zoo import equivariant

# NequIP divides the summed messages by sqrt(the data set's mean neighbour count); a constant
# keeps the model free of data statistics (an fcc metal has 12 first and ~40 neighbours in 5 A).
AVG_NEIGHBOURS = 10.0


def shifted_softplus(x: jax.Array) -> jax.Array:
  """softplus(x) - log 2: SchNet's activation, zero at zero."""
  return jax.nn.softplus(x) - math.log(2.0)


# ---------------------------------------------------------------------------------------------
# SchNet
# ---------------------------------------------------------------------------------------------

class SchNetInteraction(nnx.Module):
  """cfconv (filter W_ij = Dense(ssp(Dense(rbf_ij))) cos_cutoff(d_ij)), then ssp and Dense."""

  def __init__(self, channels: int, num_rbf: int, *, rngs: nnx.Rngs):
    # torchmd-net's default: as many filters as channels.
    self.filter1 = equivariant.xavier_linear(num_rbf, channels, rngs=rngs)
    self.filter2 = equivariant.xavier_linear(channels, channels, rngs=rngs)
    self.into_filters = equivariant.xavier_linear(channels, channels, use_bias=False, rngs=rngs)
    self.out_of_filters = equivariant.xavier_linear(channels, channels, rngs=rngs)
    self.out = equivariant.xavier_linear(channels, channels, rngs=rngs)

  def __call__(self, x: jax.Array, rbf: jax.Array, envelope: jax.Array) -> jax.Array:
    """x [B, N, C], rbf [B, N, N, K], envelope [B, N, N] (zero off the pair mask)."""
    filters = self.filter2(shifted_softplus(self.filter1(rbf))) * envelope[..., None]
    messages = jnp.einsum("bijf,bjf->bif", filters, self.into_filters(x))
    return self.out(shifted_softplus(self.out_of_filters(messages)))


class SchNet(nnx.Module):
  """SchNet (Schütt et al., J. Chem. Phys. 148, 241722, 2018), as torchmd-net builds it.

  Element embedding, `settings.layers` residual continuous-filter interactions on Gaussian
  distance features, and an ssp MLP head C -> C/2 -> 1 per atom.
  """

  def __init__(self, settings: ModelSettings, *, rngs: nnx.Rngs):
    channels = settings.channels
    self.cutoff = float(settings.cutoff)
    self.num_rbf = settings.num_rbf
    self.max_neighbours = settings.max_neighbours
    # torch.nn.Embedding's N(0, 1).
    self.embedding = nnx.Embed(settings.max_z, channels,
                               embedding_init=nnx.initializers.normal(1.0), rngs=rngs)
    self.interactions = nnx.List([SchNetInteraction(channels, settings.num_rbf, rngs=rngs)
                                  for _ in range(settings.layers)])
    self.head_hidden = equivariant.xavier_linear(channels, channels // 2, rngs=rngs)
    self.head_out = equivariant.xavier_linear(channels // 2, 1, rngs=rngs)

  def __call__(self, positions: jax.Array, numbers: jax.Array,
               atom_mask: jax.Array) -> jax.Array:
    pair_mask = equivariant.neighbour_mask(positions, atom_mask, self.cutoff,
                                           self.max_neighbours, self_pairs=False)
    distances, _ = equivariant.pair_distances(positions, pair_mask)
    rbf = equivariant.gaussian_rbf(distances, self.cutoff, self.num_rbf)
    envelope = jnp.where(pair_mask, equivariant.cosine_cutoff(distances, self.cutoff), 0.0)
    x = self.embedding(numbers)
    for interaction in self.interactions:
      x = x + interaction(x, rbf, envelope)
    energies = self.head_out(shifted_softplus(self.head_hidden(x)))[..., 0]
    return jnp.where(atom_mask, energies, 0.0)


# ---------------------------------------------------------------------------------------------
# NequIP-like
# ---------------------------------------------------------------------------------------------

class IrrepsLinear(nnx.Module):
  """Equivariant linear map between irreps: per output irrep, a [mul_in, mul_out] matrix over
  all input channels of the same irrep, divided by sqrt(mul_in) (e3nn's normalisation, so
  N(0, 1) weights preserve the feature scale). No bias: one on non-scalars would break
  equivariance, and the scalars do without. An output irrep with no input is zero.
  """

  def __init__(self, irreps_in: str | e3nn.Irreps, irreps_out: str | e3nn.Irreps, *,
               rngs: nnx.Rngs):
    irreps_in, irreps_out = e3nn.Irreps(irreps_in), e3nn.Irreps(irreps_out)
    # Strings keep the attributes static and printable.
    self.irreps_in, self.irreps_out = str(irreps_in), str(irreps_out)
    weights = []
    for mul_out, ir in irreps_out:
      mul_in = sum(mul for mul, ir_in in irreps_in if ir_in == ir)
      if mul_in:
        weights.append(nnx.Param(jax.random.normal(rngs.params(), (mul_in, mul_out))))
    self.weights = nnx.List(weights)

  def __call__(self, x: e3nn.IrrepsArray) -> e3nn.IrrepsArray:
    if x.irreps != e3nn.Irreps(self.irreps_in):
      raise ValueError(f"IrrepsLinear expects {self.irreps_in}, got {x.irreps}")
    lead = x.shape[:-1]
    chunks, index = [], 0
    for mul_out, ir in e3nn.Irreps(self.irreps_out):
      inputs = [chunk if chunk is not None else jnp.zeros(lead + (mul, ir.dim), x.dtype)
                for (mul, ir_in), chunk in zip(x.irreps, x.chunks) if ir_in == ir]
      if not inputs:
        chunks.append(None)
        continue
      stacked = jnp.concatenate(inputs, axis=-2)                        # [..., mul_in, dim]
      weight = self.weights[index][...].astype(x.dtype)
      index += 1
      chunks.append(jnp.einsum("...ud,uw->...wd", stacked, weight) / math.sqrt(weight.shape[0]))
    return e3nn.from_chunks(self.irreps_out, chunks, lead, x.dtype)


class NequIPLayer(nnx.Module):
  """One NequIP interaction: a sender self-interaction, the CG product of sender features with
  the edge's spherical harmonics (paths into 0e, 1o, 2e), one radial weight per product channel,
  a neighbour sum, a linear plus a self connection into gate irreps, the gate, a residual."""

  def __init__(self, node_irreps: e3nn.Irreps, gate_irreps: e3nn.Irreps, num_basis: int,
               radial_hidden: int, *, rngs: nnx.Rngs):
    edge_irreps = e3nn.Irreps("0e+1o+2e")
    self.filter_ir_out = tuple(str(mul_ir.ir) for mul_ir in edge_irreps)
    message_irreps = e3nn.tensor_product(node_irreps, edge_irreps,
                                         filter_ir_out=list(self.filter_ir_out))
    self.message_irreps = str(message_irreps)
    self.node_irreps = str(node_irreps)
    self.pre = IrrepsLinear(node_irreps, node_irreps, rngs=rngs)
    self.radial1 = equivariant.xavier_linear(num_basis, radial_hidden, rngs=rngs)
    self.radial2 = equivariant.xavier_linear(radial_hidden, radial_hidden, rngs=rngs)
    self.radial3 = equivariant.xavier_linear(radial_hidden, message_irreps.num_irreps,
                                             rngs=rngs)
    self.post = IrrepsLinear(message_irreps, gate_irreps, rngs=rngs)
    self.self_connection = IrrepsLinear(node_irreps, gate_irreps, rngs=rngs)

  def __call__(self, h: e3nn.IrrepsArray, edge_sh: e3nn.IrrepsArray, basis: jax.Array,
               envelope: jax.Array) -> e3nn.IrrepsArray:
    """h [B, N] node irreps, edge_sh [B, N, N] 0e+1o+2e, basis [B, N, N, K], envelope
    [B, N, N] (zero off the pair mask, so masked pairs send nothing)."""
    senders = self.pre(h)
    products = e3nn.tensor_product(senders[:, None, :], edge_sh,
                                   filter_ir_out=list(self.filter_ir_out))
    if products.irreps != e3nn.Irreps(self.message_irreps):
      raise ValueError(f"messages have irreps {products.irreps}, expected {self.message_irreps}")
    radial = self.radial3(jax.nn.silu(self.radial2(jax.nn.silu(self.radial1(basis)))))
    weights = radial * envelope[..., None]                                # [B, N, N, W]
    lead = h.shape[:-1]
    chunks, start = [], 0
    for (mul, _), chunk in zip(products.irreps, products.chunks):
      w = weights[..., start:start + mul]
      start += mul
      # A weighted sum over senders j: one batched contraction, no [B, N, N, dim] product.
      chunks.append(None if chunk is None else
                    jnp.einsum("bijud,biju->biud", chunk, w) / math.sqrt(AVG_NEIGHBOURS))
    messages = e3nn.from_chunks(self.message_irreps, chunks, lead, h.dtype)
    update = self.post(messages) + self.self_connection(h)
    gated = e3nn.gate(update, even_act=jax.nn.silu, even_gate_act=jax.nn.sigmoid)
    if gated.irreps == h.irreps:
      return h + gated
    return gated


class NequIPLike(nnx.Module):
  """A NequIP-like model (Batzner et al., Nat. Commun. 13, 2453, 2022) with e3nn-jax.

  Node features (C/2)x0e + (C/4)x1o + (C/8)x2e (32x0e+16x1o+8x2e at C = 64), starting from an
  element embedding in the scalars. Each of `settings.layers` layers (`NequIPLayer`) takes
  lmax = 2 edge spherical harmonics, radial weights from an MLP on 8 Bessel functions times the
  polynomial envelope (p = 6), sums messages over neighbours divided by sqrt(AVG_NEIGHBOURS) =
  sqrt(10) (a constant instead of the data set's mean neighbour count), and gates (silu on
  scalars, sigmoid gates on 1o and 2e). Head: linear to 16x0e, silu, linear to one scalar.
  Simplifications: the self connection is a plain linear (NequIP's is species-dependent), the
  radial MLP is 2 x 64 wide, and the features keep one parity per l.
  """

  NUM_BASIS = 8
  RADIAL_HIDDEN = 64
  HEAD_SCALARS = 16

  def __init__(self, settings: ModelSettings, *, rngs: nnx.Rngs):
    channels = settings.channels
    if channels % 8:
      raise ValueError(f"NequIPLike needs channels divisible by 8, got {channels}")
    scalars, vectors, tensors = channels // 2, channels // 4, channels // 8
    node_irreps = e3nn.Irreps(f"{scalars}x0e+{vectors}x1o+{tensors}x2e")
    # The gate reads the last vectors + tensors scalars as gates of the 1o and 2e channels.
    gate_irreps = e3nn.Irreps(f"{scalars + vectors + tensors}x0e+{vectors}x1o+{tensors}x2e")
    self.node_irreps = str(node_irreps)
    self.cutoff = float(settings.cutoff)
    self.max_neighbours = settings.max_neighbours
    self.embedding = nnx.Embed(settings.max_z, scalars,
                               embedding_init=nnx.initializers.normal(1.0), rngs=rngs)
    self.layers = nnx.List([NequIPLayer(node_irreps, gate_irreps, self.NUM_BASIS,
                                        self.RADIAL_HIDDEN, rngs=rngs)
                            for _ in range(settings.layers)])
    self.head_hidden = IrrepsLinear(node_irreps, f"{self.HEAD_SCALARS}x0e", rngs=rngs)
    self.head_out = IrrepsLinear(f"{self.HEAD_SCALARS}x0e", "0e", rngs=rngs)

  def node_features(self, positions: jax.Array, numbers: jax.Array,
                    atom_mask: jax.Array) -> e3nn.IrrepsArray:
    """The last layer's node features, an IrrepsArray [B, N] of `self.node_irreps`."""
    pair_mask = equivariant.neighbour_mask(positions, atom_mask, self.cutoff,
                                           self.max_neighbours, self_pairs=False)
    distances, units = equivariant.pair_distances(positions, pair_mask)
    # Masked pairs have zero unit vectors but Y_0 = 1; the zero envelope there drops them.
    edge_sh = e3nn.spherical_harmonics("0e+1o+2e", units, normalize=False)
    edge_sh = e3nn.IrrepsArray(edge_sh.irreps,
                               jnp.where(pair_mask[..., None], edge_sh.array, 0.0))
    basis = equivariant.bessel_rbf(distances, self.cutoff, self.NUM_BASIS)
    envelope = jnp.where(pair_mask, equivariant.polynomial_cutoff(distances, self.cutoff), 0.0)
    scalars = self.embedding(numbers)
    lead = scalars.shape[:-1]
    node_irreps = e3nn.Irreps(self.node_irreps)
    rest = jnp.zeros(lead + (node_irreps.dim - scalars.shape[-1],), scalars.dtype)
    h = e3nn.IrrepsArray(node_irreps, jnp.concatenate([scalars, rest], axis=-1))
    for layer in self.layers:
      h = layer(h, edge_sh, basis, envelope)
    return h

  def __call__(self, positions: jax.Array, numbers: jax.Array,
               atom_mask: jax.Array) -> jax.Array:
    h = self.node_features(positions, numbers, atom_mask)
    hidden = self.head_hidden(h)
    hidden = e3nn.IrrepsArray(hidden.irreps, jax.nn.silu(hidden.array))
    energies = self.head_out(hidden).array[..., 0]
    return jnp.where(atom_mask, energies, 0.0)
