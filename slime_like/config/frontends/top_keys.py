"""The top-level keys that identify an RLinf or a ROLL training file (a leaf module: the SGLang passthrough reads
them to refuse such a file as --sglang-config without importing the front-ends, which import the parser)."""

RLINF_TOP_KEYS = ("cluster", "runner", "algorithm", "inference", "rollout", "data", "actor", "reward", "critic")
ROLL_TOP_KEYS = ("actor_train", "actor_infer", "reference", "rollout_batch_size", "num_return_sequences_in_group",
                 "prompt_length", "response_length")
