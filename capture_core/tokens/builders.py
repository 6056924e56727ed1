"""Builders: from a rollout's token entries to chains of calls that each extend the last.

A *chain* is a root call followed by calls whose prompt starts with everything before them
(the previous prompt and its generation); the tokens between (tool results, environment
turns) are the link's *interstitial*, trained with mask 0.

* :func:`prefix_merging` (the default) links each call to the earlier call whose prompt plus
  generation is the longest prefix of its prompt, resolves retries (two calls with the same
  parent and the same prompt) in favour of the one the rollout continued from, quarantines
  what stays ambiguous, and picks the *main* chain: the one whose root came first.
* :func:`per_request` makes one chain per call.

Both depend only on the entries, not on their order.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from capture_core.exceptions import TokenBuildError
from capture_core.tokens.entry import TokenEntry

__all__ = [
    "BUILDERS",
    "DEFAULT_BUILDER",
    "BuildNotes",
    "BuildOutput",
    "Chain",
    "ChainLink",
    "per_request",
    "prefix_merging",
    "run_builder",
]

DEFAULT_BUILDER: Final = "prefix_merging"


@dataclass(frozen=True, slots=True)
class ChainLink:
    """One call in a chain and the tokens between the previous link and its prompt's end."""

    entry: TokenEntry
    interstitial: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Chain:
    """A root-to-leaf run of calls: ``main``, ``branch-<n>`` or (per request) ``req-<n>``."""

    chain_id: str
    links: list[ChainLink]
    root_prompt: list[int]

    def validate(self) -> None:
        """Check every link has one log-prob per generated token.

        Raises:
            TokenBuildError: a link's counts differ (``.model_call_id`` names it).
        """
        for link in self.links:
            tokens, logprobs = (
                len(link.entry.generation_token_ids),
                len(link.entry.generation_log_probs),
            )
            if tokens != logprobs:
                raise TokenBuildError(
                    f"chain {self.chain_id}: {tokens} generated tokens but {logprobs} log-probs",
                    model_call_id=link.entry.model_call_id,
                )

    @property
    def generated_tokens(self) -> int:
        """Generated tokens over the chain's links."""
        return sum(len(link.entry.generation_token_ids) for link in self.links)


@dataclass(frozen=True, slots=True)
class BuildNotes:
    """What a build found.

    Attributes:
        builder: the builder's name.
        roots: calls with no parent, quarantined ones included.
        chains: chains built.
        generated_tokens_captured: generated tokens over all non-empty calls.
        generated_tokens_delivered: generated tokens on the main chain.
        delivered_fraction: delivered / captured, 4 decimals (0.0 when nothing was captured).
        unresolved_retries: calls of retry groups none of whose members was continued from.
        empty_generation_calls: calls that generated nothing (never a parent), input order.
    """

    builder: str
    roots: int = 0
    chains: int = 0
    generated_tokens_captured: int = 0
    generated_tokens_delivered: int = 0
    delivered_fraction: float = 0.0
    unresolved_retries: list[str] = field(default_factory=list)
    empty_generation_calls: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class BuildOutput:
    """Chains (the main one first), the quarantined calls, and notes."""

    chains: list[Chain]
    quarantined: list[str]
    notes: BuildNotes


@dataclass(eq=False, slots=True)
class _Node:
    entry: TokenEntry
    cumulative: list[int]
    parent: _Node | None = None
    children: list[_Node] = field(default_factory=list)
    quarantined: bool = False

    @property
    def prompt(self) -> list[int]:
        return self.entry.prompt_token_ids

    @property
    def call(self) -> str:
        return self.entry.model_call_id


def _order(entry: TokenEntry) -> tuple[int, str]:
    return len(entry.prompt_token_ids), entry.model_call_id


def per_request(entries: Sequence[TokenEntry]) -> BuildOutput:
    """One chain per call, ``req-0``, ``req-1``, ... by (prompt length, call id).

    Example:
        >>> per_request([]).notes.chains
        0
    """
    ordered = sorted(entries, key=_order)
    chains = [
        Chain(f"req-{i}", [ChainLink(entry)], list(entry.prompt_token_ids))
        for i, entry in enumerate(ordered)
    ]
    captured = sum(len(entry.generation_token_ids) for entry in ordered)
    notes = BuildNotes(
        builder="per_request",
        roots=len(chains),
        chains=len(chains),
        generated_tokens_captured=captured,
        generated_tokens_delivered=captured,
        delivered_fraction=1.0 if captured else 0.0,
    )
    return BuildOutput(chains, [], notes)


