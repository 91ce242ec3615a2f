"""DistributedStrategy: Fleet-compatible access, strict validation, lossless prototxt/YAML."""
import pytest
from google.protobuf.descriptor import FieldDescriptor as FD

import fleetlite as fleet
from fleetlite.strategy import schema
from fleetlite.errors import (CompileError, FieldRangeError, FieldTypeError, StrategyConflictError,
                              StrategyFileError, UnknownFieldError)
from fleetlite.strategy.field_rules import RULES, OneOf, Range
from fleetlite.proto import strategy_pb2
from fleetlite.topology.topology import Topology


def _non_default_scalar(field, path):
    """A schema-valid value different from the field's default."""
    rule = RULES.get(path)
    default = None if schema._is_repeated(field) else field.default_value
    if isinstance(rule, OneOf):
        return next(c for c in rule.choices if c != default)
    if field.type == FD.TYPE_BOOL:
        return not default
    if field.type == FD.TYPE_ENUM:
        return next(v.name for v in field.enum_type.values if v.number != default)
    if field.type == FD.TYPE_STRING:
        return "changed"
    if field.type in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
        if isinstance(rule, Range) and rule.high is not None:
            return 0.25 if default != 0.25 else 0.5
        return (default or 0) + 1.5
    return (default or 0) + 2 if isinstance(default, int) and default >= 0 else 3


def _every_field_changed(descriptor, path=""):
    values = {}
    for field in descriptor.fields:
        dotted = schema.join(path, field.name)
        if field.type == FD.TYPE_MESSAGE:
            inner = _every_field_changed(field.message_type, dotted)
            values[field.name] = [inner] if schema._is_repeated(field) else inner
        elif schema._is_repeated(field):
            values[field.name] = [_non_default_scalar(field, dotted)] * 2
        else:
            values[field.name] = _non_default_scalar(field, dotted)
    return values


@pytest.fixture
def full_strategy():
    strategy = fleet.DistributedStrategy()
    for name, value in _every_field_changed(strategy_pb2.DistributedStrategy.DESCRIPTOR).items():
        setattr(strategy, name, value)
    return strategy


def test_every_field_round_trips_in_both_formats(full_strategy, tmp_path):
    defaults = fleet.DistributedStrategy()
    assert len(full_strategy.diff(defaults)) == len(schema.flatten(defaults.to_dict(False)))
    for name in ("s.prototxt", "s.yaml"):
        full_strategy.save(tmp_path / name)
        assert fleet.DistributedStrategy.load(tmp_path / name) == full_strategy


def test_yaml_to_prototxt_to_yaml_is_identical(full_strategy, tmp_path):
    full_strategy.save_to_yaml(tmp_path / "a.yaml")
    fleet.DistributedStrategy.load(tmp_path / "a.yaml").save_to_prototxt(tmp_path / "b.prototxt")
    fleet.DistributedStrategy.load(tmp_path / "b.prototxt").save_to_yaml(tmp_path / "c.yaml")
    assert (tmp_path / "a.yaml").read_text() == (tmp_path / "c.yaml").read_text()


def test_fleet_style_attribute_access():
    s = fleet.DistributedStrategy()
    s.amp = True
    s.amp_configs = {"init_loss_scaling": 1024, "custom_white_list": ["pool2d"]}
    s.amp_configs = {"decr_ratio": 0.5}  # a dict sets only its keys, as in Fleet
    assert s.amp_configs["init_loss_scaling"] == 1024.0
    assert s.amp_configs.decr_ratio == 0.5  # float32 storage reads back as written
    assert s.amp_configs["custom_white_list"] == ["pool2d"]
    s.build_strategy.fuse_bn_act_ops = True  # live view: Fleet silently changed a copy
    s.execution_strategy["num_threads"] = 3
    assert s.build_strategy.fuse_bn_act_ops is True
    assert s.non_default() == {"amp": True, "amp_configs.init_loss_scaling": 1024.0,
                               "amp_configs.decr_ratio": 0.5,
                               "amp_configs.custom_white_list": ["pool2d"],
                               "build_strategy.fuse_bn_act_ops": True,
                               "execution_strategy.num_threads": 3}
    assert "amp=True" in repr(s) and "execution_strategy.num_threads" in str(s)


def test_config_objects_replace_their_section():
    s = fleet.DistributedStrategy()
    s.build_strategy.fuse_bn_act_ops = True
    build = fleet.BuildStrategy()
    build.fuse_elewise_add_act_ops = True
    s.build_strategy = build
    assert s.build_strategy.fuse_elewise_add_act_ops is True
    assert s.build_strategy.fuse_bn_act_ops is False
    exe = fleet.ExecutionStrategy()
    exe.num_iteration_per_run = 4
    s.execution_strategy = exe
    assert s.execution_strategy.num_iteration_per_run == 4


