"""Device code. Every kernel here has a torch fallback (used on CPU) it is tested against."""
