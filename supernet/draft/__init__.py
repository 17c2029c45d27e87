"""The DREAM-S draft: elastic attention, the supernet model, its layers and state, extraction
of one subnet into a compact draft, and the supernet checkpoint."""