def test_paddle_build_strategy_object_is_read_field_by_field():
    import paddle
    build = paddle.static.BuildStrategy()
    build.fuse_elewise_add_act_ops = True
    build.fuse_bn_act_ops = False
    s = fleet.DistributedStrategy()
    s.build_strategy = build
    assert s.build_strategy.fuse_elewise_add_act_ops is True
    assert s.build_strategy.fuse_bn_act_ops is False


@pytest.mark.parametrize("field, value, fix", [
    ("ampp", True, "did you mean 'amp'?"),
    ("nccl_comm_nums", 2, "did you mean 'nccl_comm_num'?"),
    ("fuse_grad_size_MB", 16, "did you mean 'fuse_grad_size_in_MB'?"),
])
def test_unknown_field_names_the_closest(field, value, fix):
    with pytest.raises(UnknownFieldError) as info:
        setattr(fleet.DistributedStrategy(), field, value)
    assert info.value.field == field and fix in str(info.value)


def test_unknown_field_is_a_type_error_as_in_paddle():
    """Paddle's strategy raises TypeError for an unknown attribute: `except TypeError` must catch ours."""
    with pytest.raises(TypeError) as info:
        fleet.DistributedStrategy().unknown_key = 1
    assert isinstance(info.value, (UnknownFieldError, AttributeError, ValueError))
    assert str(info.value).startswith("unknown strategy field 'unknown_key'")


def test_paddle_spelling_of_fuse_grad_size_in_tflops_is_the_same_field():
    s = fleet.DistributedStrategy()
    s._fuse_grad_size_in_TFLOPS = 3.5
    assert s.fuse_grad_size_in_TFLOPS == 3.5 and s._fuse_grad_size_in_TFLOPS == 3.5
    assert s.non_default() == {"fuse_grad_size_in_TFLOPS": 3.5}


def test_unknown_field_inside_a_config_dict():
    with pytest.raises(UnknownFieldError) as info:
        fleet.DistributedStrategy().amp_configs = {"init_loss_scalling": 8}
    assert info.value.field == "amp_configs.init_loss_scalling"
    assert "did you mean 'init_loss_scaling'?" in str(info.value)


@pytest.mark.parametrize("field, value, expected", [
    ("amp", 1, "a bool"),
    ("nccl_comm_num", "2", "an integer"),
    ("nccl_comm_num", 2.5, "an integer"),
    ("fuse_grad_size_in_TFLOPS", True, "a number"),
    ("amp_configs", 3, "a mapping"),
    ("mode", "SHARDED", "one of COLLECTIVE, PS, PIPELINE, HETER"),
])
def test_wrong_type_names_field_and_expected_type(field, value, expected):
    with pytest.raises(FieldTypeError) as info:
        setattr(fleet.DistributedStrategy(), field, value)
    assert info.value.field == field and expected in str(info.value)


def _field(path):
    descriptor = strategy_pb2.DistributedStrategy.DESCRIPTOR
    for name in path.split("."):
        field = descriptor.fields_by_name[name]
        descriptor = field.message_type
    return field


CHOICE_FIELDS = [(path, rule) for path, rule in RULES.items() if isinstance(rule, OneOf)]


@pytest.mark.parametrize("path, rule", CHOICE_FIELDS, ids=[path for path, _ in CHOICE_FIELDS])
@pytest.mark.parametrize("wrong", [3.5, True, None, {"a": 1}])
def test_wrong_type_for_a_field_of_choices_lists_the_choices(path, rule, wrong):
    """Every field whose rule is a set of choices, given a value of the wrong type (an int where a
    string goes, a string where an int goes, ...), names the choices, not just the type."""
    *sections, name = path.split(".")
    target = fleet.DistributedStrategy()
    for section in sections:
        target = getattr(target, section)
    wrong = "0" if wrong is None and isinstance(rule.choices[0], int) else wrong
    with pytest.raises(FieldTypeError) as info:
        target[name] = [wrong] if schema._is_repeated(_field(path)) else wrong
    assert info.value.field == path
    assert str(info.value).endswith(f"; set it to {schema._type_name(_field(path))}, {rule.describe()}"), str(info.value)


def test_wrong_type_inside_a_list():
    with pytest.raises(FieldTypeError) as info:
        fleet.DistributedStrategy().amp_configs = {"custom_white_list": "pool2d"}
    assert info.value.field == "amp_configs.custom_white_list" and "a list" in str(info.value)


