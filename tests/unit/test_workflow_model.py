"""The pure parts of workflows: definitions (activity ids, versions), the state machine, JSON."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from kworkers.errors import ConfigError, DecodeError
from kworkers.message import Message
from kworkers.workflow import ResultError, StepContext, Workflow
from kworkers.workflow.codec import ActivityRecord, decode_json, encode_json
from kworkers.workflow.definition import Definition, Step
from kworkers.workflow.state import ACTIVE, RunState, initial, on_failure, on_success


def a(ctx: StepContext) -> None: ...
def b(ctx: StepContext) -> None: ...
def c(ctx: StepContext) -> None: ...
def undo_a(ctx: StepContext) -> None: ...
def undo_b(ctx: StepContext) -> None: ...


def test_activity_ids_index_repeated_steps() -> None:
    wf = Workflow("wf")
    wf.step(a)
    wf.step(b, compensate=undo_b)
    wf.add(a).add(a)
    d = wf.freeze()
    assert [d.activity_id(i) for i in range(4)] == ["a", "b", "a.2", "a.3"]
    assert d.compensation_id(1) == "compensate.b"
    act = d.activity("compensate.b")
    assert act is not None and act.kind == "compensation" and act.position == 1
    assert act.name == "undo_b"
    assert d.activity("compensate.a") is None
    assert d.activity("a.3") is not None and d.activity("a.4") is None


def test_version_is_a_fingerprint_of_the_step_list_unless_given() -> None:
    def make(*steps: Any, version: str | None = None) -> Definition:
        wf = Workflow("wf", version=version)
        for s in steps:
            wf.add(s)
        return wf.freeze()

    assert make(a, b).version == make(a, b).version
    assert make(a, b).version != make(b, a).version
    assert make(a, b).version != make(a, b, c).version
    with_undo = Workflow("wf").add(a, compensate=undo_a).add(b).freeze()
    assert with_undo.version != make(a, b).version
    assert make(a, version="2").version == "2"
    imported = make(a, b).version
    a.__module__ = b.__module__ = "__main__"  # the same file, run as a script
    try:
        assert make(a, b).version == imported
    finally:
        a.__module__ = b.__module__ = __name__


def test_bad_definitions_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="no steps"):
        Workflow("empty").freeze()
    with pytest.raises(ConfigError, match="identifier"):
        Workflow("has/slash")
    with pytest.raises(ConfigError, match="identifier"):
        Workflow("wf").add(a, name="2nd")
    with pytest.raises(ConfigError, match="version"):
        Workflow("wf", version="a/b").add(a).freeze()
    wf = Workflow("wf").add(a)
    wf.freeze()
    with pytest.raises(ConfigError, match="can no longer change"):
        wf.add(b)
    with pytest.raises(ConfigError, match="functions"):
        Workflow("wf").add("not a function")  # type: ignore[arg-type]


def _saga() -> Definition:
    return Definition("saga", "1", (Step("a", a, undo_a), Step("b", b), Step("c", c, undo_a),
                                    Step("d", c)))


def test_forward_path_runs_every_step_then_completes() -> None:
    d = _saga()
    s = initial(d)
    seen = []
    while s.status == "running":
        assert s.activity is not None
        seen.append(s.activity)
        t = on_success(d, s)
        assert t.dispatch == t.state.activity
        s = t.state
    assert seen == ["a", "b", "c", "d"]
    assert s == RunState("completed", None, "step", 3)


def test_a_saga_unwinds_completed_compensable_steps_in_reverse() -> None:
    d = _saga()
    s = RunState("running", "d", "step", 3)
    t = on_failure(d, s, "Boom: no")
    assert (t.state.status, t.dispatch, t.dead_letter) == ("compensating", "compensate.c", False)
    assert t.state.cause == "step 'd' failed: Boom: no"
    t2 = on_success(d, t.state)
    assert (t2.state.status, t2.dispatch) == ("compensating", "compensate.a")  # b has no undo
    t3 = on_success(d, t2.state)
    assert (t3.state.status, t3.dispatch) == ("compensated", None)
    assert t3.state.cause == "step 'd' failed: Boom: no"


def test_a_saga_whose_first_step_fails_has_nothing_to_undo() -> None:
    t = on_failure(_saga(), RunState("running", "a", "step", 0), "Declined: card")
    assert (t.state.status, t.dispatch, t.dead_letter) == ("compensated", None, False)


def test_a_pipeline_failure_stops_and_dead_letters_and_a_redrive_resumes() -> None:
    d = Definition("p", "1", (Step("a", a), Step("b", b)))
    t = on_failure(d, RunState("running", "b", "step", 1), "Down: x")
    assert (t.state.status, t.state.activity, t.dead_letter) == ("failed", "b", True)
    assert t.state.pending("b")
    assert on_success(d, t.state).state.status == "completed"


def test_a_failing_compensation_dead_letters_and_keeps_the_cause() -> None:
    d = _saga()
    s = RunState("compensating", "compensate.c", "compensation", 2, cause="step 'd' failed: X")
    t = on_failure(d, s, "RefundRejected: no")
    assert (t.state.status, t.state.activity, t.dead_letter) == ("failed", "compensate.c", True)
    assert t.state.error == "compensation 'compensate.c' failed: RefundRejected: no"
    after = on_success(d, t.state)  # the redrive succeeded: unwinding goes on
    assert (after.state.status, after.dispatch) == ("compensating", "compensate.a")
    assert after.state.cause == "step 'd' failed: X" and after.state.error is None


def test_every_path_ends_and_undoes_each_completed_step_at_most_once() -> None:
    """Exhaustive over which step fails and whether each compensation fails once (redriven)."""
    d = _saga()
    n = len(d.steps)
    for fail_at, comp_fails in itertools.product(range(n + 1), [False, True]):
        s = initial(d)
        undone: list[int] = []
        completed: list[int] = []
        for _ in range(50):
            if s.status not in ACTIVE:
                break
            if s.kind == "step" and s.position == fail_at:
                s = on_failure(d, s, "E: x").state
            elif s.kind == "compensation" and comp_fails and s.status != "failed":
                s = on_failure(d, s, "E: y").state  # then "redriven" on the next turn
            else:
                (undone if s.kind == "compensation" else completed).append(s.position)
                s = on_success(d, s).state
        assert s.status in ("completed", "compensated"), (fail_at, comp_fails, s)
        assert len(undone) == len(set(undone))
        want = [p for p in reversed(completed) if d.steps[p].compensate is not None]
        assert undone == (want if fail_at < n else [])


def test_transitions_refuse_a_run_without_a_pending_activity() -> None:
    with pytest.raises(ValueError):
        on_success(_saga(), RunState("completed", None, "step", 3))
    with pytest.raises(ValueError):
        on_failure(_saga(), RunState("compensated", None, "compensation", 0), "x")


def test_results_are_bounded_json() -> None:
    assert encode_json({"b": 1, "a": [1.5, None]}, "r", 100) == '{"a":[1.5,null],"b":1}'
    with pytest.raises(ResultError, match=r"ResultTooLarge: result of x is 1,002 bytes"):
        encode_json("é" * 500, "result of x", 1000)
    with pytest.raises(ResultError, match="ResultNotSerializable"):
        encode_json({1, 2}, "r", 100)
    with pytest.raises(ResultError, match="ResultNotSerializable"):
        encode_json(float("nan"), "r", 100)
    assert decode_json('{"a":1}', "r") == {"a": 1}
    with pytest.raises(DecodeError, match="CorruptResult"):
        decode_json("{nope", "result of step 'a'")
    with pytest.raises(DecodeError, match="CorruptResult"):
        decode_json("NaN", "r")


def _msg(key: bytes | None, value: bytes | None, headers: Any) -> Message:
    return Message("t", 0, 0, key, value, tuple(headers))


def test_activity_records_round_trip_and_bad_ones_say_why() -> None:
    rec = ActivityRecord("order-1", "charge", "saga", "v1")
    key, value, headers = rec.encode("00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    assert key == b"order-1/charge"
    assert ActivityRecord.decode(_msg(key, value, headers)) == rec
    ids = [h for h in headers if h[0].startswith("kw-")]
    with pytest.raises(DecodeError, match="NotAnActivity"):
        ActivityRecord.decode(_msg(key, value, []))
    with pytest.raises(DecodeError, match="not JSON"):
        ActivityRecord.decode(_msg(key, b"\xff", ids))
    with pytest.raises(DecodeError, match="'workflow'"):
        ActivityRecord.decode(_msg(key, json.dumps({"workflow": 1}).encode(), ids))
    with pytest.raises(DecodeError, match="is not its ids"):
        ActivityRecord.decode(_msg(b"order-2/charge", value, ids))
    with pytest.raises(DecodeError, match="kw-activity-id"):
        ActivityRecord.decode(_msg(key, value, ids[:1]))
