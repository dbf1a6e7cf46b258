"""slime.utils.external_utils is refused: its command_utils launch slime's own training scripts
(execute_train builds a `ray job submit ... python3 train.py` of slime's tree); run slime_like's train.py."""
raise ImportError("slime.utils.external_utils (slime's launcher of its own train.py scripts) is not provided by "
                  "slime_like: start runs with slime_like's train.py; see docs/guide.md 'Bringing slime code'")
