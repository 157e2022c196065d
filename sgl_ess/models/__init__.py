"""Embedded model assets (config + tokenizer only; weights are random at load time)."""
import os

TINY_DSV32_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_dsv32")
TINY_GLM5_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_glm5")
TINY_DSV32_H200_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_dsv32_h200")
TINY_HYV4_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_hyv4")
TINY_GLM52_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_glm52")