@pytest.mark.parametrize("path, value, allowed", [
    ("nccl_comm_num", 0, ">= 1"),
    ("fuse_grad_size_in_MB", -1, ">= 0"),
    ("last_comm_group_size_MB", -0.5, ">= 0"),
    ("amp_configs.decr_ratio", 0.0, "(0, 1)"),
    ("amp_configs.decr_ratio", 1.0, "(0, 1)"),
    ("amp_configs.incr_ratio", 1.0, "> 1"),
    ("amp_configs.init_loss_scaling", 0, "> 0"),
    ("amp_configs.dtype", "float8", "'float16', 'bfloat16'"),
    ("topk_configs.density", 0.0, "(0, 1]"),
    ("topk_configs.density", 1.5, "(0, 1]"),
    ("gradient_merge_configs.k_steps", 0, ">= 1"),
    ("execution_strategy.num_threads", 0, ">= 1"),
    ("data_configs.cache_levels", ["disk", "ssd"], "'disk', 'memory'"),
])
def test_out_of_range_names_field_value_and_range(path, value, allowed):
    section, _, leaf = path.rpartition(".")
    s = fleet.DistributedStrategy()
    with pytest.raises(FieldRangeError) as info:
        if section:
            getattr(s, section)[leaf] = value
        else:
            setattr(s, leaf, value)
    assert info.value.field == path and allowed in str(info.value)


def test_load_replaces_instead_of_merging(tmp_path):
    path = tmp_path / "s.prototxt"
    path.write_text('amp_configs { custom_white_list: "b" }\n')
    s = fleet.DistributedStrategy()
    s.nccl_comm_num = 4
    s.amp_configs = {"custom_white_list": ["a"]}
    s.load_from_prototxt(path)
    s.load_from_prototxt(path)  # Fleet appended list entries on every load
    assert s.amp_configs.custom_white_list == ["b"]
    assert s.nccl_comm_num == 1


@pytest.mark.parametrize("name, text, line, words", [
    ("bad.prototxt", "amp: true\nampp: true\n", 2, "did you mean 'amp'?"),
    ("bad.prototxt", "amp: true\nnccl_comm_num: 0\n", 2, "nccl_comm_num"),
    ("bad.prototxt", "amp_configs {\n  init_loss_scaling: 8\n", None, "malformed prototxt"),
    ("bad.prototxt", "amp: 7\n", 1, "malformed prototxt"),
    ("bad.yaml", "amp: true\namp_configs:\n  decr_ratioo: 0.5\n", 3, "did you mean 'decr_ratio'?"),
    ("bad.yaml", "amp: true\nnccl_comm_num: zero\n", 2, "an integer"),
    ("bad.yaml", "amp: true\n  nccl_comm_num: [1\n", 2, "malformed YAML"),
    ("bad.yaml", "- amp\n", 1, "must be a mapping"),
])
def test_bad_files_name_file_line_and_cause(tmp_path, name, text, line, words):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(StrategyFileError) as info:
        fleet.DistributedStrategy.load(path)
    assert str(path) in str(info.value) and words in str(info.value)
    if line is not None:
        assert info.value.line == line and f"{path}:{line}:" in str(info.value)


def test_missing_and_unknown_kind_of_file(tmp_path):
    with pytest.raises(StrategyFileError, match="no such strategy file"):
        fleet.DistributedStrategy.load(tmp_path / "absent.yaml")
    (tmp_path / "s.json").write_text("{}")
    with pytest.raises(StrategyFileError, match="unknown strategy file type '.json'"):
        fleet.DistributedStrategy.load(tmp_path / "s.json")


