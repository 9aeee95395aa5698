"""btbs_lns: Binarized-Tightening, Branch and Search on learned LNS policies for MIP (Yuan et al.,\nICLR 2025; reconstructed, no code was released). Only the instance generators exist so far."""
