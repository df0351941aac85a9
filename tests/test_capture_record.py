"""The compile record's format: values, round trips, merging, refusals (no compiles here)."""

from __future__ import annotations

import json

import pytest

from cachebake.capture.keys import ReplayProblem, decode_value
from cachebake.capture.record import (AutotuneSpec, CompileRecord, CompileSpec, KernelRef,
                                      TuneConfig, encode_value, launch_options, unsupported_values)
from cachebake.errors import InvalidDocument, Unsupported

REF = KernelRef("mod", "kern", "kern", "a" * 64)


def spec(hash_="h1", target="cuda:90", consts=None, seen="compile") -> CompileSpec:
    return CompileSpec(kernel=REF, signature=[["x", "*fp32"], ["B", "constexpr"]],
                       constexprs=consts if consts is not None else [[[1], 128]],
                       attrs=[[[0], [["tt.divisibility", 16]]]], options={"num_warps": 4},
                       env_vars={}, target=target, hash=hash_, verified=True, seen=seen)


def test_values_round_trip_through_json():
    import triton.language as tl

    for v in (1, -3, 2.5, True, False, None, "s", (1, (2, "x")), float("inf"), tl.float16,
              tl.constexpr(8)):
        back = decode_value(json.loads(json.dumps(encode_value(v))))
        assert str(back) == str(v) and type(back) is type(v)


def test_a_value_that_is_not_data_is_marked_and_refused_on_decode():
    enc = encode_value(object())
    assert "unsupported" in enc
    s = spec(consts=[[[1], enc]])
    assert unsupported_values(s) and unsupported_values(s)[0].startswith("B: builtins.object")
    with pytest.raises(ReplayProblem, match="not data"):
        decode_value(enc)


def test_launch_options_drop_what_the_target_derives():
    full = {"num_warps": 8, "arch": "sm90", "supported_fp8_dtypes": ("fp8e5",), "max_num_imprecise_acc_default": 1,
            "allowed_dot_input_precisions": ("tf32", "ieee"), "extern_libs": (("libdevice", "/x/libdevice.10.bc"),)}
    out = launch_options(full, default_extern_libs=(("libdevice", "/x/libdevice.10.bc"),))
    assert out == {"num_warps": 8, "allowed_dot_input_precisions": ["tf32", "ieee"]}
    custom = launch_options(full, default_extern_libs=(("libdevice", "/y/libdevice.10.bc"),))
    assert custom["extern_libs"] == [("libdevice", "/x/libdevice.10.bc")]


def test_record_json_round_trip_is_canonical():
    tune = AutotuneSpec(kernel=REF, tuning_key="(4096, 'torch.float32')",
                        configs=[TuneConfig(kwargs=[["B", 64]], num_warps=2, text="B: 64, ...")],
                        target="cuda:90", env_vars={}, result_hash="r1", timings=[[0.1, 0.09, 0.11]],
                        best=0, compiles=["h1"])
    rec = CompileRecord(compiles=[spec()], autotune=[tune], triton_version="3.6.0")
    back = CompileRecord.from_json(rec.to_json())
    assert back == rec and back.to_json() == rec.to_json()
    # signature order is kept: Triton hashes the arguments in order, a JSON object would not be
    assert back.compiles[0].signature[0][0] == "x"


def test_a_failed_candidate_timed_inf_round_trips_as_strict_json():
    """Triton times a candidate that could not run as inf: the blob stays strict JSON and the
    timing comes back a float, as the autotune result replay writes needs it."""
    from cachebake.jsonio import parse_json

    tune = AutotuneSpec(kernel=REF, tuning_key="(4096,)", configs=[TuneConfig(kwargs=[["B", 64]]),
                                                                   TuneConfig(kwargs=[["B", 128]])],
                        target="cuda:90", env_vars={}, result_hash="r1",
                        timings=[[float("inf")] * 3, [0.1, 0.09, 0.11]], best=1)
    rec = CompileRecord(compiles=[spec()], autotune=[tune])
    parse_json(rec.to_json(), "record")  # no Infinity in the blob
    back = CompileRecord.from_json(rec.to_json())
    assert back.autotune[0].timings == [[float("inf")] * 3, [0.1, 0.09, 0.11]]
    assert back.to_json() == rec.to_json()


def test_merge_keeps_one_entry_per_target_and_key_and_prefers_real_compiles():
    a = CompileRecord(compiles=[spec("h1", seen="cache_hit"), spec("h2")])
    b = CompileRecord(compiles=[spec("h1", seen="compile"), spec("h1", target="cuda:120")])
    a.add(b)
    assert sorted((c.target, c.hash, c.seen) for c in a.compiles) == [
        ("cuda:120", "h1", "compile"), ("cuda:90", "h1", "compile"), ("cuda:90", "h2", "compile")]
    # the same launch on two targets is one launch for replay
    assert len({c.spec_id() for c in a.compiles}) == 1
    assert a.summary()["targets"] == ["cuda:120", "cuda:90"]


@pytest.mark.parametrize("doc, err", [
    ("[]", InvalidDocument),
    ('{"format_version": 99, "compiles": []}', Unsupported),
    ('{"format_version": 1, "compiles": {}}', InvalidDocument),
    ('{"format_version": 1, "compiles": [{"kernel": {}}]}', InvalidDocument),
    ("not json", InvalidDocument),
])
def test_malformed_records_are_refused_with_a_named_document(doc, err):
    with pytest.raises(err):
        CompileRecord.from_json(doc)


