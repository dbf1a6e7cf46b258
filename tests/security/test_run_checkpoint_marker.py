"""The run marker's resume rule on a Megatron checkpoint layout (iter dirs with metadata.json + PUBLISHED and
each role's latest_checkpointed_iteration.txt): cheap cases next to the end-to-end test in tests/loop."""
import json

import pytest

from slime_like.ray.run_checkpoint import MARKER, CheckpointMismatch, resume_iteration, write_marker


def _role(root, *iterations, tracker=None):
    for it in iterations:
        d = root / f"iter_{it:07d}"
        d.mkdir(parents=True)
        (d / "metadata.json").write_text("{}")
        (d / "PUBLISHED").write_text("")
    root.mkdir(parents=True, exist_ok=True)
    if iterations:
        (root / "latest_checkpointed_iteration.txt").write_text(str(tracker if tracker is not None else iterations[-1]))
    return str(root)


def test_marker_wins_over_a_newer_critic(tmp_path):
    actor, critic = _role(tmp_path / "a", 0, 1), _role(tmp_path / "a_critic", 0, 1, 2)
    write_marker(actor, 1, {"actor": actor, "critic": critic})
    assert json.loads((tmp_path / "a" / MARKER).read_text())["iteration"] == 1
    assert resume_iteration(actor, critic) == 1


def test_without_marker_roles_resume_at_their_common_iteration(tmp_path):
    actor, critic = _role(tmp_path / "a", 0, 1), _role(tmp_path / "a_critic", 0, 1, 2)
    assert resume_iteration(actor, critic) == 1
    assert resume_iteration(actor, None) == 1
    assert resume_iteration(str(tmp_path / "fresh"), None) is None


def test_stray_critic_and_missing_iterations_are_refused(tmp_path):
    critic = _role(tmp_path / "a_critic", 3)
    with pytest.raises(CheckpointMismatch, match="another run"):
        resume_iteration(str(tmp_path / "a"), critic)
    with pytest.raises(CheckpointMismatch, match="another run"):
        resume_iteration(None, critic)
    actor = _role(tmp_path / "b", 1)
    write_marker(actor, 1, {"actor": actor, "critic": str(tmp_path / "b_critic")})
    with pytest.raises(CheckpointMismatch, match=r"b_critic/iter_0000001: no such directory\), and no older iteration"):
        resume_iteration(actor, _role(tmp_path / "b_critic", 0))


def test_a_missing_critic_iteration_falls_back_to_one_both_roles_have(tmp_path, caplog):
    actor = _role(tmp_path / "b", 0, 1)
    write_marker(actor, 1, {"actor": actor, "critic": str(tmp_path / "b_critic")})
    assert resume_iteration(actor, _role(tmp_path / "b_critic", 0)) == 0
    assert "b_critic/iter_0000001: no such directory; resuming from iteration 0" in caplog.text
