"""``join_model_call_observations``: exact matches only, gaps for the rest, idempotent (§9.3)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from capture_core import ModelCallRecord, ModelRef
from capture_core.observations import AgentObservationBundle, join_model_call_observations

SERVER = {"type": "responses_api_models", "name": "policy_model"}


def call(index: int, call_id: str | None, response_id: str | None = None,
         server: str | None = "policy_model") -> ModelCallRecord:  # fmt: skip
    ref = ModelRef(name=server) if server is not None else None
    return ModelCallRecord(call_index=index, model_call_id=call_id, response_id=response_id,
                           model_ref=ref)  # fmt: skip


def by_response(response_id: str) -> dict[str, Any]:
    return {"model_ref": SERVER, "response_id": response_id}


def bundle(
    *records: dict[str, Any], gaps: list[dict[str, Any]] | None = None
) -> AgentObservationBundle:
    return AgentObservationBundle.model_validate(
        {"source": "test", "records": list(records), "gaps": gaps or []}
    )


def invocation(invocation_id: str, *refs: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "agent_invocation", "invocation_id": invocation_id, "model_calls": list(refs)}


def gaps(joined: AgentObservationBundle) -> list[tuple[str, str | None, str | None]]:
    return [(g.code, g.invocation_id, g.detail) for g in joined.gaps]


def refs(joined: AgentObservationBundle, invocation_id: str) -> list[dict[str, Any]]:
    (found,) = [i for i in joined.invocations() if i.invocation_id == invocation_id]
    return [ref.model_dump(mode="json") for ref in found.model_calls]


def test_an_exact_response_ref_resolves_to_the_canonical_ref() -> None:
    calls = [call(0, "call-1", "resp-1"), call(1, "call-2", "resp-2")]
    observed = bundle(invocation("main", by_response("resp-1")), gaps=[
        {"code": "direct_provider", "detail": "kept"},
        {"code": "model_call_ownership_unavailable", "detail": "capture:stale"},
    ])  # fmt: skip
    joined = join_model_call_observations(observed, calls)
    assert refs(joined, "main") == [{"model_call_id": "call-1", "model_ref": SERVER,
                                     "response_id": "resp-1"}]  # fmt: skip
    assert gaps(joined) == [
        ("direct_provider", None, "kept"),  # a producer's own gap stays, in its place
        ("model_call_ownership_unavailable", None, "capture:call-2:call_index=1"),
    ]
    assert observed.gaps[1].detail == "capture:stale"  # the bundle given is not modified
    assert join_model_call_observations(joined, calls) == joined  # idempotent


def test_an_ambiguous_response_id_is_not_guessed() -> None:
    calls = [call(0, "a", "resp-x"), call(1, "b", "resp-x")]
    joined = join_model_call_observations(bundle(invocation("main", by_response("resp-x"))), calls)
    assert refs(joined, "main") == [{"model_call_id": None, "model_ref": SERVER,
                                     "response_id": "resp-x"}]  # fmt: skip
    assert gaps(joined) == [
        ("model_call_reference_ambiguous", "main", "resp-x"),
        ("model_call_ownership_unavailable", None, "capture:a:call_index=0"),
        ("model_call_ownership_unavailable", None, "capture:b:call_index=1"),
    ]


def test_conflict_unmatched_and_narrowing_and_a_rejoin_changes_nothing() -> None:
    calls = [call(0, "a", "resp-a"), call(1, "b", "resp-b", server="judge"), call(2, None)]
    observed = bundle(
        invocation("main", {"model_call_id": "a"}, {"model_call_id": "zz"},
                   {"model_call_id": "b", "model_ref": SERVER}),  # b is the judge's: no match
        invocation("other", {"model_call_id": "a"}, {"model_call_id": "b",
                                                     "response_id": "resp-b"}),
        gaps=[{"code": "model_call_reference_unmatched", "invocation_id": "main",
               "detail": "from an earlier join"}, {"code": "tool_timing_unavailable"}],
    )  # fmt: skip
    joined = join_model_call_observations(observed, calls)
    assert gaps(joined) == [
        ("tool_timing_unavailable", None, None),
        ("model_call_reference_unmatched", "main", "zz"),
        ("model_call_reference_unmatched", "main", "b"),
        ("model_call_reference_conflict", "other", "a"),
        ("model_call_ownership_unavailable", None, "capture:unknown:call_index=2"),
    ]
    assert refs(joined, "other")[1]["model_ref"] == {"type": "responses_api_models",
                                                     "name": "judge"}  # fmt: skip
    assert refs(joined, "main")[1:] == [{"model_call_id": "zz", "model_ref": None,
                                         "response_id": None},
                                        {"model_call_id": "b", "model_ref": SERVER,
                                         "response_id": None}]  # fmt: skip
    again = join_model_call_observations(joined, calls)
    assert again == joined
    assert again.model_dump() == join_model_call_observations(again, calls).model_dump()


def compaction(owner: str, **refs: Any) -> dict[str, Any]:
    return {"kind": "context_compaction", "invocation_id": owner, **refs}


def test_a_compaction_of_the_owning_invocation_resolves() -> None:
    calls = [call(0, "c0", "r0"), call(1, "c1", "r1"), call(2, "c2", "r2")]
    observed = bundle(
        invocation("main", by_response("r0"), by_response("r1"), by_response("r2")),
        compaction("main", before_model_call=by_response("r0"), model_calls=[by_response("r1")],
                   after_model_call=by_response("r2")),
    )  # fmt: skip
    joined = join_model_call_observations(observed, calls)
    assert joined.gaps == []
    (resolved,) = joined.compactions()
    assert resolved.before_model_call is not None and resolved.after_model_call is not None
    assert [r.model_call_id for r in resolved.model_calls] == ["c1"]
    assert (resolved.before_model_call.model_call_id, resolved.after_model_call.model_call_id) == (
        "c0",
        "c2",
    )


def test_a_compaction_cannot_claim_another_invocations_calls() -> None:
    calls = [call(0, "c0", "r0"), call(1, "c1", "r1"), call(2, "c2", "r2"), call(3, "c3", "r3")]
    observed = bundle(
        invocation("main", by_response("r0")), invocation("sub", by_response("r1")),
        compaction("sub", before_model_call=by_response("r0"),
                   model_calls=[by_response("r0"), by_response("r2"), by_response("r9")],
                   after_model_call=by_response("r3")),
    )  # fmt: skip
    joined = join_model_call_observations(observed, calls)
    assert gaps(joined) == [
        ("model_call_reference_conflict", "sub", "model_calls:c0"),
        ("model_call_ownership_unavailable", "sub", "model_calls:c2"),
        ("model_call_reference_unmatched", "sub", "model_calls:r9"),
        ("model_call_reference_conflict", "sub", "before_model_call:c0"),
        ("model_call_ownership_unavailable", None, "capture:c2:call_index=2"),
        ("model_call_ownership_unavailable", None, "capture:c3:call_index=3"),
    ]
    (resolved,) = joined.compactions()
    assert resolved.before_model_call is not None and resolved.after_model_call is not None
    assert resolved.before_model_call.model_call_id is None  # a conflict leaves the ref as given
    assert resolved.after_model_call.model_call_id == "c3"  # unowned is fine before/after
    assert join_model_call_observations(joined, calls) == joined


def test_no_calls_at_all() -> None:
    joined = join_model_call_observations(bundle(invocation("main", by_response("r"))), [])
    assert gaps(joined) == [("model_call_reference_unmatched", "main", "r")]


def test_the_join_does_not_modify_the_bundle_it_is_given() -> None:
    observed = bundle(invocation("main", by_response("r0")))
    before = observed.model_dump()
    join_model_call_observations(observed, [call(0, "c0", "r0")])
    assert observed.model_dump() == before


# --------------------------------------------------------------------------------------------
# Property: for any valid bundle and call list, the join never raises, never gives one call
# to two invocations, and joining its result again changes nothing.

IDS = st.sampled_from(["c0", "c1", "c2", "c3", ""])
RESPONSES = st.sampled_from(["r0", "r1", "r2", "r3"])
SERVERS = st.sampled_from(["policy_model", "judge"])


@st.composite
def calls_strategy(draw: st.DrawFn) -> list[ModelCallRecord]:
    n = draw(st.integers(0, 6))
    return [
        ModelCallRecord(
            call_index=i,
            model_call_id=draw(st.none() | IDS),
            response_id=draw(st.none() | RESPONSES),
            model_ref=draw(st.none() | SERVERS.map(lambda name: ModelRef(name=name))),
        )
        for i in range(n)
    ]


@st.composite
def ref_strategy(draw: st.DrawFn) -> dict[str, Any]:
    server = draw(st.none() | SERVERS.map(lambda name: {"type": "responses_api_models",
                                                        "name": name}))  # fmt: skip
    response = draw(st.none() | RESPONSES)
    call_id = draw(st.none() | IDS.filter(bool))
    if not call_id and (server is None or response is None):
        call_id = "c0"
    return {"model_call_id": call_id, "model_ref": server, "response_id": response}


@st.composite
def bundle_strategy(draw: st.DrawFn) -> AgentObservationBundle:
    names = draw(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=0, max_size=4,
                          unique=True))  # fmt: skip
    records: list[dict[str, Any]] = []
    for position, name in enumerate(names):
        parent = draw(st.none() | st.sampled_from([*names[:position], "missing"]))
        refs = draw(st.lists(ref_strategy(), max_size=4))
        records.append({"kind": "agent_invocation", "invocation_id": name,
                        "parent_invocation_id": parent, "model_calls": refs})  # fmt: skip
    for _ in range(draw(st.integers(0, 2))):
        owner = draw(st.sampled_from([*names, "nobody"]))
        records.append({
            "kind": "context_compaction", "invocation_id": owner,
            "before_model_call": draw(st.none() | ref_strategy()),
            "model_calls": draw(st.lists(ref_strategy(), max_size=3)),
            "after_model_call": draw(st.none() | ref_strategy()),
        })  # fmt: skip
    order = draw(st.permutations(records))
    stale = draw(st.lists(st.sampled_from([
        {"code": "model_call_reference_conflict", "invocation_id": "a", "detail": "x"},
        {"code": "model_call_ownership_unavailable", "detail": "capture:old:call_index=9"},
        {"code": "producer_gap"},
    ]), max_size=3))  # fmt: skip
    return AgentObservationBundle.model_validate(
        {"source": "hypothesis", "records": order, "gaps": stale}
    )


@settings(max_examples=300, deadline=None)
@given(bundle_strategy(), calls_strategy())
def test_the_join_never_raises_nor_gives_a_call_to_two_invocations(
    observed: AgentObservationBundle, calls: list[ModelCallRecord]
) -> None:
    joined = join_model_call_observations(observed, calls)
    AgentObservationBundle.model_validate(joined.model_dump())  # still a valid bundle
    conflicts = {(g.invocation_id, g.detail) for g in joined.gaps
                 if g.code == "model_call_reference_conflict"}  # fmt: skip
    unowned = {g.detail for g in joined.gaps
               if g.code == "model_call_ownership_unavailable" and g.invocation_id is None}  # fmt: skip
    for position, captured in enumerate(calls):
        label = captured.model_call_id or captured.response_id or "unknown"
        # the invocations whose refs name this call and only this call, after the join
        naming = {i.invocation_id for i in joined.invocations() for ref in i.model_calls
                  if _matches(ref.model_dump(), calls) == [position]}  # fmt: skip
        owners = {name for name in naming if (name, label) not in conflicts}
        assert len(owners) <= 1, (position, owners)  # the others are reported in conflict
        reported_unowned = f"capture:{label}:call_index={captured.call_index}" in unowned
        assert reported_unowned == (not naming), (position, naming)
    assert join_model_call_observations(joined, calls) == joined  # idempotent


def _matches(ref: dict[str, Any], calls: list[ModelCallRecord]) -> list[int]:
    """Brute force, from the rules: which calls a reference names."""
    found = []
    for position, captured in enumerate(calls):
        server = captured.model_ref.model_dump() if captured.model_ref is not None else None
        if ref["model_call_id"]:
            ok = ref["model_call_id"] == captured.model_call_id
            ok = ok and ref["model_ref"] in (None, server)
            ok = ok and ref["response_id"] in (None, captured.response_id)
        else:
            ok = (ref["model_ref"], ref["response_id"]) == (server, captured.response_id)
        if ok:
            found.append(position)
    return found
