"""The worker settings of tests/test_otel.py: a global tracer provider writing spans to a file.

Each finished span is one JSON line in ``$ANARCHON_TEST_SPANS`` (name, ids, parent,
attributes), written as it ends (a simple processor), so the test reads them while the
worker runs.
"""

import json
import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from tests.worker_settings import *  # noqa: F403


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a") as out:
            for span in spans:
                assert span.context is not None
                out.write(json.dumps({
                    "name": span.name,
                    "span_id": span.context.span_id,
                    "parent": None if span.parent is None else span.parent.span_id,
                    "attributes": dict(span.attributes or {}),
                }) + "\n")
        return SpanExportResult.SUCCESS


_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["ANARCHON_TEST_SPANS"])))
trace.set_tracer_provider(_provider)
