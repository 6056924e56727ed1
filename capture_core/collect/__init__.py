"""Rollout collection: attach capture evidence to finished rollout records."""

from capture_core.collect.attachment import DEFAULT_DRAIN_TIMEOUT_S, capture_attachment

__all__ = ["DEFAULT_DRAIN_TIMEOUT_S", "capture_attachment"]
