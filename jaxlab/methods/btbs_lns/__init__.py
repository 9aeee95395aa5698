"""btbs_lns: Binarized-Tightening, Branch and Search on learned LNS policies for MIP (Yuan et al.,
ICLR 2025; reconstructed, no code was released). Built so far: the instance generators, the
binarized-tightening interval and the primal gap / integral; no solver interface, policy or
experiment yet."""
