"""FreeCG and ViSNet: equivariant message passing with a grouped CG transform on abstract edges.

Shapes: B systems of N (padded) atoms, C channels, H heads; pairs are dense [B, N, N] (row i
receives from column j), vector features [B, N, 8, C] (l = 1 and l = 2 components first).

One layer, after the official `ViS_MP` (ShihaoShao-GH/FreeCG, freecg/models/freecg_block.py):

    x, vec <- LayerNorm(x), VecLayerNorm(vec)
    a_ij   = SiLU(sum_h q_i k_j dk_ij + Linear_C->H(sum_m vec_j[m] d_ij[m])) cutoff(r_ij)
    m_ij   = v_j dv_ij a_ij;  (s1, s2) = SiLU(Linear(m_ij));  vec_ij = vec_j s1 + s2 d_ij
    x_agg, vec_out = sum_j m_ij, sum_j vec_ij                 (vec_out: the abstract edges)
    (o1, o2, o3) = Linear(x_agg); dx = <vec1, vec2> o2 + o3; p = vec3 o1
    dvec = roll(GroupedCG(vec_out, p), -(G + G/2)) + vec_out   (FreeCG)
    dvec = p + vec_out                                          (ViSNet, cg = none)
    df_ij = SiLU(Linear(f_ij)) <rej(Lin(vec_i), d_ij), rej(Lin(vec_j), -d_ij)>  (not last layer)

Every message is computed as a dense [B, N, N, C] product and summed with einsum; the
[B, N, N, 8, C] per-pair vectors are never materialised.
"""
from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp

from jaxlab.methods.freecg.settings import ModelSettings
from jaxlab.zoo import equivariant as eq

CG_MODES = ("grouped", "dense", "none")


def shuffle_shift(groups: int) -> int:
  """The official abstract-edge shuffle rolls the channel axis left by G + G/2."""
  return groups + groups // 2


class NeighbourEmbedding(nnx.Module):
  """x_i <- Linear([x_i, sum_{j != i} Emb'(z_j) Linear(rbf_ij) cutoff(r_ij)])."""

  def __init__(self, s: ModelSettings, *, rngs: nnx.Rngs):
    self.embedding = nnx.Embed(s.max_z, s.channels, embedding_init=nnx.initializers.normal(1.0),
                               rngs=rngs)
    self.distance_proj = eq.xavier_linear(s.num_rbf, s.channels, rngs=rngs)
    self.combine = eq.xavier_linear(2 * s.channels, s.channels, rngs=rngs)
    self.cutoff = s.cutoff

  def __call__(self, x, numbers, rbf, distances, neighbour_pairs):
    weights = self.distance_proj(rbf) * (eq.cosine_cutoff(distances, self.cutoff)
                                         * neighbour_pairs)[..., None]
    neighbours = jnp.einsum("bijc,bjc->bic", weights, self.embedding(numbers))
    return self.combine(jnp.concatenate([x, neighbours], axis=-1))


