"""slime.utils.types: Sample is slime_like's own class (slime_like/sample.py), Sample.Status its status enum."""
from slime_like.sample import Sample, Status

__all__ = ["Sample", "Status"]
