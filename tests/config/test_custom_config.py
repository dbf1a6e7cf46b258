"""--custom-config-path: slime's YAML of extra attributes (keys set on args; a flag's dest converted and validated
like the flag; bad keys refused together, naming the file and the key)."""
import pytest

from slime_like.config.errors import ConfigError

from cfg_helpers import parse, parse_report


def yaml_file(tmp_path, text):
    p = tmp_path / "extra.yaml"
    p.write_text(text)
    return str(p)


def test_free_keys_become_attributes_and_flags_are_converted(base, tmp_path):
    y = yaml_file(tmp_path, "use_tis: true\ntis_clip: '3'\nmax_turns: 5\nenv: {name: geo3k}\n")
    args, report = parse_report(base + ["--custom-config-path", y])
    assert args.use_tis is True and args.tis_clip == 3.0                 # flags, through their argparse type
    assert args.max_turns == 5 and args.env == {"name": "geo3k"}          # free attributes, as slime sets them
    assert args.custom_config == {"use_tis": True, "tis_clip": 3.0, "max_turns": 5, "env": {"name": "geo3k"}}
    assert any("env, max_turns" in w for w in report.warnings)


def test_a_flag_in_the_file_overrides_the_command_line_with_a_warning(base, tmp_path, capsys):
    y = yaml_file(tmp_path, "eps_clip: 0.3\n")
    args = parse(base + ["--eps-clip", "0.1", "--custom-config-path", y])
    assert args.eps_clip == 0.3 and args.eps_clip_high == 0.3            # derived defaults see the file's value
    assert "overrides --eps-clip 0.1 with 0.3" in capsys.readouterr().err


def test_file_values_are_validated_like_flags(base, tmp_path):
    y = yaml_file(tmp_path, "advantage_estimator: cispo\nuse_opsm: true\nloss_type: sft_loss\n")
    with pytest.raises(ConfigError, match="--use-opsm with --loss-type sft_loss"):
        parse(base + ["--custom-config-path", y])


def test_every_bad_key_is_named_at_once(base, tmp_path):
    y = yaml_file(tmp_path, "use_tis: maybe\ncli_dests: []\nuse_slime_router: true\n_private: 1\n")
    with pytest.raises(ConfigError) as e:
        parse(base + ["--custom-config-path", y])
    msg = str(e.value)
    assert "key 'use_tis': expected true or false" in msg
    assert "key 'cli_dests' names slime_like's own bookkeeping attribute" in msg
    assert "key 'use_slime_router' turns on slime's own router" in msg
    assert "key '_private': not an attribute name" in msg


@pytest.mark.parametrize("text, match", [("- a\n- b\n", "expected a mapping"), ("a: [\n", "not valid YAML")])
def test_a_file_that_is_no_mapping_is_refused(base, tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        parse(base + ["--custom-config-path", yaml_file(tmp_path, text)])


def test_a_missing_file_is_refused(base):
    with pytest.raises(ConfigError, match="--custom-config-path /nonexistent.yaml: no such file"):
        parse(base + ["--custom-config-path", "/nonexistent.yaml"])
