"""megamoe: the fused expert-parallel MoE layer for Hopper."""
