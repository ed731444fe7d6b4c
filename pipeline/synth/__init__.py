"""Seeded synthetic request logs: sessions with growing prompts, bursty diurnal arrivals,
heavy-tailed lengths, provider-style reported cache hits, written in any ingest format."""

from pipeline.synth.generate import SynthConfig, check_memory, estimate_bytes, generate
from pipeline.synth.writers import SYNTH_FORMATS, name_warning, write_logs

__all__ = ["SYNTH_FORMATS", "SynthConfig", "check_memory", "estimate_bytes", "generate", "name_warning", "write_logs"]
