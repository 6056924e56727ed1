"""Training capture routing: admit a call, let the worker stage it, commit its ledger row.

A request on
``/ng-rollout/<id>/training-token-capture/v1/{chat/completions | responses | messages}`` is
handled here (other paths are forwarded untouched):

1. A call id and admission time are minted. A retired rollout's call is served as plain traffic.
   Otherwise the parent is resolved by lineage fingerprint: no model-authored history (or an
   unresolvable one on a rollout with no ledger rows yet) is a ``text`` root, a resolved parent
   gives a ``token_in`` admission carrying the parent's chain, and anything else is served
   without admission after an ``unresolved_parent`` failure row.
2. The worker gets the body with ``ng_capture``, ``stream: false`` (no ``stream_options``) and,
   for Chat, the log-prob flags that make it return token ids.
3. From the worker's JSON the commit coordinates are popped and every token field stripped;
   the client's answer (JSON, or buffered SSE when it asked ``stream: true``) is serialized in
   full, and only then is the ledger row (or the failure row) appended. The first byte goes out
   after that, so a client that has seen an answer can rely on the ledger.

A serialization failure commits nothing: the ledger gets
``request_finished_without_staged_coordinates``; a Responses stream ends in
``response.created`` + ``response.failed``, any other answer is a 500 (an Anthropic ``error``
object for Messages).

With token-id capture on (:mod:`capture_core.server.token_capture`), the gate also records the
call's complete :class:`~capture_core.tokens.TokenEntry` through the token sink: the call is
announced before admission (a refusal, e.g. a retired rollout, fails the call with 409), the
entry is built from the worker's token fields before they are stripped, and it is committed
next to the ledger row, before the first byte. A call that yields no entry (no or bad token
ids, a refused entry, a call served without admission, a POST on another endpoint under the
training prefix answered 2xx) marks the rollout's token capture incomplete; none of this fails
the call. The call's id is the one its model-call capture line carries, when eval capture is
on (:data:`MODEL_CALL_ID_KEY`).
"""

from capture_core.server.token_fields import strip_token_fields
from capture_core.server.training.gate import TrainingGate
from capture_core.server.training.keys import (
    MODEL_CALL_ID_HEADER,
    MODEL_CALL_ID_KEY,
    TRAINING_ROUTE_KEY,
)

__all__ = [
    "MODEL_CALL_ID_HEADER",
    "MODEL_CALL_ID_KEY",
    "TRAINING_ROUTE_KEY",
    "TrainingGate",
    "strip_token_fields",
]