def prefix_merging(entries: Sequence[TokenEntry]) -> BuildOutput:
    """Link calls into chains by longest prompt prefix; pick the main chain.

    Example:
        >>> out = prefix_merging([
        ...     TokenEntry(rollout_id="r", model_call_id="a", prompt_token_ids=[1, 2],
        ...                generation_token_ids=[3], generation_log_probs=[-0.1]),
        ...     TokenEntry(rollout_id="r", model_call_id="b", prompt_token_ids=[1, 2, 3, 9],
        ...                generation_token_ids=[4], generation_log_probs=[-0.2])])
        >>> [(c.chain_id, [l.interstitial for l in c.links]) for c in out.chains]
        [('main', [[], [9]])]
    """
    empty = [e.model_call_id for e in entries if not e.generation_token_ids]
    nodes = [
        _Node(e, [*e.prompt_token_ids, *e.generation_token_ids])
        for e in sorted((e for e in entries if e.generation_token_ids), key=_order)
    ]
    _link_parents(nodes)
    unresolved = _resolve_retries(nodes)
    chains = _chains(nodes)
    captured = sum(len(node.entry.generation_token_ids) for node in nodes)
    delivered = chains[0].generated_tokens if chains else 0
    notes = BuildNotes(
        builder="prefix_merging",
        roots=sum(node.parent is None for node in nodes),
        chains=len(chains),
        generated_tokens_captured=captured,
        generated_tokens_delivered=delivered,
        delivered_fraction=round(delivered / captured, 4) if captured else 0.0,
        unresolved_retries=unresolved,
        empty_generation_calls=empty,
    )
    return BuildOutput(chains, [node.call for node in nodes if node.quarantined], notes)


def _link_parents(nodes: list[_Node]) -> None:
    """Give each node the earlier node whose cumulative sequence is the longest prefix of its
    prompt (quarantined when several share it); every node joins the trie.

    The trie is flat, ``(state, token) -> state``, so no structure nests as deep as a long
    rollout's token sequence.
    """
    edges: dict[tuple[int, int], int] = {}
    ends: dict[int, list[_Node]] = {}
    for node in nodes:
        state, best = 0, None
        for token in node.prompt:
            found = edges.get((state, token))
            if found is None:
                break
            state = found
            best = ends.get(state, best)
        if best:
            node.parent = best[0]
            best[0].children.append(node)
            node.quarantined = len(best) > 1
        state = 0
        for token in node.cumulative:
            state = edges.setdefault((state, token), len(edges) + 1)
        ends.setdefault(state, []).append(node)


def _resolve_retries(nodes: list[_Node]) -> list[str]:
    """Within each parent's children (the roots count as one group), calls with the same
    prompt are retries: keep those continued from (or the smallest id, reported unresolved)
    and quarantine the rest."""
    groups: dict[int | None, dict[tuple[int, ...], list[_Node]]] = {}
    for node in nodes:
        key = None if node.parent is None else id(node.parent)
        groups.setdefault(key, {}).setdefault(tuple(node.prompt), []).append(node)
    unresolved: list[str] = []
    for by_prompt in groups.values():
        for same in by_prompt.values():
            if len(same) < 2:
                continue
            kept = [m for m in same if any(not child.quarantined for child in m.children)]
            if not kept:
                kept = [min(same, key=lambda m: m.call)]
                unresolved.extend(m.call for m in same)
            for member in same:
                if member not in kept:
                    member.quarantined = True
    return unresolved


def _chains(nodes: list[_Node]) -> list[Chain]:
    """One chain per leaf whose path has no quarantined node; the main chain first."""
    found: list[tuple[_Node, Chain]] = []
    for leaf in (node for node in nodes if not node.children):
        path: list[_Node] = []
        node: _Node | None = leaf
        while node is not None:  # iterative: a rollout may have thousands of turns
            path.append(node)
            node = node.parent
        path.reverse()
        if any(n.quarantined for n in path):
            continue
        links = [ChainLink(path[0].entry)]
        links += [
            ChainLink(cur.entry, cur.prompt[len(prev.cumulative) :])
            for prev, cur in itertools.pairwise(path)
        ]
        found.append((path[0], Chain("", links, list(path[0].prompt))))
    if not found:
        return []
    main = min(range(len(found)), key=lambda i: (found[i][0].entry.created_at, found[i][0].call))
    chains = [Chain("main", found[main][1].links, found[main][1].root_prompt)]
    branches = [chain for i, (_, chain) in enumerate(found) if i != main]
    chains += [Chain(f"branch-{n}", c.links, c.root_prompt) for n, c in enumerate(branches)]
    return chains


BUILDERS: Final[dict[str, Callable[[Sequence[TokenEntry]], BuildOutput]]] = {
    "prefix_merging": prefix_merging,
    "per_request": per_request,
}


def run_builder(entries: Sequence[TokenEntry], name: str = DEFAULT_BUILDER) -> BuildOutput:
    """Run the builder called ``name``.

    Raises:
        TokenBuildError: no builder has that name.

    Example:
        >>> run_builder([], "per_request").chains
        []
    """
    builder = BUILDERS.get(name)
    if builder is None:
        raise TokenBuildError(f"unknown token builder {name!r}; known: {', '.join(BUILDERS)}")
    return builder(entries)
