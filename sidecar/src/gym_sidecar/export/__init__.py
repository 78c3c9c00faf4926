"""Export: the bounded queue, batching, retry and the OTLP exporters to the backend.

The exporter contract is :mod:`gym_sidecar.core.exporter`; the assembly
(:func:`gym_sidecar.assemble.build_export_stage`) builds the last stage from these parts.
"""
