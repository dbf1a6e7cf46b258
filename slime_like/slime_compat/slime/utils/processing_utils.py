"""slime.utils.processing_utils: load_tokenizer. Image / video processing (build_processor_kwargs,
encode_image_for_rollout_engine, load_processor) is refused: slime_like's engines and trainers are text-only."""
from slime_like.utils.tokenizer import load_tokenizer

_MULTIMODAL = ("build_processor_kwargs", "encode_image_for_rollout_engine", "load_processor", "process_vision_info")


def __getattr__(name):
    if name in _MULTIMODAL:
        raise ImportError(f"slime.utils.processing_utils.{name} is not provided by slime_like: its engines and "
                          "trainers are text-only (no image / video inputs); see docs/guide.md 'Bringing slime code'")
    raise AttributeError(f"module 'slime.utils.processing_utils' has no attribute {name!r}")


__all__ = ["load_tokenizer"]
