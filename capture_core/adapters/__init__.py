"""Engine adapters for token capture: read an engine's token fields from its responses.

An adapter is what :meth:`~capture_core.staging.RolloutTokenCapture.complete_call_from_response`
uses to find the prompt ids, generated ids, log-probs and extras in a worker's response::

    from capture_core.adapters import VLLMCaptureAdapter
    from capture_core.staging import RolloutTokenCapture

    capture = RolloutTokenCapture(sink=sink, weight_version_fn=lambda: 3,
                                  adapter=VLLMCaptureAdapter())
"""

from capture_core.adapters.vllm import (
    PREFIX_REQUEST_KEY,
    ROUTED_EXPERTS_ENVELOPE_PREFIX,
    VLLMCaptureAdapter,
    VLLMPayloadError,
    routed_experts_shape,
)

__all__ = [
    "PREFIX_REQUEST_KEY",
    "ROUTED_EXPERTS_ENVELOPE_PREFIX",
    "VLLMCaptureAdapter",
    "VLLMPayloadError",
    "routed_experts_shape",
]
