"""slime.rollout.sglang_rollout: GenerateState (slime_like's rollout state; ``GenerateState(args)`` inside a rollout
answers the running one), generate (one sample's generation), generate_rollout (the default rollout function)."""
from slime_like.rollout.engine_http import post
from slime_like.rollout.generate import generate_rollout
from slime_like.rollout.generate_group import GenerateState, generate_sample as generate


def get_model_url(args, model_name: str, endpoint: str = "/generate") -> str:
    """slime's URL of a named model's router (--sglang-config); one served model here: the run's router address,
    which post() sends to the rollout's engines."""
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}{endpoint}"


__all__ = ["GenerateState", "generate", "generate_rollout", "get_model_url", "post"]