@pytest.mark.parametrize("doc, message", [
    ({"format_version": "1", "compiles": []}, "compile record format '1' is not supported"),
    ({"format_version": 1, "compiles": [], "triton_key": "k" * 100_000}, "100000 characters, over 512"),
    ({"format_version": 1, "compiles": [], "triton_key": 5}, "an integer, not a string"),
])
def test_a_refusal_says_what_is_wrong(doc, message):
    """Not "format 1 is not supported (this cachebake reads 1)", not "a string, not a string"."""
    with pytest.raises((InvalidDocument, Unsupported)) as err:
        CompileRecord.from_json(json.dumps(doc))
    assert message in err.value.line()


def _doc(**entry_fields) -> dict:
    d = spec().to_dict()
    d.update(entry_fields)
    return {"format_version": 1, "compiles": [d], "autotune": []}


@pytest.mark.parametrize("fields, where", [
    ({"kernel": {"module": ["os"], "qualname": "k", "name": "k", "source_hash": "a" * 64}}, "kernel.module"),
    ({"kernel": "mod:kern"}, "kernel"),
    ({"signature": [["x"]]}, "signature[0]"),
    ({"signature": [["x", 5]]}, "signature[0]"),
    ({"constexprs": [[["0"], 1]]}, "constexprs[0]"),
    ({"attrs": [[[0], [["tt.divisibility", {"a": 1}]]]]}, "attrs[0][0]"),
    ({"options": ["num_warps", 4]}, "options"),
    ({"env_vars": {"LD_PRELOAD": ["/x.so"]}}, "env_vars.LD_PRELOAD"),
    ({"target": ["cuda:90"]}, "target"),
    ({"target": "cuda:90; rm -rf /"}, "target"),  # the independent attack corpus's (issue 20)
    ({"target": "sm_90"}, "target"),  # the command-line form, not the recorded key
    ({"target": "hip:../../x"}, "target"),
    ({"verified": "yes"}, "verified"),
])
def test_every_field_of_an_entry_is_type_checked(fields, where):
    with pytest.raises(InvalidDocument) as err:
        CompileRecord.from_json(json.dumps(_doc(**fields)))
    assert err.value.field == f"compiles[0].{where}" and "malformed compile entry" in err.value.reason


def test_autotune_entries_are_type_checked():
    tune = {"kernel": REF.__dict__, "tuning_key": "(1,)", "target": "cuda:90", "env_vars": {},
            "result_hash": "r", "configs": [{"kwargs": [["B", 64]], "num_warps": "4"}]}
    doc = {"format_version": 1, "compiles": [], "autotune": [tune]}
    with pytest.raises(InvalidDocument, match="num_warps"):
        CompileRecord.from_json(json.dumps(doc))
    doc["autotune"][0]["configs"][0]["num_warps"] = 4
    doc["autotune"][0]["best"] = 7
    with pytest.raises(InvalidDocument, match="not the index of a config"):
        CompileRecord.from_json(json.dumps(doc))


def test_a_record_nested_200000_deep_is_refused_without_recursion():
    deep = "[" * 200_000 + "]" * 200_000
    data = '{"format_version": 1, "compiles": [{"constexprs": [[[0], %s]]}]}' % deep
    with pytest.raises(InvalidDocument, match="nests deeper than"):
        CompileRecord.from_json(data)


def test_labels_and_messages_show_hostile_text_escaped():
    from cachebake.capture.record import shown

    hostile = KernelRef("\x1b]0;pwned\x07", "k\n[/x]", "\x1b[2J", "a" * 64)
    s = spec(consts=[[[1], "\x1b[31mred"]])
    s.kernel = hostile
    for text in (hostile.label, s.label()):
        assert "\x1b" not in text and "\n" not in text and "\x07" not in text
    assert shown("vllm.ops") == "vllm.ops" and shown("a\x1bb") == "'a\\x1bb'"
    assert len(shown("x" * 1000)) == 120


def test_the_record_log_is_written_strict_and_read_line_by_line(tmp_path):
    """A failed candidate's inf timing is written "inf" (the strict reader refuses Infinity);
    a torn line, a line 200,000 deep and a line with a wrong type are skipped, not fatal."""
    from cachebake.capture import recorder
    from cachebake.jsonio import parse_json

    tune = AutotuneSpec(kernel=REF, tuning_key="(1,)", configs=[TuneConfig(kwargs=[["B", 64]]),
                                                                TuneConfig(kwargs=[["B", 128]])],
                        target="cuda:90", env_vars={}, result_hash="r1",
                        timings=[[float("inf")] * 3, [0.1, 0.09, 0.11]], best=1)
    log = tmp_path / "events.record.jsonl"
    recorder._append(str(log), {"autotune": tune.to_dict()})
    recorder._append(str(log), {"compile": spec().to_dict()})
    parse_json(log.read_bytes().splitlines()[0], "line")  # strict JSON
    with open(log, "a") as f:
        f.write(json.dumps({"compile": {**spec("h2").to_dict(), "env_vars": []}}) + "\n")
        f.write('{"compile": ' + "[" * 200_000 + "]" * 200_000 + "}\n")
        f.write('{"compile": {"kernel": ')  # torn
    rec = recorder.load_record_log(log)
    assert [c.hash for c in rec.compiles] == ["h1"] and rec.autotune[0].timings[0] == [float("inf")] * 3
    assert rec.triton_version  # from the lines' build fields
