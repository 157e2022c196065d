"""sgl-ess: ESS latent-cache offload for sparse-attention MLA models (SGLang overlay)."""
__version__ = "0.1.0"