class FreeCGLayer(nnx.Module):
  """One message-passing layer (see the module docstring); returns (dx, dvec, df or None)."""

  def __init__(self, s: ModelSettings, last_layer: bool, *, rngs: nnx.Rngs):
    c, h = s.channels, s.num_heads
    if c % h:
      raise ValueError(f"model.channels ({c}) must be divisible by model.num_heads ({h})")
    self.s, self.last_layer = s, last_layer
    self.layernorm = nnx.LayerNorm(c, epsilon=1e-5, rngs=rngs)
    self.vec_layernorm = eq.VecLayerNorm(c, s.vecnorm_type)
    self.vec_proj = eq.VectorLinear(c, 3 * c, rngs=rngs)
    self.q_proj = eq.xavier_linear(c, c, rngs=rngs)
    self.k_proj = eq.xavier_linear(c, c, rngs=rngs)
    self.v_proj = eq.xavier_linear(c, c, rngs=rngs)
    self.dk_proj = eq.xavier_linear(c, c, rngs=rngs)
    self.dv_proj = eq.xavier_linear(c, c, rngs=rngs)
    self.s_proj = eq.xavier_linear(c, 2 * c, rngs=rngs)
    self.o_proj = eq.xavier_linear(c, 3 * c, rngs=rngs)
    self.vec_edge_proj = (eq.xavier_linear(c, h, rngs=rngs) if s.attention_enhancer else None)
    if not last_layer:
      self.f_proj = eq.xavier_linear(c, c, rngs=rngs)
      self.w_src_proj = eq.VectorLinear(c, c, rngs=rngs)
      self.w_trg_proj = eq.VectorLinear(c, c, rngs=rngs)
    self.tp = (eq.GroupedTensorProduct(s.groups_used, s.edges, rngs=rngs,
                                       implementation=s.tp_implementation)
               if s.cg != "none" else None)

  def __call__(self, x, vec, f, sh, distances, pairs):
    s = self.s
    b, n, c = x.shape
    heads = s.num_heads
    x = self.layernorm(x)
    vec = self.vec_layernorm(vec)
    cutoff = eq.cosine_cutoff(distances, s.cutoff) * pairs                    # [B, N, N]

    q = self.q_proj(x).reshape(b, n, heads, -1)
    k = self.k_proj(x).reshape(b, n, heads, -1)
    v = self.v_proj(x)
    dk = jax.nn.silu(self.dk_proj(f)).reshape(b, n, n, heads, -1)
    dv = jax.nn.silu(self.dv_proj(f))
    vec1, vec2, vec3 = jnp.split(self.vec_proj(vec), 3, axis=-1)
    vec_dot = jnp.sum(vec1 * vec2, axis=-2)                                   # [B, N, C]

    logits = jnp.einsum("bihd,bjhd,bijhd->bijh", q, k, dk)
    if self.vec_edge_proj is not None:
      # The attention enhancer: the sender's vectors projected on the pair direction.
      logits = logits + self.vec_edge_proj(jnp.einsum("bjmc,bijm->bijc", vec, sh))
    attention = jax.nn.silu(logits) * cutoff[..., None]                       # [B, N, N, H]
    messages = (v[:, None, :, :] * dv).reshape(b, n, n, heads, -1) * attention[..., None]
    messages = messages.reshape(b, n, n, c)
    s1, s2 = jnp.split(jax.nn.silu(self.s_proj(messages)), 2, axis=-1)
    if s.smooth_cutoff:
      # The official s1, s2 keep SiLU(bias) at the cutoff, so a pair crossing it changes the
      # energy by a step; scaling by the cutoff makes the vector message vanish there.
      s1, s2 = s1 * cutoff[..., None], s2 * cutoff[..., None]
    weight = pairs[..., None].astype(x.dtype)
    x_agg = jnp.sum(messages * weight, axis=2)
    vec_out = (jnp.einsum("bijc,bjmc->bimc", s1 * weight, vec)
               + jnp.einsum("bijc,bijm->bimc", s2 * weight, sh))              # abstract edges

    o1, o2, o3 = jnp.split(self.o_proj(x_agg), 3, axis=-1)
    dx = vec_dot * o2 + o3
    node_vectors = vec3 * o1[:, :, None, :]
    if self.tp is None:
      dvec = node_vectors + vec_out
    else:
      mixed = self.tp(vec_out, node_vectors)
      if s.shuffle:
        mixed = jnp.roll(mixed, -shuffle_shift(s.groups_used), axis=-1)
      dvec = mixed + vec_out

    if self.last_layer:
      return dx, dvec, None
    # <rej(a_i, d), rej(b_j, -d)> with rej(u, d) = u - (u . d) d over the 8 components, expanded
    # so no [B, N, N, 8, C] tensor is formed.
    a = self.w_trg_proj(vec)
    bj = self.w_src_proj(vec)
    a_dot_d = jnp.einsum("bimc,bijm->bijc", a, sh)
    b_dot_d = jnp.einsum("bjmc,bijm->bijc", bj, sh)
    d_dot_d = jnp.sum(sh * sh, axis=-1)[..., None]
    w_dot = (jnp.einsum("bimc,bjmc->bijc", a, bj) - 2 * a_dot_d * b_dot_d
             + a_dot_d * b_dot_d * d_dot_d)
    df = jax.nn.silu(self.f_proj(f)) * w_dot * weight
    return dx, dvec, df


class FreeCG(nnx.Module):
  """Embedding, `layers` FreeCG layers and the EquivariantScalar head -> per-atom energies."""

  def __init__(self, s: ModelSettings, *, rngs: nnx.Rngs):
    if s.cg not in CG_MODES:
      raise ValueError(f"model.cg must be one of {CG_MODES}, got {s.cg!r}")
    if s.channels % s.groups_used:
      raise ValueError(f"model.groups ({s.groups_used}) x edges must equal model.channels "
                       f"({s.channels}): {s.channels} is not divisible by {s.groups_used}")
    self.s = s
    self.embedding = nnx.Embed(s.max_z, s.channels,
                               embedding_init=nnx.initializers.normal(1.0), rngs=rngs)
    self.neighbour_embedding = NeighbourEmbedding(s, rngs=rngs)
    self.edge_proj = eq.xavier_linear(s.num_rbf, s.channels, rngs=rngs)
    self.layers = nnx.List([FreeCGLayer(s, last_layer=i == s.layers - 1, rngs=rngs)
                            for i in range(s.layers)])
    self.out_norm = nnx.LayerNorm(s.channels, epsilon=1e-5, rngs=rngs)
    self.vec_out_norm = eq.VecLayerNorm(s.channels, s.vecnorm_type)
    self.head = nnx.List([
        eq.GatedEquivariantBlock(s.channels, s.channels // 2, scalar_activation=True, rngs=rngs),
        eq.GatedEquivariantBlock(s.channels // 2, 1, rngs=rngs)])

  def __call__(self, positions, numbers, atom_mask):
    """positions [B, N, 3], numbers [B, N] int, atom_mask [B, N] bool -> energies [B, N]."""
    s = self.s
    pairs = eq.neighbour_mask(positions, atom_mask, s.cutoff, s.max_neighbours)  # self kept
    distances, units = eq.pair_distances(positions, pairs)
    eye = jnp.eye(positions.shape[1], dtype=bool)[None]
    weight = pairs[..., None].astype(positions.dtype)
    rbf = eq.expnorm_rbf(distances, s.cutoff, s.num_rbf) * weight
    sh = eq.spherical_harmonics(units)                                   # 0 on self pairs

    x = self.embedding(numbers)
    x = self.neighbour_embedding(x, numbers, rbf, distances, pairs & ~eye)
    f = (x[:, :, None, :] + x[:, None, :, :]) * self.edge_proj(rbf) * weight
    vec = jnp.zeros(x.shape[:2] + (eq.NUM_COMPONENTS, s.channels), x.dtype)
    for layer in self.layers:
      dx, dvec, df = layer(x, vec, f, sh, distances, pairs)
      x, vec = x + dx, vec + dvec
      if df is not None:
        f = f + df
    x = self.out_norm(x)
    vec = self.vec_out_norm(vec)
    for block in self.head:
      x, vec = block(x, vec)
    return x[..., 0] * atom_mask
