"""hybridrl: RL post-training for LLMs in the single-controller (HybridFlow) style.

Importing the package is light on purpose: no Ray, no transformers, no Hydra here.
"""

__version__ = "0.1.0"
