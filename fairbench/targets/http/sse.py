"""The SSE reader fairbench's client and profile probe read streams with: the project's one
parser, which lives in reference_scheduler.core.sse so that the reference gateway's relay (which
never imports fairbench) frames upstream streams with it too."""

from reference_scheduler.core.sse import MAX_EVENT_BYTES, SSEParser, parse_events

__all__ = ["MAX_EVENT_BYTES", "SSEParser", "parse_events"]
