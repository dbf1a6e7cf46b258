"""slime.agent is refused: slime's coding-agent harness drives Claude Code / Codex CLIs in E2B cloud sandboxes
(external services and binaries this project neither ships nor reaches); see docs/guide.md 'Bringing slime code'.
Agent frameworks talk to slime_like through its OpenAI-compatible endpoint instead."""
raise ImportError("slime.agent (Claude Code / Codex harnesses in E2B sandboxes) is not provided by slime_like: it "
                  "drives external CLIs and a cloud sandbox service; see docs/guide.md 'Bringing slime code'")
