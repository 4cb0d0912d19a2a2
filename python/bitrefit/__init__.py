"""bitrefit: bit-exact delta refit of model weights from RL trainers to rollout engines.

Placeholder; filled below.
"""
from ._bitrefit import *  # noqa: F401,F403
