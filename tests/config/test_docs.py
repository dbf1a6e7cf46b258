"""docs/configuration.md documents every flag and every group."""
import os

from slime_like.config.parser import GROUP_ORDER, build_parser

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "configuration.md")


def test_every_flag_and_group_is_documented():
    text = open(DOC).read()
    parser, _ = build_parser()
    missing = [o for o in parser._option_string_actions if o.startswith("--") and o != "--help" and f"`{o}`" not in text]
    assert missing == []
    assert all(f"### {g}\n" in text for g in GROUP_ORDER)