def test_yaml_loader_is_safe(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("amp: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(StrategyFileError, match="malformed YAML"):
        fleet.DistributedStrategy.load(path)


def test_fleet_prototxt_with_its_own_save_format_loads(tmp_path):
    # What paddle.distributed.fleet's save_to_prototxt writes: str() of its proto.
    path = tmp_path / "fleet.prototxt"
    path.write_text('amp: true\nnccl_comm_num: 2\namp_configs {\n  init_loss_scaling: 1024.0\n'
                    '  custom_white_list: "pool2d"\n}\nbuild_strategy {\n  fuse_bn_act_ops: true\n}\n')
    s = fleet.DistributedStrategy()
    s.load_from_prototxt(path)
    assert (s.amp, s.nccl_comm_num, s.amp_configs.custom_white_list) == (True, 2, ["pool2d"])


def test_diff_lists_every_difference():
    a, b = fleet.DistributedStrategy(), fleet.DistributedStrategy()
    b.amp = True
    b.gradient_merge_configs = {"k_steps": 4}
    assert a.diff(b) == [("amp", False, True), ("gradient_merge_configs.k_steps", 1, 4)]


@pytest.mark.parametrize("field, words", [
    ("pipeline", "pipeline parallelism is not data parallel"),
    ("elastic", "fleetrun --max_restarts"),
])
def test_validate_rejects_knobs_outside_data_parallelism(field, words):
    s = fleet.DistributedStrategy()
    setattr(s, field, True)
    with pytest.raises(StrategyConflictError) as info:
        s.validate()
    assert info.value.field == field and words in str(info.value) and f"set {field}: false" in str(info.value)


@pytest.mark.parametrize("fields, named", [
    ({"sharding": True, "dgc": True}, ("dgc", "sharding")),
    ({"pto": True, "dgc": True}, ("dgc", "pto")),
    ({"pto": True, "sharding": True, "dgc": True}, ("dgc", "pto")),
    ({"amp": True, "dgc": True}, ("dgc", "amp")),
    ({"topk": True, "dgc": True}, ("dgc", "topk")),
    ({"dgc": True, "gradient_merge": True}, ("dgc", "gradient_merge")),
])
def test_a_pass_conflict_is_refused_at_validate_naming_the_fields_set(fields, named):
    """Refused by validate() (fleet.init, distributed_optimizer, `fleetlite strategy validate`), not
    first by minimize, and named by what the user set: `sharding`, not the pass that runs it (pto)."""
    s = fleet.DistributedStrategy()
    for field, value in fields.items():
        setattr(s, field, value)
    with pytest.raises(StrategyConflictError) as info:
        s.validate()
    first, second = named
    assert str(info.value).startswith(f"'{first}' and '{second}' cannot be used together: ")
    assert str(info.value).endswith(f"; turn '{first}' or '{second}' off") and info.value.field == first


@pytest.mark.parametrize("fields, world, words", [
    ({"pto": True}, 1, "strict: pto was requested but does nothing here: one rank: it updates every parameter itself"),
    ({"sharding": True, "sharding_configs": {"sharding_degree": 1}}, 1, "strict: sharding was requested"),
    ({"dgc": True}, 1, "strict: dgc was requested but does nothing here: needs data_parallel, which was skipped "
                       "(one rank: there is nothing to reduce)"),
    ({"use_hierarchical_allreduce": True}, 2, "the intra group is the whole world (2 ranks)"),
    ({"gradient_merge": True}, 2, "k_steps = 1: every step already communicates and updates"),
    ({"cudnn_exhaustive_search": True}, 2, "strict: cudnn_exhaustive_search was requested but does nothing here"),
    ({"sync_nccl_allreduce": False}, 2, "gloo collectives are synchronous"),
])
def test_strict_refuses_a_no_op_of_the_declared_world_at_validate(fields, world, words):
    """What strict refuses knowing only the strategy and the world (fleet.init's, or `fleetlite
    explain --world`) is refused by validate(topology), not first when minimize compiles."""
    s = fleet.DistributedStrategy()
    for field, value in fields.items():
        setattr(s, field, value)
    s.validate(Topology.grid(world))                 # without strict: a skip the report lists
    s.strict = True
    s.validate()                                     # no world declared yet: nothing to decide
    with pytest.raises(StrategyConflictError) as info:
        s.validate(Topology.grid(world))
    assert words in str(info.value) and str(info.value).endswith("; change the strategy or set strict: false")


def test_strict_refuses_a_knob_no_pass_reads_at_validate():
    s = fleet.DistributedStrategy()
    s.find_unused_parameters, s.strict = True, True
    with pytest.raises(CompileError, match="strict: find_unused_parameters was requested but not needed: .* "
                                           r"\(set: find_unused_parameters\); remove it or set strict: false"):
        s.validate()


@pytest.mark.parametrize("fields, fix", [
    ({"a_sync": False}, "parameter-server training is not supported"),
    ({"a_sync_configs": {"k_steps": 0}}, "parameter-server training is not supported"),
    ({"pipeline_configs": {"micro_batch_size": 2}}, "remove pipeline_configs"),
    ({"tensor_parallel_configs": {"tensor_parallel_degree": 2}}, "remove tensor_parallel_configs"),
    ({"qat_configs": {"weight_bits": 4}}, "remove qat_configs"),
])
def test_a_knob_no_pass_implements_is_an_error_at_validate_never_a_skip(fields, fix):
    s = fleet.DistributedStrategy()
    for field, value in fields.items():
        setattr(s, field, value)
    knob = next(iter(fields)).removesuffix("_configs")
    with pytest.raises(StrategyConflictError, match=f"^{knob}: fleetlite does not implement it .*; .*{fix}"):
        s.validate()


@pytest.mark.parametrize("field", ["pipeline", "tensor_parallel", "asp", "qat", "heter_ccl_mode"])
def test_the_unsupported_switches_are_refused_by_name(field):
    s = fleet.DistributedStrategy()
    setattr(s, field, True)
    with pytest.raises(StrategyConflictError, match=f"{field}"):
        s.validate()


def test_validate_rejects_parameter_server_mode():
    s = fleet.DistributedStrategy()
    s.mode = "PS"
    with pytest.raises(StrategyConflictError, match="use mode COLLECTIVE"):
        s.validate()
