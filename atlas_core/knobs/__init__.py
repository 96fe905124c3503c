"""The four MIRAS knobs plus the feature map: small objects, pure math.

A memory rule is the online minimisation, token by token, of an attentional bias plus a retention
term, by an inner optimiser (the algorithm), over a memory structure (docs/math.md, "The four MIRAS
knobs"). Each interface lives in its own module; the core implementations are in
`atlas_core.components`.
"""

from .algorithm import Algorithm
from .bias import Bias
from .feature_map import FeatureMap
from .gates import Gate
from .retention import Retention
from .structure import Structure

__all__ = ["Algorithm", "Bias", "FeatureMap", "Gate", "Retention", "Structure"]
